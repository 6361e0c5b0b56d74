//go:build dm

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// crashAt returns a hook that stops the operation at step, as a crash there
// would, and records that it fired.
func crashAt(step string, fired *bool) func(string) error {
	return func(s string) error {
		if s == step {
			*fired = true
			return fmt.Errorf("at %s: %w", s, errSimulatedCrash)
		}
		return nil
	}
}

// writeFile mounts mounts, writes name=content at the root, unmounts.
func writeFile(t *testing.T, mounts []mount.Mount, name, content string) {
	t.Helper()
	dir := t.TempDir()
	if err := mount.All(mounts, dir); err != nil {
		t.Fatalf("mount %+v: %v", mounts, err)
	}
	werr := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
	if err := mount.UnmountAll(dir, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	if werr != nil {
		t.Fatalf("write %s: %v", name, werr)
	}
}

// readFile mounts mounts read-only as given and returns the content of name.
func readFile(t *testing.T, mounts []mount.Mount, name string) string {
	t.Helper()
	dir := t.TempDir()
	if err := mount.All(mounts, dir); err != nil {
		t.Fatalf("mount %+v: %v", mounts, err)
	}
	b, rerr := os.ReadFile(filepath.Join(dir, name))
	if err := mount.UnmountAll(dir, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	if rerr != nil {
		t.Fatalf("read %s: %v", name, rerr)
	}
	return string(b)
}

// An interrupted create at every step is rolled back at the next start: the
// key is free, the device is gone, no intent is left, and the same key can
// be prepared again.
func TestReconcileRollsBackInterruptedCreate(t *testing.T) {
	for _, step := range []string{"base:intent", "base:formatted", "create:intent", "create:device", "create:activated"} {
		t.Run(step, func(t *testing.T) {
			e := newTestEnv(t, "rc")
			ctx := nsCtx("default")
			s := e.newSnapshotter(t, Config{AsyncRemove: true})
			var fired bool
			s.hook = crashAt(step, &fired)
			if _, err := s.Prepare(ctx, "k", ""); !errors.Is(err, errSimulatedCrash) || !fired {
				t.Fatalf("Prepare with a crash at %s: err = %v, fired = %v", step, err, fired)
			}
			e.reopen(t)
			s = e.newSnapshotter(t, Config{AsyncRemove: true})
			if _, err := s.Stat(ctx, "k"); !errdefs.IsNotFound(err) {
				t.Fatalf("after restart, Stat of the half-made snapshot: err = %v, want NotFound", err)
			}
			checkPoolMatchesDB(t, s)
			if qs, _ := s.reads().QuarantinedIDs(context.Background()); len(qs) != 0 {
				t.Fatalf("rollback quarantined ids %+v; everything was explained by an intent", qs)
			}
			m, err := s.Prepare(ctx, "k", "")
			if err != nil {
				t.Fatalf("Prepare after rollback: %v", err)
			}
			writeFile(t, m, "f", "after")
			if err := s.Commit(ctx, "c", "k"); err != nil {
				t.Fatal(err)
			}
			checkPoolMatchesDB(t, s)
		})
	}
}

// A crash after the device was deactivated but before Commit was recorded
// leaves an active snapshot whose device reconciliation activates again; the
// commit can be retried and keeps the data.
func TestReconcileInterruptedCommit(t *testing.T) {
	e := newTestEnv(t, "rm")
	ctx := nsCtx("default")
	s := e.newSnapshotter(t, Config{AsyncRemove: true})
	m, err := s.Prepare(ctx, "k", "")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, m, "f", "data-of-k")
	var fired bool
	s.hook = crashAt("commit:deactivated", &fired)
	if err := s.Commit(ctx, "c", "k"); !errors.Is(err, errSimulatedCrash) {
		t.Fatalf("Commit with a crash: %v", err)
	}
	e.reopen(t)
	s = e.newSnapshotter(t, Config{AsyncRemove: true})
	info, err := s.Stat(ctx, "k")
	if err != nil || info.Kind != snapshots.KindActive {
		t.Fatalf("after restart, Stat(k) = %+v, %v; want the active snapshot", info, err)
	}
	name, _, _, err := s.DeviceOf(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if active, err := e.pool.IsActive(context.Background(), name); err != nil || !active {
		t.Fatalf("device %s of the active snapshot not re-activated: %v %v", name, active, err)
	}
	if err := s.Commit(ctx, "c", "k"); err != nil {
		t.Fatalf("retried commit: %v", err)
	}
	v, err := s.View(ctx, "v", "c")
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, v, "f"); got != "data-of-k" {
		t.Fatalf("committed content = %q", got)
	}
	checkPoolMatchesDB(t, s)
}

// A crash after Remove recorded the removal (async: before Cleanup; sync:
// after the device was deleted but before the record went) is finished by
// reconciliation or Cleanup.
func TestReconcileInterruptedRemove(t *testing.T) {
	for _, tc := range []struct {
		step string
		sync bool
	}{{"remove:marked", false}, {"remove:marked", true}, {"reclaim:deleted", true}} {
		t.Run(fmt.Sprintf("%s-sync=%v", tc.step, tc.sync), func(t *testing.T) {
			e := newTestEnv(t, "rr")
			ctx := nsCtx("default")
			s := e.newSnapshotter(t, Config{AsyncRemove: !tc.sync})
			if _, err := s.Prepare(ctx, "k", ""); err != nil {
				t.Fatal(err)
			}
			var fired bool
			s.hook = crashAt(tc.step, &fired)
			if err := s.Remove(ctx, "k"); !errors.Is(err, errSimulatedCrash) {
				t.Fatalf("Remove with a crash at %s: %v", tc.step, err)
			}
			e.reopen(t)
			s = e.newSnapshotter(t, Config{AsyncRemove: !tc.sync})
			if _, err := s.Stat(ctx, "k"); !errdefs.IsNotFound(err) {
				t.Fatalf("removed snapshot visible after restart: %v", err)
			}
			if err := s.Cleanup(context.Background()); err != nil {
				t.Fatal(err)
			}
			checkPoolMatchesDB(t, s)
			devs, _ := s.reads().ThinDevices(context.Background(), ThinStateRemoved)
			if len(devs) != 0 {
				t.Fatalf("removed devices left after Cleanup: %+v", devs)
			}
		})
	}
}

// A thin id in the pool that nothing explains is quarantined and kept, or
// deleted when configured; its id is never chosen again.
func TestReconcileQuarantinesUnknownDevices(t *testing.T) {
	for _, del := range []bool{false, true} {
		t.Run(fmt.Sprintf("delete=%v", del), func(t *testing.T) {
			e := newTestEnv(t, "rq")
			bg := context.Background()
			const stray = 777
			if err := e.pool.CreateThin(bg, stray); err != nil {
				t.Fatal(err)
			}
			s := e.newSnapshotter(t, Config{DeleteUnknownDevices: del, AsyncRemove: true})
			qs, err := s.reads().QuarantinedIDs(bg)
			if err != nil || len(qs) != 1 || qs[0].DeviceID != stray || qs[0].Deleted != del {
				t.Fatalf("quarantine = %+v, %v; want id %d deleted=%v", qs, err, stray, del)
			}
			exists, err := e.pool.ThinExists(bg, stray)
			if err != nil || exists == del {
				t.Fatalf("stray device exists = %v (%v), want %v", exists, err, !del)
			}
			if used, _ := s.reads().thinIDUsed(bg, stray); !used {
				t.Fatal("quarantined id is offered for reuse")
			}
			counts, err := s.DeviceCounts(bg)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 1, true: 0}[del]; counts["quarantined"] != want {
				t.Fatalf("DeviceCounts = %v, want quarantined=%d", counts, want)
			}
			checkPoolMatchesDB(t, s)
		})
	}
}

// A device already in the pool at the id a Prepare would choose is not
// touched: its id is quarantined and the snapshot gets the next free id.
func TestCreateSkipsUnexplainedDeviceAtCandidateID(t *testing.T) {
	e := newTestEnv(t, "rx")
	ctx := nsCtx("default")
	s := e.newSnapshotter(t, Config{AsyncRemove: true})
	if _, err := s.Prepare(ctx, "warm", ""); err != nil { // make the base first
		t.Fatal(err)
	}
	cand := candidateID(keyspace, "k")
	if err := e.pool.CreateThin(context.Background(), cand); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "k", ""); err != nil {
		t.Fatalf("Prepare with its candidate id taken in the pool: %v", err)
	}
	_, _, id, err := s.DeviceOf(ctx, "k")
	if err != nil || id == cand {
		t.Fatalf("snapshot got id %d (%v); candidate %d was taken", id, err, cand)
	}
	if used, _ := s.reads().thinIDUsed(context.Background(), cand); !used {
		t.Fatal("the unexplained id was not quarantined")
	}
	checkPoolMatchesDB(t, s)
}

// A committed device found active (e.g. activated by hand) is deactivated
// at start-up.
func TestReconcileDeactivatesInactiveDevices(t *testing.T) {
	e := newTestEnv(t, "ri")
	ctx := nsCtx("default")
	s := e.newSnapshotter(t, Config{AsyncRemove: true})
	if _, err := s.Prepare(ctx, "k", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "c", "k"); err != nil {
		t.Fatal(err)
	}
	name, _, id, err := s.DeviceOf(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Activate(context.Background(), name, id, testBaseSize); err != nil {
		t.Fatal(err)
	}
	s = e.newSnapshotter(t, Config{AsyncRemove: true})
	if active, err := e.pool.IsActive(context.Background(), name); err != nil || active {
		t.Fatalf("committed device %s still active after reconciliation (%v)", name, err)
	}
}

// Keys ignore the request's namespace (containerd scopes the keys it sends
// itself, and its garbage collector calls with none); snapshot.ref finds a
// committed target; counts and device lookups answer what the fetcher and
// the metrics need.
func TestKeyspaceRefsAndCounts(t *testing.T) {
	e := newTestEnv(t, "rn")
	a, b := nsCtx("a"), nsCtx("b")
	s := e.newSnapshotter(t, Config{AsyncRemove: true})
	ma, err := s.Prepare(a, "same", "")
	if err != nil {
		t.Fatal(err)
	}
	mb, err := s.Prepare(context.Background(), "other", "")
	if err != nil {
		t.Fatalf("Prepare without a namespace (as containerd's GC calls): %v", err)
	}
	if ma[0].Source == mb[0].Source {
		t.Fatalf("two snapshots share device %s", ma[0].Source)
	}
	writeFile(t, ma, "who", "a")
	writeFile(t, mb, "who", "b")
	if _, err := s.Prepare(b, "same", ""); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("the same key from another namespace: %v, want AlreadyExists", err)
	}
	ref := map[string]string{snapshots.LabelSnapshotRef: "sha256:chain"}
	if err := s.Commit(a, "sha256:chain", "same", snapshots.WithLabels(ref)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(a, "extract-1 sha256:chain", "", snapshots.WithLabels(ref)); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Prepare with snapshot.ref of an existing committed snapshot: %v, want AlreadyExists", err)
	}
	if ok, _ := s.Exists(a, "extract-1 sha256:chain"); ok {
		t.Fatal("the skipped extraction snapshot was created")
	}
	if _, err := s.Prepare(b, "extract-2 sha256:chain", "", snapshots.WithLabels(ref)); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("snapshot.ref from another namespace: %v, want AlreadyExists", err)
	}
	if ok, err := s.Exists(b, "other"); err != nil || !ok {
		t.Fatalf("Exists(b, other) = %v, %v", ok, err)
	}
	if _, err := s.View(a, "view", "sha256:chain"); err != nil {
		t.Fatal(err)
	}
	counts, err := s.DeviceCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if counts["active"] != 1 || counts["committed"] != 1 || counts["view"] != 1 || counts["base"] != 1 {
		t.Fatalf("DeviceCounts = %v, want active 1, committed 1, view 1, base 1", counts)
	}
	if err := s.Remove(b, "other"); err != nil {
		t.Fatal(err)
	}
	if counts, _ = s.DeviceCounts(context.Background()); counts["removed-pending"] != 1 {
		t.Fatalf("DeviceCounts after async Remove = %v, want removed-pending 1", counts)
	}
	if err := s.Remove(a, "sha256:chain"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Remove of a parent with a view: %v, want FailedPrecondition", err)
	}
	v, err := s.Mounts(a, "view")
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, v, "who"); got != "a" {
		t.Fatalf("view content %q, want a", got)
	}
	u, err := s.Usage(a, "sha256:chain")
	if err != nil || u.Size <= 0 {
		t.Fatalf("Usage of a committed snapshot with a file = %+v, %v", u, err)
	}
	name, path, id, err := s.DeviceOf(a, "view")
	if err != nil || name != deviceName(e.poolNm, id) || path != thinpool.DevicePath(name) {
		t.Fatalf("DeviceOf = %q %q %d %v", name, path, id, err)
	}
	if err := s.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkPoolMatchesDB(t, s)
}
