//go:build dm

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// shellRun runs a shell command line and returns its combined output and error.
func shellRun(t *testing.T, line string) (string, error) {
	t.Helper()
	out, err := exec.Command("sh", "-c", line).CombinedOutput()
	return string(out), err
}

// fillNoSpaceTimeout is the no-space timeout TestContainerFillingPool
// runs with: short, so its writer's wait is seconds, not the kernel's
// minute.
const fillNoSpaceTimeout = 5 * time.Second

// TestContainerFillingPool: a container writes until the pool is full,
// with nothing to collect and no growth allowed, in two phases.
//
// At the reserve (pool.min_free_space, 10% here): the pool is still rw,
// `pool status` and the metrics say new devices are refused, and they
// are: a container's Prepare through containerd's proxy client (the path
// of `ctr run`) is ResourceExhausted naming the free space, the reserve
// and the key, and a pull fails saying so; no device is left.
//
// Past it: the writer's writes wait (the status says they are queued) for
// the no-space timeout and then fail (ENOSPC, or EIO/EROFS through ext4);
// a Prepare on the full pool is refused too. Throughout both phases a
// second container on another image, one that has been running (it has
// written through its ext4 journal once), rewrites its own file in place
// and reads it back: no error, no read-only remount. Once the first
// container is removed the pool is rw again, the second container writes
// new files and a new container writes. Each phase's time is logged.
func TestContainerFillingPool(t *testing.T) {
	e := newPullEnvTB(t, func(c *plugin.Config) {
		c.Pool.DataSize = 256 << 20
		c.Pool.NoSpaceTimeout = plugin.D(fillNoSpaceTimeout)
		c.Daemon.MetricsAddress = stack.AnyLoopbackPort
	})
	ctx := context.Background()
	r := rand.New(rand.NewPCG(15, 17))
	body := make([]byte, 2<<20)
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	tops := map[string]string{}
	for _, name := range []string{"a", "b"} {
		e.srv.Put(t, name+".tar", bulkLayer(t, name, body, 4))
		res, err := e.pull(name+".tar", name)
		if err != nil {
			t.Fatalf("pull %s: %v", name, err)
		}
		tops[name] = res.TopChainID
	}
	sn := dmtest.DialProxy(t, e.cfg.Daemon.Socket)
	nctx := namespaces.WithNamespace(ctx, "default")
	dirs, devs := map[string]string{}, map[string]string{}
	for _, name := range []string{"a", "b"} {
		ms, err := sn.Prepare(nctx, "ctr-"+name, tops[name])
		if err != nil {
			t.Fatalf("prepare a container on %s: %v", name, err)
		}
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := mount.All(ms, dir); err != nil {
			t.Fatalf("mount the container on %s: %v", name, err)
		}
		t.Cleanup(func() { mount.UnmountAll(dir, 0) })
		dirs[name], devs[name] = dir, ms[0].Source
	}
	b := dirs["b"]
	if out, err := shellRun(t, "dd if=/dev/urandom of="+b+"/own bs=1M count=8 conv=fsync"); err != nil {
		t.Fatalf("container b writes its file: %v: %s", err, out)
	}
	runThroughJournal(t, e.pool, devs["b"], b)
	rw := startRewriter(t, b)

	// Phase 1: container a writes the pool down to half the reserve.
	st, err := e.pool.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	block := uint64(st.BlockSizeSectors) * 512
	reserve := thinpool.ReserveBlocks(st.TotalDataBlocks, e.cfg.Pool.MinFreeSpace.Value())
	fillMiB := ((st.TotalDataBlocks-st.UsedDataBlocks)-reserve/2)*block>>20 - 1
	start := time.Now()
	if out, err := shellRun(t, fmt.Sprintf("dd if=/dev/zero of=%s/fill bs=1M count=%d conv=fsync", dirs["a"], fillMiB)); err != nil {
		t.Fatalf("container a writing %d MiB, down to the reserve: %v: %s", fillMiB, err, out)
	}
	phase1 := time.Since(start)
	v := poolStatusJSON(t, e.cfgPath)
	t.Logf("phase 1: container a wrote %d MiB in %v; pool: mode %s, data %d/%d bytes, reserve %d bytes, under it %v",
		fillMiB, phase1.Round(time.Millisecond), v.Mode, v.DataUsedBytes, v.DataTotalBytes, v.ReserveDataBytes, v.UnderReserve)
	if free := v.DataTotalBytes - v.DataUsedBytes; v.Mode != "rw" || !v.UnderReserve || free >= v.ReserveDataBytes || free == 0 ||
		v.ReserveDataBytes != reserve*block || v.WritesQueued {
		t.Fatalf("pool status at the reserve: %+v; want rw, some free but under the %d-byte reserve, writes not queued", v, reserve*block)
	}
	if got := scrapeSum(t, e.d.metrics, "flyio_snapshotter_pool_under_reserve"); got != 1 {
		t.Fatalf("flyio_snapshotter_pool_under_reserve = %v at the reserve, want 1", got)
	}
	thinsBefore := thinCount(t, e.pool)
	start = time.Now()
	_, err = sn.Prepare(nctx, "ctr-refused", tops["b"])
	refusal := time.Since(start)
	t.Logf("phase 1: Prepare under the reserve answered in %v: %v", refusal.Round(time.Microsecond), err)
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Prepare under the reserve: %v; want ResourceExhausted", err)
	}
	for _, want := range []string{"% free (", "10% reserve", "pool.min_free_space"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	e.srv.Put(t, "c.tar", bulkLayer(t, "c", body[:64<<10], 1))
	if _, err := e.pull("c.tar", "c"); err == nil || !strings.Contains(err.Error(), "reserve") {
		t.Fatalf("pull under the reserve: %v; want it refused for the reserve", err)
	} else {
		t.Logf("phase 1: pull under the reserve: %v", err)
	}
	if n := thinCount(t, e.pool); n != thinsBefore {
		t.Fatalf("refused creates left devices: %d thin devices, %d before", n, thinsBefore)
	}

	// Phase 2: container a writes on; the pool fills, its writes wait for
	// the no-space timeout, then fail.
	// Watch the pool meanwhile: when its writes start to wait (queued),
	// and when the kernel's no-space timeout turns it to failing them.
	// Peek, not Status: a status that first commits the metadata waits on
	// the pool's own I/O, which on a full pool under emulation can take
	// long enough to see the queueing late and the wait short.
	var queuedAt, failingAt time.Time
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for wctx.Err() == nil && failingAt.IsZero() {
			if st, err := e.pool.Peek(wctx); err == nil {
				switch {
				case st.WritesQueued() && queuedAt.IsZero():
					queuedAt = time.Now()
				case st.WritesFailing() && !queuedAt.IsZero():
					failingAt = time.Now()
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	start = time.Now()
	// More than the pool's free space, less than the container's 1 GiB
	// file system: the pool runs out first.
	out, err := shellRun(t, "timeout 300 dd if=/dev/zero of="+dirs["a"]+"/fill2 bs=1M count=400 conv=fsync")
	failed := time.Now()
	stopWatch()
	<-watched
	t.Logf("container a filling the pool: %v: %s", err, strings.TrimSpace(out))
	// ext4 writes through the page cache: the pool's ENOSPC reaches it at
	// writeback, where ext4 turns it into EIO, or into EROFS once a failed
	// journal write has aborted it; the writer never sees a silent
	// success. (Direct writes to the device get ENOSPC itself: thinpool's
	// TestFullPoolSparesOtherDevices.)
	if err == nil || !(strings.Contains(out, "No space left on device") || strings.Contains(out, "Read-only file system") ||
		strings.Contains(out, "Input/output error")) {
		t.Fatalf("container a filling the pool: %v, %q; want ENOSPC, EIO or EROFS", err, out)
	}
	if queuedAt.IsZero() || failingAt.IsZero() {
		t.Fatalf("the pool said writes were queued at %v and failing at %v while container a filled it; want both", queuedAt, failingAt)
	}
	// The writer's own error comes at its fsync, once dd has copied the
	// rest of its 400 MiB into the page cache.
	t.Logf("phase 2: the pool was full %v after container a went on, queued its writes for %v (no-space timeout %v), then failed them; the writer's fsync failed %v after the pool was full",
		queuedAt.Sub(start).Round(time.Millisecond), failingAt.Sub(queuedAt).Round(time.Millisecond), fillNoSpaceTimeout, failed.Sub(queuedAt).Round(time.Millisecond))
	if waited := failingAt.Sub(queuedAt); waited < fillNoSpaceTimeout-500*time.Millisecond || waited > 3*fillNoSpaceTimeout {
		t.Fatalf("the pool queued writes for %v before failing them; want about the %v no-space timeout", waited, fillNoSpaceTimeout)
	}
	v = poolStatusJSON(t, e.cfgPath)
	t.Logf("pool: mode %s, data %d/%d, writes queued %v, failing %v", v.Mode, v.DataUsedBytes, v.DataTotalBytes, v.WritesQueued, v.WritesFailing)
	if v.Mode != "out_of_data_space" || !v.WritesFailing || v.NoSpaceTimeoutSeconds == nil || *v.NoSpaceTimeoutSeconds != int64(fillNoSpaceTimeout/time.Second) {
		t.Fatalf("pool status after the timeout: %+v; want out_of_data_space, writes failing, the no-space timeout %v", v, fillNoSpaceTimeout)
	}
	if _, err := sn.Prepare(nctx, "ctr-refused", tops["b"]); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Prepare on the full pool: %v; want ResourceExhausted", err)
	}
	// b read its image's files and its own throughout, and rewrote its own
	// in place (blocks it holds already); it reads them still.
	rounds := rw.stop()
	t.Logf("container b rewrote its file in place %d times through both phases", rounds)
	if out, err := shellRun(t, "cat "+b+"/b/marker "+b+"/b/f000 "+b+"/own | sha256sum"); err != nil {
		t.Fatalf("container b reading on the full pool: %v: %s", err, out)
	}
	if opts := mountOptions(t, b); !strings.HasPrefix(opts, "rw") {
		t.Fatalf("container b's file system is mounted %q after the fill, want rw", opts)
	}

	// Phase 3: removing container a frees the pool.
	start = time.Now()
	if err := mount.UnmountAll(dirs["a"], 0); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(nctx, "ctr-a"); err != nil {
		t.Fatalf("remove container a: %v", err)
	}
	if v = poolStatusJSON(t, e.cfgPath); v.Mode != "rw" || v.UnderReserve || v.WritesFailing {
		t.Fatalf("pool status after removing container a: %+v; want rw, above the reserve", v)
	}
	t.Logf("phase 3: container a removed in %v; pool: mode %s, data %d/%d", time.Since(start).Round(time.Millisecond), v.Mode, v.DataUsedBytes, v.DataTotalBytes)
	if out, err := shellRun(t, "dd if=/dev/urandom of="+b+"/new bs=1M count=16 conv=fsync"); err != nil {
		t.Fatalf("container b writing a new file once the pool has room: %v: %s", err, out)
	}
	// A new container on the same image works as on any rw pool.
	ms, err := sn.Prepare(nctx, "ctr-c", tops["b"])
	if err != nil {
		t.Fatalf("prepare a container once the pool has room: %v", err)
	}
	c := filepath.Join(t.TempDir(), "c")
	if err := os.MkdirAll(c, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mount.All(ms, c); err != nil {
		t.Fatalf("mount the new container: %v", err)
	}
	t.Cleanup(func() { mount.UnmountAll(c, 0) })
	if out, err := shellRun(t, "dd if=/dev/urandom of="+c+"/new bs=1M count=16 conv=fsync && cmp "+c+"/b/f000 "+b+"/b/f000"); err != nil {
		t.Fatalf("a new container writes once the pool has room: %v: %s", err, out)
	}
}

// rewriter rewrites 1 MiB of a container's file in place, with fsync, and
// reads it back from the device, in a loop until stopped; any failure
// fails the test.
type rewriter struct {
	done   chan struct{}
	once   sync.Once
	rounds int
	result chan int
}

// startRewriter starts rewriting dir/own (which must hold at least 1 MiB)
// in place.
func startRewriter(t *testing.T, dir string) *rewriter {
	src := filepath.Join(t.TempDir(), "rewrite")
	if out, err := shellRun(t, "dd if=/dev/urandom of="+src+" bs=1M count=1 2>&1"); err != nil {
		t.Fatalf("make the rewrite's source: %v: %s", err, out)
	}
	w := &rewriter{done: make(chan struct{}), result: make(chan int, 1)}
	t.Cleanup(func() { w.stop() })
	go func() {
		n := 0
		defer func() { w.result <- n }()
		for {
			select {
			case <-w.done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			// O_DIRECT reads bypass the page cache, so the block is read
			// back from the device, not from what was just written.
			line := "dd if=" + src + " of=" + dir + "/own bs=1M count=1 conv=notrunc,fsync 2>&1 && " +
				"dd if=" + dir + "/own of=" + src + ".back bs=1M count=1 iflag=direct 2>&1 && cmp " + src + " " + src + ".back"
			if out, err := exec.Command("sh", "-c", line).CombinedOutput(); err != nil {
				t.Errorf("container b rewriting its file in place (round %d): %v: %s", n+1, err, out)
				return
			}
			n++
		}
	}()
	return w
}

// stop ends the loop and returns how many rewrites it made.
func (w *rewriter) stop() int {
	w.once.Do(func() {
		close(w.done)
		w.rounds = <-w.result
	})
	return w.rounds
}

// mountOptions returns the options /proc/mounts lists for mount point dir.
func mountOptions(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == dir {
			return f[3]
		}
	}
	t.Fatalf("%s is not mounted", dir)
	return ""
}

// thinCount is the number of thin devices in the pool.
func thinCount(t *testing.T, p *thinpool.Pool) int {
	t.Helper()
	ids, err := p.ThinIDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(ids)
}

// runThroughJournal writes metadata in container dir (thin device dev)
// until its ext4 journal has wrapped, so that the container holds its own
// copy of every journal block, as a container that has been running for a
// while does. A snapshot shares its image's blocks: its first write to
// each journal block (mkfs wrote the journal on the image's base device)
// takes a new pool block, and one that comes while the pool is full fails
// and aborts the file system, however little the write itself needs.
// Each round changes the times of 4,096 inodes (256 inode table blocks)
// and syncs, which commits them through the journal; the journal has
// wrapped when two rounds running take no new pool block. (The pool's
// count, not the device's: a device's mapped blocks count the ones it
// shares, which a copy on write only replaces. Nothing else writes to the
// pool meanwhile.)
func runThroughJournal(t *testing.T, pool *thinpool.Pool, dev, dir string) {
	t.Helper()
	ctx := context.Background()
	used := func() uint64 {
		st, err := pool.Status(ctx)
		if err != nil {
			t.Fatalf("pool status: %v", err)
		}
		return st.UsedDataBlocks
	}
	if out, err := shellRun(t, "mkdir "+dir+"/journal && cd "+dir+"/journal && seq 4096 | xargs touch && sync"); err != nil {
		t.Fatalf("create the journal rounds' files in %s: %v: %s", dir, err, out)
	}
	start := used()
	prev, still, round := start, 0, 0
	for still < 2 {
		if round++; round > 200 {
			t.Fatalf("%s still takes new pool blocks after %d rounds of metadata writes (%d blocks more)", dev, round-1, prev-start)
		}
		if out, err := shellRun(t, "cd "+dir+"/journal && seq 4096 | xargs touch && sync"); err != nil {
			t.Fatalf("journal round %d in %s: %v: %s", round, dir, err, out)
		}
		now := used()
		if now == prev {
			still++
		} else {
			still = 0
		}
		prev = now
	}
	t.Logf("%s: its journal wrapped after %d rounds, taking %d more pool blocks", dev, round, prev-start)
}
