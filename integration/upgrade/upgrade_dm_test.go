//go:build dm

package upgrade

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/inventory"
)

const (
	// pool is the dm name of the daemons' pool (both binaries run on it).
	pool = "flyio-upgrade-pool"
	// liveID is the container that runs through every phase.
	liveID = "upg-live"
	// liveData is the file the live container writes in its rootfs.
	liveData = "/root/data"
	// bigPayload makes a big image's pull last long enough (its download
	// and unpack, in the VM) to be stopped half-way.
	bigPayload = 32 << 20
)

var (
	imgA    = testImage{name: "small-a"}
	imgB    = testImage{name: "small-b"}
	imgBig1 = testImage{name: "big-1", payload: bigPayload} // in flight at the upgrade
	imgBig2 = testImage{name: "big-2", payload: bigPayload} // in flight at the restart
)

// env is the running stack and what the test has seen of it.
type env struct {
	t       *testing.T
	ctx     context.Context
	prev    previous
	cur     string // the current binary
	s3      *stack.S3
	d       *stack.Daemon
	ctrd    *stack.Containerd
	phases  []string
	livePid string // the live container's pid, the same through every phase
	runs    int
}

// phase runs f and records and logs its wall time (also when f fails the
// test).
func (e *env) phase(name string, f func()) {
	e.t.Logf("== phase: %s", name)
	start := time.Now()
	defer func() {
		took := time.Since(start).Round(100 * time.Millisecond)
		e.phases = append(e.phases, fmt.Sprintf("%-62s %6.1fs", name, took.Seconds()))
		e.t.Logf("== phase %q took %s", name, took)
	}()
	f()
}

// TestUpgradeAndRollback: the previous release with two images pulled, a
// container running and a pull in flight is stopped with SIGTERM and the
// current binary started on the same root and config; then the current
// binary is restarted under the same load; then the previous release is
// started again, refuses the migrated database, and comes up on the
// <db>.pre-vN copy restored as docs/operating.md says.
func TestUpgradeAndRollback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	repo, _, tools, err := stack.VMEnv()
	if err != nil {
		t.Fatal(err)
	}
	dir := scratch.Dir(t, "upgrade")
	prev, err := readPrevious(repo)
	if err != nil {
		t.Fatal(err)
	}
	cur := filepath.Join(repo, "bin/containerd-flyio-snapshotter")
	if _, err := os.Stat(cur); err != nil {
		t.Fatalf("the current binary (make build): %v", err)
	}
	vgw, err := stack.Versitygw(repo)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, prev: prev, cur: cur}
	t.Cleanup(func() { t.Logf("phases' wall times:\n  %s", strings.Join(e.phases, "\n  ")) })

	e.phase("set up: versitygw with 4 images, containerd, the previous release", func() { e.setUp(dir, vgw, tools) })
	e.phase("previous release: pull 2 images, run a container", e.loadPrevious)
	e.phase("upgrade: SIGTERM mid-pull, start the current binary", e.upgrade)
	e.phase("upgrade: containers, images and the interrupted pull", e.checkUpgraded)
	e.phase("restart of the current binary mid-pull", e.restart)
	e.phase("rollback: the previous release refuses the migrated database", e.refused)
	e.phase("rollback: restore the copy, start the previous release", e.rollBack)
}

func (e *env) setUp(dir, vgw, tools string) {
	t, ctx := e.t, e.ctx
	out, err := stack.Run(ctx, nil, e.prev.Bin, "--version")
	if err != nil || !strings.Contains(out, e.prev.Tag) {
		t.Fatalf("previous release %s --version: %q, %v; want its tag %s", e.prev.Bin, out, err, e.prev.Tag)
	}
	t.Logf("previous release: %s (commit %s, schema %d); current: %s", strings.TrimSpace(out), e.prev.Commit, e.prev.Schema, e.cur)

	step := time.Now()
	took := func(what string) {
		t.Logf("%s: %s", what, time.Since(step).Round(time.Millisecond))
		step = time.Now()
	}
	src := filepath.Join(dir, "s3-src")
	if err := writeImages(src, []testImage{imgA, imgB, imgBig1, imgBig2}); err != nil {
		t.Fatal(err)
	}
	if e.s3, err = stack.StartS3(ctx, vgw, filepath.Join(dir, "s3"), filepath.Join(dir, "s3-log"), s3Bucket, "", ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.s3.Stop(); err != nil {
			t.Errorf("versitygw: %v", err)
		}
	})
	if _, err := e.s3.Seed(ctx, src); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(src) // the store has them; the tmpfs is the VM's memory
	took("versitygw serving the images")

	ctrdDir := filepath.Join(dir, "containerd")
	if e.d, err = stack.WriteDaemonConfig(e.prev.Bin, stack.DaemonOptions{
		Dir: filepath.Join(dir, "flyio"), PoolName: pool, DataSize: "3GiB",
		S3: e.s3, Containerd: filepath.Join(ctrdDir, "containerd.sock"),
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	took("the previous release serving on a new pool")
	t.Cleanup(func() {
		if e.d.Proc != nil && !e.d.Proc.Exited() {
			if err := e.d.Stop(); err != nil {
				t.Errorf("our daemon: %v", err)
			}
		}
		if err := stack.DestroyPool(context.Background(), pool, filepath.Join(e.d.Root, "pool")); err != nil {
			t.Errorf("destroy pool: %v", err)
		}
	})
	if e.ctrd, err = stack.StartContainerd(ctx, tools, ctrdDir, e.d.Socket); err != nil {
		t.Fatal(err)
	}
	took("containerd serving")
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := e.ctrd.Ctr(ctx, "task", "kill", "--signal", "SIGKILL", liveID); err == nil {
			time.Sleep(500 * time.Millisecond)
		}
		_, _ = e.ctrd.Ctr(ctx, "task", "delete", "--force", liveID)
		_, _ = e.ctrd.Ctr(ctx, "container", "delete", liveID)
		if err := e.ctrd.Stop(); err != nil {
			t.Errorf("containerd: %v", err)
		}
	})
}

func (e *env) loadPrevious() {
	t, ctx := e.t, e.ctx
	for _, img := range []testImage{imgA, imgB} {
		if _, err := e.pull(img); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.ctrImages(); !slices.Equal(got, refs(imgA, imgB)) {
		t.Fatalf("containerd lists %v after the previous release's pulls, want %v", got, refs(imgA, imgB))
	}
	if _, err := e.ctrd.Ctr(ctx, "run", "-d", "--snapshotter", "flyio", imgA.ref(), liveID,
		"/bin/sh", "-c", "echo written-under-"+e.prev.Tag+" > "+liveData+" && exec sleep 86400"); err != nil {
		t.Fatal(err)
	}
	e.livePid = e.checkLive("started")
}

// pull runs the daemon's binary's pull of img to its end.
func (e *env) pull(img testImage) (string, error) {
	start := time.Now()
	out, err := stack.Run(e.ctx, nil, pullArgv(e.d, img.ref(), img.source())...)
	if err == nil {
		e.t.Logf("%s pulled %s in %s", filepath.Base(filepath.Dir(e.d.Bin)), img.source(), time.Since(start).Round(time.Millisecond))
	}
	return out, err
}

// interruptedPull starts a pull of img, waits until `ls runs` shows one of
// its state-machine runs running (the pull is under way), stops the daemon
// with SIGTERM (as `systemctl stop` does), and checks what
// docs/operating.md says of it: the pull CLI exits with an error, the image
// is not pulled, and its runs are left live for the next daemon to resume.
func (e *env) interruptedPull(img testImage) {
	t, ctx := e.t, e.ctx
	bg, err := startPull(e.d, img.ref(), img.source())
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for running := false; !running; {
		live, err := liveRunsOf(wctx, e.d, img.name)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range live {
			if r.State == "running" {
				t.Logf("pull of %s under way: %s run %s running", img.source(), r.FSM, r.RunID)
				running = true
			}
		}
		if running {
			break
		}
		select {
		case <-bg.done:
			_, out, _ := bg.wait(wctx)
			t.Fatalf("the pull of %s ended before the daemon could be stopped under it (make bigPayload larger): %v: %s", img.source(), bg.err, lastLines(out, 3))
		case <-wctx.Done():
			t.Fatalf("no run of the pull of %s appeared running in ls runs: %v", img.source(), wctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	stopped := time.Now()
	if err := e.d.Stop(); err != nil {
		t.Fatalf("SIGTERM to the daemon with a pull in flight: %v", err)
	}
	t.Logf("daemon %s stopped with SIGTERM in %s", e.d.Bin, time.Since(stopped).Round(time.Millisecond))
	exitErr, out, err := bg.wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if exitErr == nil {
		t.Errorf("the pull CLI of %s exited 0 though its daemon stopped under it: %s", img.source(), lastLines(out, 3))
	} else {
		t.Logf("the pull CLI lost its daemon: %v: %s", exitErr, lastLines(out, 2))
	}
	rows, err := lsImages(ctx, e.d)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := rowOf(rows, img.source())
	if ok && (r.State == inventory.ImageStateUnpacked || r.State == inventory.ImageStateActive) {
		t.Fatalf("after the stop, %s is listed %s: the pull was not in flight", img.source(), r.State)
	}
	t.Logf("with the daemon stopped, ls images lists %s: %v, state %q, download %q", img.source(), ok, r.State, r.DownloadStatus)
	live, err := liveRunsOf(ctx, e.d, img.name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("with the daemon stopped, %d runs of the pull of %s are left pending or running for the next daemon", len(live), img.source())
	for _, r := range live {
		t.Logf("  %s run %s: %s", r.FSM, r.RunID, r.State)
	}
}

// start starts bin as the daemon on the same root and config and returns
// what it logged while starting.
func (e *env) start(bin string) string {
	logPath := filepath.Join(e.d.Root, "snapshotter.log")
	var from int64
	if st, err := os.Stat(logPath); err == nil {
		from = st.Size()
	}
	e.d.Bin = bin
	start := time.Now()
	if err := e.d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("%s serving after %s", bin, time.Since(start).Round(time.Millisecond))
	return readFrom(e.t, logPath, from)
}

func (e *env) upgrade() {
	t := e.t
	e.interruptedPull(imgBig1)
	logged := e.start(e.cur)
	db := filepath.Join(e.d.Root, "metadata.db")
	backup := fmt.Sprintf("%s.pre-v%d", db, e.prev.Schema+1)
	for _, want := range []string{"metadata: copied database before migrating", "metadata: database migrated",
		fmt.Sprintf("from=%d", e.prev.Schema), "backup=" + backup} {
		if !strings.Contains(logged, want) {
			t.Errorf("the current daemon's start-up log lacks %q:\n%s", want, logged)
		}
	}
	for _, l := range strings.Split(logged, "\n") {
		if strings.Contains(l, "metadata: ") && strings.Contains(l, "migrat") {
			t.Logf("log: %s", l)
		}
	}
	if st, err := os.Stat(backup); err != nil || st.Size() == 0 {
		t.Fatalf("the copy taken before migrating: %v", err)
	}
}

func (e *env) checkUpgraded() {
	t := e.t
	e.checkLive("after the upgrade")
	e.checkListed(imgA, imgB)
	if got := e.ctrImages(); !slices.Equal(got, refs(imgA, imgB)) {
		t.Errorf("containerd lists %v after the upgrade, want the same %v as before", got, refs(imgA, imgB))
	}
	e.runOn(imgA)
	e.runOn(imgB)
	if out, err := e.pull(imgBig1); err != nil {
		t.Fatalf("the interrupted pull run again: %v", err)
	} else {
		t.Logf("the interrupted pull run again: %s", lastLines(out, 2))
	}
	e.checkListed(imgBig1)
	if got := e.ctrImages(); !slices.Equal(got, refs(imgA, imgB, imgBig1)) {
		t.Errorf("containerd lists %v, want %v", got, refs(imgA, imgB, imgBig1))
	}
}

func (e *env) restart() {
	t := e.t
	e.interruptedPull(imgBig2)
	logged := e.start(e.cur)
	if strings.Contains(logged, "database migrated") {
		t.Errorf("a restart on a migrated database migrated it again:\n%s", logged)
	}
	e.checkLive("after the restart")
	e.checkListed(imgA, imgB, imgBig1)
	if out, err := e.pull(imgBig2); err != nil {
		t.Fatalf("the pull interrupted by the restart, run again: %v", err)
	} else {
		t.Logf("the pull interrupted by the restart, run again: %s", lastLines(out, 2))
	}
	e.checkListed(imgBig2)
	if got := e.ctrImages(); !slices.Equal(got, refs(imgA, imgB, imgBig1, imgBig2)) {
		t.Errorf("containerd lists %v, want %v", got, refs(imgA, imgB, imgBig1, imgBig2))
	}
}

func (e *env) refused() {
	t, ctx := e.t, e.ctx
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(e.d.Root, "refused.log")
	p, err := stack.StartProc("previous release", logPath, os.Environ(), e.prev.Bin, "serve", flagConfig, e.d.Config)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !p.Exited() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !p.Exited() {
		p.Kill()
		t.Fatalf("the previous release kept running on the migrated database; log:\n%s", p.LogTail(20))
	}
	logged := readFrom(t, logPath, 0)
	var msg string
	for _, l := range strings.Split(logged, "\n") {
		if strings.Contains(l, "refusing database") {
			msg = l
		}
	}
	if !strings.Contains(msg, "database schema newer than this binary") {
		t.Fatalf("the previous release exited without naming the newer schema; log:\n%s", logged)
	}
	t.Logf("the previous release refuses: %s", msg)
	if strings.Contains(msg, ".pre-v") {
		t.Logf("its message names the copy to restore")
	} else {
		t.Logf("its message does not name the .pre-v%d copy to restore: only binaries since then name the way back", e.prev.Schema+1)
	}
	// docs/operating.md: the read-only commands still read a newer database.
	e.d.Bin = e.prev.Bin
	rows, err := lsImages(ctx, e.d)
	if err != nil {
		t.Errorf("the previous release's ls images on the migrated database: %v", err)
	} else {
		for _, img := range []testImage{imgA, imgB, imgBig1, imgBig2} {
			if _, ok := rowOf(rows, img.source()); !ok {
				t.Errorf("the previous release's ls images on the migrated database does not list %s", img.source())
			}
		}
	}
}

func (e *env) rollBack() {
	t, ctx := e.t, e.ctx
	// docs/operating.md's steps: the daemon is stopped and the older binary
	// in place; restore the copy; start it.
	db := filepath.Join(e.d.Root, "metadata.db")
	backup := fmt.Sprintf("%s.pre-v%d", db, e.prev.Schema+1)
	if err := os.Rename(db, db+".rolled-back"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(db+"-wal", db+".rolled-back-wal"); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.Remove(db + "-shm"); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := copyFile(backup, db); err != nil {
		t.Fatal(err)
	}
	logged := e.start(e.prev.Bin)
	quarantined := 0
	for _, l := range strings.Split(logged, "\n") {
		if strings.Contains(l, "level=warn") || strings.Contains(l, "level=error") {
			t.Logf("previous release's start-up: %s", l)
		}
		if strings.Contains(l, "quarantined") {
			quarantined++
		}
	}
	// docs/operating.md: the devices made since the upgrade (big-1's and
	// big-2's) are unknown to the copy, and quarantined, not deleted.
	if quarantined == 0 {
		t.Errorf("the previous release quarantined no device on the restored copy, though the images pulled since the upgrade made some")
	}
	if out, err := e.d.CLI(ctx, []string{"pool", "status"}); err != nil {
		t.Errorf("pool status after the rollback: %v", err)
	} else {
		t.Logf("pool status after the rollback:\n%s", out)
	}
	e.checkListed(imgA, imgB)
	rows, err := lsImages(ctx, e.d)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []testImage{imgBig1, imgBig2} {
		r, ok := rowOf(rows, img.source())
		t.Logf("after the rollback, %s (pulled after the upgrade): listed %v %+v", img.source(), ok, r)
	}
	if out, err := e.d.CLI(ctx, []string{"pool", "quarantine", "ls"}); err != nil {
		t.Logf("the previous release cannot list its quarantine: %v", err)
	} else {
		t.Logf("pool quarantine ls after the rollback:\n%s", out)
	}
	e.runOn(imgA)
	e.runOn(imgB)
	e.checkLive("after the rollback")
}

// checkListed checks that `ls images` lists each image under its name,
// pulled (unpacked or active).
func (e *env) checkListed(imgs ...testImage) {
	e.t.Helper()
	rows, err := lsImages(e.ctx, e.d)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, img := range imgs {
		r, ok := rowOf(rows, img.source())
		switch {
		case !ok:
			e.t.Errorf("%s ls images does not list %s", e.d.Bin, img.source())
		case r.State != inventory.ImageStateUnpacked && r.State != inventory.ImageStateActive:
			e.t.Errorf("%s ls images lists %s %s, want unpacked or active", e.d.Bin, img.source(), r.State)
		case !slices.Contains(r.Names, img.ref()):
			e.t.Errorf("%s ls images lists %s with names %v, want %s", e.d.Bin, img.source(), r.Names, img.ref())
		}
	}
}

// runOn runs a new container on img (ctr run --rm) and checks it sees the
// image's own top layer.
func (e *env) runOn(img testImage) {
	e.t.Helper()
	e.runs++
	id := fmt.Sprintf("upg-run-%d", e.runs)
	out, err := e.ctrd.Ctr(e.ctx, "run", "--rm", "--snapshotter", "flyio", img.ref(), id, "/bin/cat", namePath)
	if err != nil {
		e.t.Fatalf("a new container on %s: %v", img.ref(), err)
	}
	if strings.TrimSpace(out) != img.name {
		e.t.Errorf("a new container on %s printed %q, want %q", img.ref(), out, img.name)
	}
}

// checkLive checks that the live container's task runs, with the pid it
// had (the same process, never restarted), and that the file it wrote in
// its rootfs is there; it returns the pid.
func (e *env) checkLive(when string) string {
	t, ctx := e.t, e.ctx
	t.Helper()
	var pid, status string
	out, err := e.ctrd.Ctr(ctx, "task", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == liveID {
			pid, status = f[1], f[2]
		}
	}
	if status != "RUNNING" || (e.livePid != "" && pid != e.livePid) {
		t.Fatalf("%s: container %s is %q with pid %q, want RUNNING with pid %q:\n%s", when, liveID, status, pid, e.livePid, out)
	}
	want := "written-under-" + e.prev.Tag
	var data string
	for try := 0; try < 50; try++ {
		e.runs++
		data, err = e.ctrd.Ctr(ctx, "task", "exec", "--exec-id", fmt.Sprintf("read-%d", e.runs), liveID, "/bin/cat", liveData)
		if err == nil && strings.TrimSpace(data) == want {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.TrimSpace(data) != want {
		t.Fatalf("%s: %s in container %s holds %q (%v), want %q", when, liveData, liveID, data, err, want)
	}
	t.Logf("%s: container %s RUNNING, pid %s, %s holds %q", when, liveID, pid, liveData, want)
	return pid
}

// ctrImages is containerd's list of image names, sorted.
func (e *env) ctrImages() []string {
	out, err := e.ctrd.Ctr(e.ctx, "image", "ls", "-q")
	if err != nil {
		e.t.Fatal(err)
	}
	names := strings.Fields(out)
	slices.Sort(names)
	return names
}

// refs is the sorted names of imgs.
func refs(imgs ...testImage) []string {
	var r []string
	for _, img := range imgs {
		r = append(r, img.ref())
	}
	slices.Sort(r)
	return r
}

// readFrom returns the text of path from byte offset from on.
func readFrom(t *testing.T, path string, from int64) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// lastLines is the last n lines of out, joined by " | ".
func lastLines(out string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
