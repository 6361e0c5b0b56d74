//go:build dm

package soak

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

var (
	// The defaults are the shortened soak make vmtest runs. A daemon just
	// started grows its resident memory over its first ~75 cycles (Go's
	// heap reaching its collection target, each pooled SQLite connection
	// filling its caches): the warm-up cycles run before the measured ones
	// so that the first tenth measures a steady daemon, not a starting one.
	cycles = flag.Int("flyio.soak-cycles", 1000, "measured Prepare/Commit/Remove cycles through containerd (the full soak: 10000)")
	warmup = flag.Int("flyio.soak-warmup", 150, "cycles run before the measured ones, not sampled")
	pulls  = flag.Int("flyio.soak-pulls", 20, "S3 pull and remove cycles, spread over all the snapshot cycles (full soak: 200)")
	// The daemon's resident memory settles over its first few thousand
	// cycles (SQLite's page caches fill to the database's working set, the
	// C and Go heaps to their levels): the full soak's tenths of 1,000
	// cycles see the level, the shortened soak's tenths of 100 see part of
	// the settling, so make test's run (testdata/vm-test-args) checks
	// memory against a wider limit.
	rssLimit = flag.Float64("flyio.soak-rss-limit", growthLimit, "most the last tenth's median resident memory may be, as a multiple of the first tenth's")
)

// growthLimit is how much the last tenth's goroutine floor (see steady)
// may exceed the first tenth's, and the database's end size its size
// after the first tenth; by default (-flyio.soak-rss-limit) the same for
// the resident memory's median.
const growthLimit = 1.10

// soakRetention compresses retention to the soak's time scale. Each pull
// leaves five finished state-machine runs, and the defaults (kept 7 days,
// up to 10,000) are never reached in a soak, so with them the database
// grows by every pull's runs. Kept to 10, the cap is reached within the
// warm-up's pulls, and retention deletes as many runs as each pull adds
// from then on: the measured cycles see the steady state a host reaches
// after a week.
const soakRetention = `[retention]
interval = "2s"
runs_max_count = 10
`

// sample is one reading of the daemon's metrics endpoint.
type sample struct {
	rss, goroutines float64
	// goHeap is the part of rss that is Go's heap (in use, or free and not
	// yet returned to the system); heapGoal is the heap size at which the
	// next collection starts. Logged, to tell Go's heap from SQLite's and
	// the rest when resident memory moves.
	goHeap, heapGoal float64
	// goMapped is all the memory Go's runtime holds from the system, its
	// heap, goroutine stacks and own structures (mapped and not returned):
	// what of the anonymous resident memory is not the C heap. sqlite is
	// what SQLite's allocator holds in the C heap (page caches,
	// statements). Both logged with goHeap.
	goMapped, sqlite float64
}

// TestSoak drives the daemon (the `serve` binary) through a real containerd
// (our daemon as its [proxy_plugins] snapshotter) for -flyio.soak-cycles
// Prepare/Commit/Remove cycles (containerd's garbage collector passes the
// removals on to the daemon and calls its Cleanup), and -flyio.soak-pulls
// S3 pull and remove
// cycles of a two-layer image from an in-process S3 server through the
// control socket, spread among them. It then checks that nothing is left
// (no snapshot, device, image, chain or layer record, no layer file, only
// the base device in the pool), that the daemon's resident memory and
// goroutines (its metrics endpoint: process_resident_memory_bytes,
// go_goroutines) over the last tenth of the cycles are within 10% of the
// first tenth, and that the database file with its write-ahead log did not
// grow past their size after the first tenth by more than 10%.
func TestSoak(t *testing.T) {
	if *cycles < 10 || *pulls < 1 || *warmup < 0 {
		t.Fatalf("-flyio.soak-cycles must be >= 10, -flyio.soak-pulls >= 1 and -flyio.soak-warmup >= 0; got %d, %d and %d", *cycles, *pulls, *warmup)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Hour)
	defer cancel()
	repo, scratch, tools, err := stack.VMEnv()
	if err != nil {
		t.Fatal(err)
	}
	// Exec a private copy: `make build` on the host may replace bin/ while
	// the soak runs.
	bin, err := stack.PrivateBinary(repo, scratch)
	if err != nil {
		t.Fatal(err)
	}

	if err := stack.LoopbackUp(ctx); err != nil {
		t.Fatal(err)
	}
	srv := s3test.NewServer(t)
	const imageKey = "soak/app/"
	srv.Put(t, imageKey+"1.tar", layer(t, 1, []string{"etc", "usr", "var"}))
	srv.Put(t, imageKey+"2.tar", layer(t, 2, []string{"usr"}))

	ctrdDir := filepath.Join(scratch, "containerd")
	d, err := stack.WriteDaemonConfig(bin, stack.DaemonOptions{
		Dir: filepath.Join(scratch, "daemon"), PoolName: fmt.Sprintf("soak%d", os.Getpid()), DataSize: "2GiB",
		S3:         &stack.S3{Endpoint: srv.URL, Bucket: srv.Bucket},
		Containerd: filepath.Join(ctrdDir, "containerd.sock"),
		Metrics:    stack.AnyLoopbackPort,
		ExtraTOML:  soakRetention,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := plugin.LoadConfig(d.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dmtest.Teardown(t, cfg) })
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	daemonUp := true
	stopDaemon := func() {
		if daemonUp {
			daemonUp = false
			if err := d.Stop(); err != nil {
				t.Errorf("daemon stop: %v\n%s", err, d.Proc.LogTail(30))
			}
		}
	}
	t.Cleanup(stopDaemon)
	ctrd, err := stack.StartContainerd(ctx, tools, ctrdDir, d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctrd.Stop() })
	// Snapshots need a lease, or containerd's garbage collector takes a
	// committed one before the cycle removes it.
	lease, err := ctrd.Leased(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End(ctx)
	nctx := lease.Ctx
	sn := lease.Client.SnapshotService("flyio")
	ctl := control.NewClient(d.Control)

	if thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil {
		t.Logf("transparent huge pages: %s", strings.TrimSpace(string(thp)))
	}
	// serve turns transparent huge pages off for the daemon from its first
	// page fault: under the kernel's "always" mode (this guest's, Debian's
	// default) its resident memory otherwise climbs as huge pages fill its
	// sparse heaps.
	if v := procFields(d.Proc.Pid(), "status", "THP_enabled")[0]; v != "THP_enabled 0" {
		t.Errorf("the daemon's /proc/PID/status has %q, want THP_enabled 0: serve did not turn transparent huge pages off", v)
	}
	n, warm := *cycles, *warmup
	tenth := n / 10
	sampleEvery := max(1, tenth/20)
	pullEvery := max(1, (warm+n) / *pulls)
	var first, last []sample
	var dbAfterFirst int64
	pulled := 0
	var pullTime time.Duration
	t0 := time.Now()
	for c := range warm + n {
		// i counts the measured cycles (negative during the warm-up).
		i := c - warm
		key, name := fmt.Sprintf("soak-%d", c), fmt.Sprintf("soak-%d-c", c)
		if _, err := sn.Prepare(nctx, key, ""); err != nil {
			t.Fatalf("cycle %d: Prepare: %v", c, err)
		}
		if err := sn.Commit(nctx, name, key); err != nil {
			t.Fatalf("cycle %d: Commit: %v", c, err)
		}
		if err := sn.Remove(nctx, name); err != nil {
			t.Fatalf("cycle %d: Remove: %v", c, err)
		}
		if c%pullEvery == 0 && pulled < *pulls {
			pulled++
			tp := time.Now()
			res, err := ctl.Pull(ctx, api.PullRequest{Bucket: srv.Bucket, Key: imageKey}, nil)
			if err != nil {
				t.Fatalf("pull %d (cycle %d): %v\ndaemon log tail:\n%s", pulled, c, err, d.Proc.LogTail(40))
			}
			if _, err := ctl.Remove(ctx, []string{res.Source}); err != nil {
				t.Fatalf("remove of pull %d (cycle %d): %v\ndaemon log tail:\n%s", pulled, c, err, d.Proc.LogTail(40))
			}
			pullTime += time.Since(tp)
		}
		switch {
		case i >= 0 && i < tenth && i%sampleEvery == 0:
			first = append(first, scrape(t, d.Metrics))
		case i >= n-tenth && i%sampleEvery == 0:
			last = append(last, scrape(t, d.Metrics))
		}
		if i == tenth-1 {
			dbAfterFirst = dbSize(t, cfg.Metadata.Path)
		}
		if i >= 0 && (i+1)%max(1, n/20) == 0 {
			s := scrape(t, d.Metrics)
			t.Logf("%d/%d cycles, %d pulls, %.1f s: RSS %.1f MiB (Go heap %.1f MiB, next collection at %.1f MiB, all of Go %.1f MiB; SQLite %.1f MiB; %s), %.0f goroutines, database and WAL %d bytes",
				i+1, n, pulled, time.Since(t0).Seconds(), s.rss/(1<<20), s.goHeap/(1<<20), s.heapGoal/(1<<20), s.goMapped/(1<<20), s.sqlite/(1<<20), procStatus(d.Proc.Pid()), s.goroutines, dbSize(t, cfg.Metadata.Path))
		}
	}
	elapsed := time.Since(t0)
	if v := procFields(d.Proc.Pid(), "smaps_rollup", "AnonHugePages")[0]; v != "AnonHugePages 0 kB" {
		t.Errorf("the daemon's /proc/PID/smaps_rollup has %q after the cycles, want AnonHugePages 0 kB: it holds transparent huge pages", v)
	}
	// containerd's collector runs after a number of changes, so the last
	// cycles' removals may wait for one: ending the lease with a
	// synchronous delete runs it now.
	if err := lease.End(ctx); err != nil {
		t.Errorf("end the soak's lease (containerd's collection): %v", err)
	}

	f, l := steady(first), steady(last)
	dbEnd := dbSize(t, cfg.Metadata.Path)
	t.Logf("soak: %d cycles (%d of them warm-up) and %d pulls in %.1f s: %.1f ms a snapshot cycle, %.1f s a pull and remove",
		warm+n, warm, pulled, elapsed.Seconds(), float64((elapsed-pullTime).Milliseconds())/float64(warm+n), pullTime.Seconds()/float64(pulled))
	t.Logf("soak: RSS median %.1f MiB in the first tenth, %.1f MiB in the last (ratio %.3f); goroutines at least %.0f and %.0f (ratio %.3f); %d+%d samples",
		f.rss/(1<<20), l.rss/(1<<20), l.rss/f.rss, f.goroutines, l.goroutines, l.goroutines/f.goroutines, len(first), len(last))
	t.Logf("soak: database and WAL files %d bytes after the first tenth, %d at the end (ratio %.3f)",
		dbAfterFirst, dbEnd, float64(dbEnd)/float64(dbAfterFirst))
	if l.rss > f.rss**rssLimit {
		t.Errorf("daemon RSS (median) grew from %.1f MiB (first tenth) to %.1f MiB (last tenth): more than %.0f%%", f.rss/(1<<20), l.rss/(1<<20), (*rssLimit-1)*100)
	}
	if l.goroutines > f.goroutines*growthLimit {
		t.Errorf("daemon goroutine floor grew from %.0f (first tenth) to %.0f (last tenth): more than %.0f%%", f.goroutines, l.goroutines, (growthLimit-1)*100)
	}
	if float64(dbEnd) > float64(dbAfterFirst)*growthLimit {
		t.Errorf("database and WAL files grew from %d bytes (after the first tenth) to %d: not bounded", dbAfterFirst, dbEnd)
	}

	// Nothing left: records (read-only, beside the running daemon) ...
	db, err := metadata.Open(ctx, metadata.Options{Path: cfg.Metadata.Path, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	reads := snapshotter.ReadRecords(db)
	// A Remove through containerd only marks the snapshot in containerd's
	// own records; its garbage collector removes it from ours and calls
	// Cleanup, asynchronously: wait for it to settle.
	var (
		snaps []snapshotter.CDSnapshot
		devs  []snapshotter.ThinDevice
	)
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(time.Second) {
		if snaps, err = reads.Snapshots(ctx); err != nil {
			t.Fatal(err)
		}
		if devs, err = reads.ThinDevices(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if (len(snaps) == 0 && len(devs) <= 1) || time.Now().After(deadline) {
			break
		}
	}
	for _, s := range snaps {
		t.Errorf("snapshot left: %s (%s)", s.Key, s.Kind)
	}
	var baseID uint32
	for _, dv := range devs {
		if dv.Role == snapshotter.ThinRoleBase {
			baseID = dv.ID
			continue
		}
		t.Errorf("device record left: %+v", dv)
	}
	images, err := gc.Images(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range images {
		t.Errorf("image record left: %+v", im)
	}
	files, err := pipeline.RecordsOf(db).ListLayerFiles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, lf := range files {
		t.Errorf("layer file record left: %+v", lf)
	}
	db.Close()
	// ... files in the download folder ...
	filepath.WalkDir(cfg.Pipeline.DownloadDir, func(p string, de os.DirEntry, err error) error {
		if err == nil && !de.IsDir() {
			t.Errorf("file left in the download folder: %s", p)
		}
		return nil
	})
	// ... and devices in the pool, read once the daemon has stopped.
	ctrd.Stop()
	stopDaemon()
	p, err := thinpool.Open(ctx, cfg.ThinpoolConfig())
	if err != nil {
		t.Fatal(err)
	}
	ids, err := p.ThinIDs(ctx)
	p.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != baseID {
		t.Errorf("pool thin ids %v, want only the base device %d", ids, baseID)
	}
}

// layer is a layer tarball with the given directories, each holding 20
// files of 4 KiB of random bytes (seeded by n).
func layer(t *testing.T, n int, dirs []string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	mtime := time.Unix(1700000000, 0)
	body := make([]byte, 4<<10)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
			t.Fatal(err)
		}
		for f := range 20 {
			for i := range body {
				body[i] = byte(rng.UintN(256))
			}
			h := &tar.Header{Name: fmt.Sprintf("%s/f%d-%02d", d, n, f), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), ModTime: mtime}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// scrape reads the daemon's resident memory and goroutine count from its
// metrics endpoint.
func scrape(t *testing.T, addr string) sample {
	t.Helper()
	samples, err := stack.Samples(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	var s sample
	var idle, released float64
	fields := map[string]*float64{
		"process_resident_memory_bytes":         &s.rss,
		"go_goroutines":                         &s.goroutines,
		"go_memstats_heap_inuse_bytes":          &s.goHeap,
		"go_memstats_heap_idle_bytes":           &idle,
		"go_memstats_heap_released_bytes":       &released,
		"go_memstats_next_gc_bytes":             &s.heapGoal,
		"go_memstats_sys_bytes":                 &s.goMapped,
		"flyio_snapshotter_sqlite_memory_bytes": &s.sqlite,
	}
	for _, m := range samples {
		if f := fields[m.Series]; f != nil {
			*f = m.Value
		}
	}
	s.goHeap += idle - released
	s.goMapped -= released
	if s.rss == 0 || s.goroutines == 0 {
		t.Fatalf("metrics page of %s lacks process_resident_memory_bytes or go_goroutines", addr)
	}
	return s
}

// steady is what a tenth's samples say of the daemon's standing state:
// the median of its resident memory and the least of its goroutines. A
// sample just after a pull catches the pull's buffers before Go's
// scavenger returns them to the system (and a few more SQLite connections
// at work), and the median ignores those few where a mean moves with
// however many a tenth happens to hold. The goroutine count at a sample is
// the daemon's standing goroutines plus the calls in flight (containerd's
// collector calls the daemon asynchronously after each Remove, so a
// sample lands among a varying few of them); a leaked goroutine never
// ends and raises the floor, which the least count is.
func steady(ss []sample) sample {
	rss := make([]float64, len(ss))
	g := ss[0].goroutines
	for i, s := range ss {
		rss[i] = s.rss
		g = min(g, s.goroutines)
	}
	slices.Sort(rss)
	m := rss[len(rss)/2]
	if len(rss)%2 == 0 {
		m = (rss[len(rss)/2-1] + m) / 2
	}
	return sample{rss: m, goroutines: g}
}

// procStatus is the kernel's split of process pid's resident memory
// (anonymous: heaps and stacks; file and shmem: the pages of files it
// maps, its binary and the database, shmem when they are on a tmpfs, as
// in the VM), its thread count, from /proc/PID/status, and how much of its
// anonymous memory is in transparent huge pages, from
// /proc/PID/smaps_rollup.
func procStatus(pid int) string {
	return strings.Join(append(procFields(pid, "status", "RssAnon", "RssFile", "RssShmem", "Threads"),
		procFields(pid, "smaps_rollup", "AnonHugePages")...), ", ")
}

// procFields reads /proc/PID/FILE ("key: value" lines) once and gives
// "key value" for each of keys, in their order, the value's blanks folded
// (or what went wrong reading it).
func procFields(pid int, file string, keys ...string) []string {
	values := make(map[string]string)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			values[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		v, ok := values[k]
		switch {
		case err != nil:
			v = err.Error()
		case !ok:
			v = "missing from /proc/PID/" + file
		}
		out[i] = k + " " + v
	}
	return out
}

// dbSize is the size of the database file and its write-ahead log: until
// a checkpoint, the rows live in the log.
func dbSize(t *testing.T, path string) int64 {
	t.Helper()
	return fileSize(t, path) + fileSize(t, path+"-wal")
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
