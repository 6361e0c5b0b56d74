//go:build dm

package main

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"

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

// TestContainerFillingPool: a container that writes until the pool is full
// gets an error (see below for which) and the pool reports
// out_of_data_space; a second container on another image, one that has
// been running (it has written through its ext4 journal once), keeps
// reading its files and rewriting its own, and once the first container is
// removed the pool is rw again, the second container writes new files and
// a new container writes.
func TestContainerFillingPool(t *testing.T) {
	e := newPullEnvTB(t, func(c *plugin.Config) { c.Pool.DataSize = 256 << 20 })
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
	// More than the pool's free space, less than the container's 1 GiB
	// file system: the pool runs out first.
	out, err := shellRun(t, "timeout 300 dd if=/dev/zero of="+dirs["a"]+"/fill bs=1M count=400 conv=fsync")
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
	st := poolStatusJSON(t, e.cfgPath)
	t.Logf("pool: mode %s, data %d/%d", st.Mode, st.DataUsedBytes, st.DataTotalBytes)
	if st.Mode != "out_of_data_space" {
		t.Fatalf("pool mode after the fill = %s, want out_of_data_space", st.Mode)
	}
	// b reads its image's files and its own, and rewrites its own in place
	// (blocks it holds already), read back from the device.
	if out, err := shellRun(t, "cat "+b+"/b/marker "+b+"/b/f000 "+b+"/own | sha256sum"); err != nil {
		t.Fatalf("container b reading on the full pool: %v: %s", err, out)
	}
	src := filepath.Join(t.TempDir(), "rewrite")
	if out, err := shellRun(t, "dd if=/dev/urandom of="+src+" bs=1M count=8 2>&1 && dd if="+src+" of="+b+"/own bs=1M conv=notrunc,fsync 2>&1 && "+
		"echo 3 > /proc/sys/vm/drop_caches && cmp "+src+" "+b+"/own"); err != nil {
		t.Fatalf("container b rewriting its file on the full pool: %v: %s", err, out)
	}
	if err := mount.UnmountAll(dirs["a"], 0); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(nctx, "ctr-a"); err != nil {
		t.Fatalf("remove container a: %v", err)
	}
	if st = poolStatusJSON(t, e.cfgPath); st.Mode != "rw" {
		t.Fatalf("pool mode after removing container a = %s, want rw", st.Mode)
	}
	t.Logf("pool after the removal: mode %s, data %d/%d", st.Mode, st.DataUsedBytes, st.DataTotalBytes)
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
