//go:build dm

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// genLayer builds a layer tarball of files random files of size bytes each
// (random content: nothing sparse or compressible), under dir/, with the
// canonical etc/ usr/ var/ folders when base is set.
func genLayer(t testing.TB, seed uint64, dir string, files, size int, base bool) []byte {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed*31+7))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) {
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if base {
		for _, d := range []string{"etc/", "usr/", "var/"} {
			hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755})
		}
		hdr(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/os-release", Mode: 0o644, Size: 13})
		tw.Write([]byte("ID=flyiotest\n"))
	}
	hdr(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755})
	body := make([]byte, size)
	for i := 0; i < files; i++ {
		for j := 0; j < len(body); j += 8 {
			v := r.Uint64()
			for k := 0; k < 8 && j+k < len(body); k++ {
				body[j+k] = byte(v >> (8 * k))
			}
		}
		hdr(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%s/f%05d", dir, i), Mode: 0o644, Size: int64(size)})
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// daemonProc is `serve --config FILE` running as a process (this test binary
// re-executed as the command).
type daemonProc struct {
	t      testing.TB
	cfg    *plugin.Config
	path   string
	cmd    *exec.Cmd
	exited chan error
	stderr *stack.LockedBuffer
	// metrics is the address its /metrics endpoint is bound to, if it
	// has one: configured as stack.AnyLoopbackPort, read from its log.
	metrics string
}

// startDaemon starts the daemon and returns once it serves: its control
// socket accepts connections and it has logged that every listener is
// bound (the snapshots socket and its HTTP endpoints come after the
// control socket, and a failure to bind them ends the daemon).
func startDaemon(t testing.TB, cfg *plugin.Config, cfgPath string) *daemonProc {
	t.Helper()
	serve := startCommand(t, nil, "serve", "--config", cfgPath)
	d := &daemonProc{t: t, cfg: cfg, path: cfgPath, cmd: serve.cmd, exited: serve.exited, stderr: serve.stderr}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if eps, ok := stack.ServedEndpoints(d.stderr.String()); ok {
			if c, err := net.Dial("unix", cfg.Daemon.ControlSocket); err == nil {
				c.Close()
				d.metrics = eps["metrics"]
				return d
			}
		}
		select {
		case err := <-d.exited:
			t.Fatalf("daemon exited before serving: %v\n%s", err, d.stderr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.kill()
			t.Fatalf("daemon not serving after 3 minutes:\n%s", d.stderr)
		}
	}
}

// kill SIGKILLs the daemon and waits for it to be gone.
func (d *daemonProc) kill() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}

// stop SIGTERMs the daemon and waits.
func (d *daemonProc) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(2 * time.Minute):
		d.kill()
	}
}

// pullEnv is one configuration (pool, database, fake S3) shared by the
// subtests of a test, and a handle on the pool for inspection.
type pullEnv struct {
	t       testing.TB
	cfg     *plugin.Config
	srv     *s3test.Server
	cfgPath string
	pool    *thinpool.Pool
	d       *daemonProc
}

func newPullEnv(t *testing.T) *pullEnv { return newPullEnvTB(t) }

// newPullEnvTB's tune functions, if any, change the configuration before
// the daemon starts.
func newPullEnvTB(t testing.TB, tune ...func(*plugin.Config)) *pullEnv {
	// The VM harness boots with -net none: the fake S3 needs loopback up.
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Logf("ip link set lo up: %v: %s", err, out)
	}
	cfg := dmtest.Config(t)
	srv := s3test.NewServer(t)
	cfg.Daemon.ControlSocket = filepath.Join(cfg.Daemon.RootDir, "run", "control.sock")
	cfg.S3.Region, cfg.S3.Endpoint, cfg.S3.PathStyle, cfg.S3.Anonymous = "us-east-1", srv.URL, true, true
	cfg.Pool.DataSize = 6 << 30
	cfg.Pool.BaseImageSize = 1 << 30
	cfg.Pool.AsyncRemove = false
	for _, f := range tune {
		f(cfg)
	}
	cfgPath := dmtest.WriteConfig(t, cfg)
	e := &pullEnv{t: t, cfg: cfg, srv: srv, cfgPath: cfgPath}
	e.d = startDaemon(t, cfg, cfgPath)
	t.Cleanup(func() {
		if e.d != nil {
			e.d.stop()
			if t.Failed() {
				t.Logf("daemon stderr (tail):\n%s", tail(e.d.stderr.String(), 4000))
			}
		}
		if e.pool != nil {
			e.pool.Close()
		}
	})
	pool, err := thinpool.Open(context.Background(), cfg.ThinpoolConfig())
	if err != nil {
		t.Fatal(err)
	}
	e.pool = pool
	return e
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (e *pullEnv) restart() {
	e.t.Helper()
	e.d = startDaemon(e.t, e.cfg, e.cfgPath)
}

func (e *pullEnv) pull(key, ref string) (*api.PullResult, error) {
	return e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: key, Ref: ref})
}

func (e *pullEnv) pullReq(req api.PullRequest) (*api.PullResult, error) {
	c := control.NewClient(e.cfg.Daemon.ControlSocket)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	return c.Pull(ctx, req, nil)
}

// waitIdle waits until no run is pending or running (the runs a restart
// resumed have ended).
func (e *pullEnv) waitIdle() {
	e.t.Helper()
	db := e.db()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		n, err := pipeline.RecordsOf(db).LiveRuns(context.Background())
		if err == nil && n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatal("runs still live 5 minutes after the restart")
}

func (e *pullEnv) db() *metadata.DB {
	e.t.Helper()
	db, err := metadata.Open(context.Background(), metadata.Options{Path: e.cfg.Metadata.Path, ReadOnly: true})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { db.Close() })
	return db
}

// waitRun polls the database until a run of fsmName is running transition,
// and returns when it is (for a SIGKILL at that point).
func (e *pullEnv) waitRun(fsmName, transition string, extra func() bool) {
	e.t.Helper()
	db := e.db()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		runs, err := fsm.NewSQLiteStore(db).ListRuns(context.Background(), fsm.RunFilter{FSM: fsmName, States: []fsm.State{fsm.StateRunning}})
		if err == nil {
			for _, r := range runs {
				if r.Transition == transition && (extra == nil || extra()) {
					return
				}
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	e.t.Fatalf("no %s run reached %s", fsmName, transition)
}

// checkClean asserts nothing half-made is left: no temp file, no live run,
// no extraction snapshot, no mount under the download dir, and the pool's
// thin ids are exactly the recorded devices.
func (e *pullEnv) checkClean() {
	e.t.Helper()
	ctx := context.Background()
	if tmps, _ := os.ReadDir(filepath.Join(e.cfg.Pipeline.DownloadDir, "tmp")); len(tmps) != 0 {
		e.t.Errorf("temp files left: %v", tmps)
	}
	db := e.db()
	if n, err := pipeline.RecordsOf(db).LiveRuns(ctx); err != nil || n != 0 {
		e.t.Errorf("live runs left: %d %v", n, err)
	}
	snaps, err := snapshotter.ReadRecords(db).Snapshots(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range snaps {
		if strings.HasPrefix(s.Key, "flyio-extract-") {
			e.t.Errorf("extraction snapshot left: %s (%s)", s.Key, s.Kind)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), filepath.Join(e.cfg.Pipeline.DownloadDir, "mnt")) {
		e.t.Errorf("extraction mount left:\n%s", mounts)
	}
	ids, err := e.pool.ThinIDs(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	devs, err := snapshotter.ReadRecords(db).ThinDevices(ctx, "")
	if err != nil {
		e.t.Fatal(err)
	}
	recorded := map[uint32]bool{}
	for _, d := range devs {
		recorded[d.ID] = true
	}
	quarantined, err := snapshotter.ReadRecords(db).QuarantinedIDs(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, q := range quarantined {
		e.t.Errorf("thin id %d quarantined: %s", q.DeviceID, q.Reason)
	}
	if len(ids) != len(devs) {
		e.t.Errorf("pool has %d thin devices %v, database records %d: %+v", len(ids), ids, len(devs), devs)
	}
	for _, id := range ids {
		if !recorded[id] {
			e.t.Errorf("pool device %d is not recorded", id)
		}
	}
}

// deviceOfChain returns the thin id of chain's committed snapshot.
func (e *pullEnv) deviceOfChain(chain string) uint32 {
	e.t.Helper()
	db := e.db()
	if ch, err := pipeline.RecordsOf(db).GetChain(context.Background(), chain); err != nil || ch == nil {
		e.t.Fatalf("chain %s: %+v %v", chain, ch, err)
	}
	s, ok, err := snapshotter.ReadRecords(db).Snapshot(context.Background(), chain)
	if err != nil || !ok {
		e.t.Fatalf("snapshot of chain %s: %v %v", chain, ok, err)
	}
	return s.DeviceID
}

// checkActive mounts the image's active snapshot device read-only and
// checks the files of its layers are there.
func (e *pullEnv) checkActive(res *api.PullResult, want ...string) {
	e.t.Helper()
	dir := e.t.TempDir()
	if out, err := exec.Command("mount", "-o", "ro,noload", res.Snapshot.DevicePath, dir).CombinedOutput(); err != nil {
		e.t.Fatalf("mount %s: %v: %s", res.Snapshot.DevicePath, err, out)
	}
	defer exec.Command("umount", dir).Run()
	for _, w := range append([]string{"etc/os-release", "usr", "var"}, want...) {
		if _, err := os.Stat(filepath.Join(dir, w)); err != nil {
			e.t.Errorf("active snapshot of %s lacks %s: %v", res.Ref, w, err)
		}
	}
}

// TestPullRecovery is the five recovery cases of docs/architecture.md
// against the real daemon with real SIGKILLs, then the concurrency and
// sharing cases, all on one pool.
func TestPullRecovery(t *testing.T) {
	e := newPullEnv(t)
	layerA1 := genLayer(t, 1, "a1", 64, 64<<10, true) // 4 MiB
	layerA2 := genLayer(t, 2, "a2", 16, 16<<10, false)
	e.srv.Put(t, "a/01.tar", layerA1)
	e.srv.Put(t, "a/02.tar", layerA2)

	t.Run("1 kill during download", func(t *testing.T) {
		e.srv.Faults.Delay(1, "a/01.tar", 5*time.Minute) // the GET hangs: the download is under way
		errc := make(chan error, 1)
		go func() { _, err := e.pull("a/", "a"); errc <- err }()
		tmp := filepath.Join(e.cfg.Pipeline.DownloadDir, "tmp")
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if ents, _ := os.ReadDir(tmp); len(ents) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no download temp file appeared")
			}
			select {
			case err := <-errc:
				t.Fatalf("pull ended before the kill: %v", err)
			case <-time.After(5 * time.Millisecond):
			}
		}
		e.d.kill()
		<-errc
		e.srv.Faults.Reset()
		e.restart()
		res, err := e.pull("a/", "a")
		if err != nil {
			t.Fatalf("pull after a kill during download: %v", err)
		}
		if got := e.srv.Requests("GET", "a/01.tar"); got != 1 {
			t.Errorf("GETs of a/01.tar after restart = %d, want 1 (download restarted once)", got)
		}
		e.checkActive(res, "a1/f00000", "a2/f00000")
		e.checkClean()
	})

	layerB := genLayer(t, 3, "b", 256, 64<<10, true) // 16 MiB: read in more than one ranged GET
	e.srv.Put(t, "b.tar", layerB)
	t.Run("2 kill after download before validate", func(t *testing.T) {
		e.srv.Faults.Reset()
		// The layer is validated while it downloads, so validate is over
		// in an instant: this daemon stops every run at validate's start
		// (fault injection) for the kill to land there.
		e.d.kill()
		os.Setenv(pipeline.FaultPauseEnv, "validate:started")
		e.restart()
		os.Unsetenv(pipeline.FaultPauseEnv)
		errc := make(chan error, 1)
		go func() { _, err := e.pull("b.tar", "b"); errc <- err }()
		e.waitRun(api.FSMDownload, "validate", nil)
		e.d.kill()
		<-errc
		// A large object is read as several ranged GETs: what counts is
		// that the re-pull reads none.
		downloaded := e.srv.Requests("GET", "b.tar")
		e.restart()
		res, err := e.pull("b.tar", "b")
		if err != nil {
			t.Fatalf("pull after a kill in validate: %v", err)
		}
		if got := e.srv.Requests("GET", "b.tar"); got != downloaded {
			t.Errorf("GETs of b.tar = %d after the re-pull, %d before it; want none more (the resumed run validated the downloaded file)", got, downloaded)
		}
		e.checkActive(res, "b/f00255")
		e.checkClean()
	})

	layerC := genLayer(t, 4, "c", 2048, 8<<10, true) // 16 MiB in 2048 files: the extraction outlasts the wait for 20 of them
	e.srv.Put(t, "c.tar", layerC)
	t.Run("3 kill during extraction", func(t *testing.T) {
		errc := make(chan error, 1)
		go func() { _, err := e.pull("c.tar", "c"); errc <- err }()
		// The extraction runs while the layer downloads (or, if the
		// download won, in the unpack run): the kill lands once it has
		// written files, wherever it runs.
		mnt := filepath.Join(e.cfg.Pipeline.DownloadDir, "mnt")
		for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(2 * time.Millisecond) {
			ents, _ := os.ReadDir(mnt)
			extracting := false
			for _, d := range ents {
				if files, _ := os.ReadDir(filepath.Join(mnt, d.Name(), "c")); len(files) > 20 {
					extracting = true
				}
			}
			if extracting {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no extraction of c.tar wrote 20 files")
			}
		}
		e.d.kill()
		<-errc
		e.restart()
		res, err := e.pull("c.tar", "c")
		if err != nil {
			t.Fatalf("pull after a kill during extraction: %v", err)
		}
		e.checkActive(res, "c/f02047")
		e.checkClean()
	})

	t.Run("4 idempotent re-pull", func(t *testing.T) {
		db := e.db()
		before, _ := e.pool.ThinIDs(context.Background())
		runsBefore, _ := fsm.NewSQLiteStore(db).ListRuns(context.Background(), fsm.RunFilter{})
		e.srv.Faults.Reset()
		start := time.Now()
		code, out, errOut := runCommand(t, nil, "pull", "--config", e.cfgPath, "s3://"+e.srv.Bucket+"/a/", "--name", "a")
		took := time.Since(start)
		if code != 0 {
			t.Fatalf("re-pull: exit %d: %s %s", code, out, errOut)
		}
		if n, lists := e.srv.TotalRequests(), e.srv.Requests("GET", "")+e.srv.Requests("HEAD", ""); n != 1 {
			t.Errorf("re-pull made %d S3 requests (%d listing), want 1: the listing that says the image is unchanged", n, lists)
		}
		if !strings.Contains(out, "downloaded 0, unpacked 0") {
			t.Errorf("re-pull output %q: want nothing downloaded or unpacked", out)
		}
		after, _ := e.pool.ThinIDs(context.Background())
		if fmt.Sprint(before) != fmt.Sprint(after) {
			t.Errorf("re-pull changed the pool's devices: %v -> %v", before, after)
		}
		// Answered from the records: no FSM run started (the runs' handoffs
		// would be writes).
		runs, _ := fsm.NewSQLiteStore(db).ListRuns(context.Background(), fsm.RunFilter{})
		if fresh := len(runs) - len(runsBefore); fresh != 0 {
			t.Errorf("re-pull started %d FSM runs, want none", fresh)
		}
		t.Logf("idempotent re-pull through the CLI: %s (process start included)", took)
		e.srv.Faults.Reset()
		code, out, errOut = runCommand(t, nil, "pull", "--config", e.cfgPath, "s3://"+e.srv.Bucket+"/a/", "--name", "a", "--cached")
		if code != 0 {
			t.Fatalf("re-pull --cached: exit %d: %s %s", code, out, errOut)
		}
		if n := e.srv.TotalRequests(); n != 0 {
			t.Errorf("re-pull --cached made %d S3 requests, want 0", n)
		}
	})

	// Case 5: the image's device removed from device-mapper
	// behind our back. The re-pull's fast path sees the activation's node
	// gone (file-system calls only) and runs the pipelines, which heal it:
	// a new thin device when it was deleted too, the same one mapped again
	// when only its mapping was removed (`dmsetup remove`).
	for _, c := range []struct {
		name       string
		deleteThin bool
	}{
		{"5 device removed behind our back", true},
		{"5b activation unmapped behind our back", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := e.pull("a/", "a")
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			name := filepath.Base(res.Snapshot.DevicePath)
			snap, ok, err := snapshotter.ReadRecords(e.db()).Snapshot(ctx, res.Snapshot.SnapshotName)
			if err != nil || !ok {
				t.Fatalf("activation snapshot %s: %v %v", res.Snapshot.SnapshotName, ok, err)
			}
			if err := e.pool.Deactivate(ctx, name); err != nil {
				t.Fatalf("dmsetup remove %s behind the daemon's back: %v", name, err)
			}
			if _, err := os.Stat(res.Snapshot.DevicePath); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s after dmsetup remove: %v, want it gone", res.Snapshot.DevicePath, err)
			}
			if c.deleteThin {
				if err := e.pool.Delete(ctx, snap.DeviceID); err != nil {
					t.Fatalf("delete thin %d behind the daemon's back: %v", snap.DeviceID, err)
				}
			}
			healed, err := e.pull("a/", "a")
			if err != nil {
				t.Fatalf("pull after the activation's device vanished: %v", err)
			}
			if healed.Unpacked != 0 || healed.Downloaded != 0 {
				t.Errorf("healing pull downloaded %d and unpacked %d, want 0 and 0 (only the activation was gone)", healed.Downloaded, healed.Unpacked)
			}
			after, ok, err := snapshotter.ReadRecords(e.db()).Snapshot(ctx, healed.Snapshot.SnapshotName)
			if err != nil || !ok {
				t.Fatalf("healed activation snapshot %s: %v %v", healed.Snapshot.SnapshotName, ok, err)
			}
			if !c.deleteThin && after.DeviceID != snap.DeviceID {
				t.Errorf("healing pull made thin device %d, want %d mapped again", after.DeviceID, snap.DeviceID)
			}
			e.checkActive(healed, "a2/f00000")
			e.checkClean()
		})
	}

	t.Run("5c chain device deleted behind our back", func(t *testing.T) {
		// A committed chain is not activated: its thin device deleted from
		// the pool shows in no file, only in a device-mapper call, which the
		// re-pull's fast path does not make. The image stays usable (its
		// activation is a snapshot of its own); `pull --refresh` runs the
		// pipelines, whose check-unpacked asks the pool, and the chain is
		// extracted again into a device put in place of the lost one: the
		// activation on it is not touched.
		res, err := e.pull("a/", "a")
		if err != nil {
			t.Fatal(err)
		}
		top := e.deviceOfChain(res.TopChainID)
		ctx := context.Background()
		act, ok, err := snapshotter.ReadRecords(e.db()).Snapshot(ctx, res.Snapshot.SnapshotName)
		if err != nil || !ok {
			t.Fatalf("activation %s: %v %v", res.Snapshot.SnapshotName, ok, err)
		}
		if err := e.pool.Delete(ctx, top); err != nil {
			t.Fatalf("delete thin %d behind the daemon's back: %v", top, err)
		}
		again, err := e.pull("a/", "a")
		if err != nil {
			t.Fatalf("re-pull after the chain's device vanished: %v", err)
		}
		t.Logf("plain re-pull after the chain's device vanished: downloaded %d, unpacked %d (answered from the records)", again.Downloaded, again.Unpacked)
		c := control.NewClient(e.cfg.Daemon.ControlSocket)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		healed, err := c.Pull(cctx, api.PullRequest{Bucket: e.srv.Bucket, Key: "a/", Ref: "a", Refresh: true}, nil)
		if err != nil {
			t.Fatalf("pull --refresh after the chain's device vanished: %v", err)
		}
		if healed.Unpacked != 1 {
			t.Errorf("healing pull unpacked %d chain positions, want 1 (the top one)", healed.Unpacked)
		}
		id := e.deviceOfChain(healed.TopChainID)
		if ok, err := e.pool.ThinExists(ctx, id); err != nil || !ok || id == top {
			t.Errorf("healed top chain device %d (lost: %d) exists = %v, %v", id, top, ok, err)
		}
		if now, ok, err := snapshotter.ReadRecords(e.db()).Snapshot(ctx, healed.Snapshot.SnapshotName); err != nil || !ok || now.DeviceID != act.DeviceID {
			t.Errorf("activation after the heal: %+v %v %v, want its device %d untouched", now, ok, err, act.DeviceID)
		}
		e.checkActive(healed, "a2/f00000")
		e.checkClean()
	})

	layerD1 := genLayer(t, 5, "d1", 32, 64<<10, true)
	layerD2 := genLayer(t, 6, "d2", 32, 64<<10, false)
	e.srv.Put(t, "d/01.tar", layerD1)
	e.srv.Put(t, "d/02.tar", layerD2)
	t.Run("10 concurrent pulls", func(t *testing.T) {
		e.srv.Faults.Reset()
		before, _ := e.pool.ThinIDs(context.Background())
		start := time.Now()
		var wg sync.WaitGroup
		results := make([]*api.PullResult, 10)
		errs := make([]error, 10)
		for i := range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = e.pull("d/", "d")
			}()
		}
		wg.Wait()
		for i := range 10 {
			if errs[i] != nil {
				t.Fatalf("pull %d: %v", i, errs[i])
			}
			if results[i].Snapshot.SnapshotName != results[0].Snapshot.SnapshotName {
				t.Errorf("pull %d got snapshot %s, pull 0 %s", i, results[i].Snapshot.SnapshotName, results[0].Snapshot.SnapshotName)
			}
		}
		for _, k := range []string{"d/01.tar", "d/02.tar"} {
			if n := e.srv.Requests("GET", k); n != 1 {
				t.Errorf("%s downloaded %d times, want 1", k, n)
			}
		}
		after, _ := e.pool.ThinIDs(context.Background())
		if added := len(after) - len(before); added != 3 {
			t.Errorf("10 pulls of a 2-layer image added %d devices, want 3 (two chain positions and one active snapshot)", added)
		}
		runs, err := fsm.NewSQLiteStore(e.db()).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMUnpack})
		if err != nil {
			t.Fatal(err)
		}
		extracted := 0
		for _, r := range runs {
			if r.CreatedAt.After(start) && strings.Contains(string(r.Response), `"unpacked":true`) {
				extracted++
			}
		}
		if extracted != 2 {
			t.Errorf("unpack runs that extracted over the 10 pulls: %d, want 2", extracted)
		}
		e.checkClean()
	})

	e.srv.Put(t, "e/01.tar", layerD1) // the same first layer as d/, under another key
	e.srv.Put(t, "e/02.tar", genLayer(t, 7, "e2", 8, 4<<10, false))
	t.Run("shared first layers", func(t *testing.T) {
		e.srv.Faults.Reset()
		resD, err := e.pull("d/", "d")
		if err != nil {
			t.Fatal(err)
		}
		resE, err := e.pull("e/", "e")
		if err != nil {
			t.Fatal(err)
		}
		if resE.Layers[0].ChainID != resD.Layers[0].ChainID {
			t.Fatalf("chain 1 of e %s != chain 1 of d %s", resE.Layers[0].ChainID, resD.Layers[0].ChainID)
		}
		if e.deviceOfChain(resE.Layers[0].ChainID) != e.deviceOfChain(resD.Layers[0].ChainID) {
			t.Error("shared first layer has two devices")
		}
		// Another key proves nothing about its bytes until they are
		// hashed: downloaded once, then recognised by its SHA-256 and not
		// unpacked again.
		if resE.Unpacked != 1 || e.srv.Requests("GET", "e/01.tar") != 1 {
			t.Errorf("image e: unpacked %d, GETs of its shared layer %d; want 1 and 1", resE.Unpacked, e.srv.Requests("GET", "e/01.tar"))
		}
		e.checkActive(resE, "d1/f00000", "e2/f00000")
		e.checkClean()
	})
}
