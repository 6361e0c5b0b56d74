package pipeline

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"golang.org/x/sys/unix"
)

// TestResumeServesPastALeftoverItCannotRemove: a start-up finds a
// download temp file of a run no longer live that it cannot remove (here
// a directory with a file in it stands at its path). The daemon still
// starts, pulls, and leaves the leftover for the next start.
func TestResumeServesPastALeftoverItCannotRemove(t *testing.T) {
	e := newPullEnv(t, nil)
	stuck := filepath.Join(e.p.opts.tmpDir(), "obj-gone.partial")
	if err := os.MkdirAll(stuck, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stuck, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.p.sweep(context.Background()); err == nil {
		t.Fatal("the sweep removed a non-empty directory: the test does not make the leftover it means to")
	}
	e.p = e.reopen(nil) // fails the test if Resume does
	e.srv.Put(t, "img/1.tar", layerTar(t, "img", 3000))
	e.mustPull("img/", "img")
	if _, err := os.Stat(stuck); err != nil {
		t.Errorf("the leftover: %v, want it left for the next start", err)
	}
}

// TestSweepLeavesNoMountOfAnExtractionHeldOpen: a start-up finds the
// extraction snapshot of a run that is no longer live still mounted (the
// killed daemon was extracting into it) while a process outside the
// daemon has a file open in it. The sweep removes the snapshot, and the
// mount must not outlive it: once the holder lets go, nothing would ever
// unmount it (no record names it any more) and its device could never be
// deleted.
func TestSweepLeavesNoMountOfAnExtractionHeldOpen(t *testing.T) {
	ctx := context.Background()
	e := newPullEnv(t, nil)
	key := extractKey("sha256:" + strings.Repeat("ab", 32))
	if _, err := e.sn.Prepare(ctx, key, "", snapshots.WithLabels(map[string]string{LabelPrivate: privateExtract})); err != nil {
		t.Fatal(err)
	}
	ms, err := e.sn.Mounts(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	dir := e.p.mountDirOf(key)
	if _, err := e.sn.mount(ms, dir); err != nil { // never unmounted: the daemon was killed
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	held, err := os.Create(filepath.Join(dir, "held"))
	if err != nil {
		t.Fatal(err)
	}
	e.p = e.reopen(nil)
	if x := e.sn.extractions(t); len(x) != 0 {
		t.Fatalf("extraction snapshots after the start-up: %v, want the stale one removed", x)
	}
	held.Close()
	e.p = e.reopen(nil)
	if m, _ := filepath.Glob(filepath.Join(e.p.opts.MountDir, "*")); len(m) != 0 {
		t.Errorf("mount points left after the holder let go and the daemon started again: %v", m)
	}
}
