package snapshotter

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

// cancelAt returns a step hook that cancels the caller's context when the
// operation reaches step, and a pointer saying whether it did.
func cancelAt(step string, cancel context.CancelFunc) (func(string) error, *bool) {
	fired := new(bool)
	return func(s string) error {
		if s == step {
			*fired = true
			cancel()
		}
		return nil
	}, fired
}

// callCancelledAt runs call with a context derived from parent that s's
// hook cancels when s reaches step, failing the test if it never does, and
// returns call's error.
func callCancelledAt(t *testing.T, parent context.Context, s *Snapshotter, step string, call func(ctx context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var fired *bool
	s.hook, fired = cancelAt(step, cancel)
	err := call(ctx)
	s.hook = nil
	if !*fired {
		t.Fatalf("step %s never reached", step)
	}
	return err
}

// removeAfterCancel removes keys in order, the last one the parent a
// cancelled call (named by what) worked on, which must be removable again,
// and checks that the pool and the records then agree.
func removeAfterCancel(t *testing.T, s *Snapshotter, pool *thinpooltest.FakePool, what string, keys ...string) {
	t.Helper()
	for _, key := range keys {
		if err := s.Remove(context.Background(), key); err != nil {
			t.Fatalf("%s not removable after a cancelled %s: %v", key, what, err)
		}
	}
	assertSettled(t, s, pool)
}

// assertSettled checks what a caller's cancellation may not leave behind:
// an intent row, or a device in the pool that no record holds (or a record
// whose device is gone).
func assertSettled(t *testing.T, s *Snapshotter, pool *thinpooltest.FakePool) {
	t.Helper()
	ctx := context.Background()
	intents, err := s.reads().Intents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(intents) != 0 {
		t.Errorf("intents left: %+v", intents)
	}
	devs, err := s.reads().ThinDevices(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var recorded []uint32
	for _, d := range devs {
		recorded = append(recorded, d.ID)
	}
	inPool, _ := pool.ThinIDs(ctx)
	slices.Sort(recorded)
	slices.Sort(inPool)
	if !slices.Equal(recorded, inPool) {
		t.Errorf("pool holds thin ids %v, records %v", inPool, recorded)
	}
}

// TestCancelAtEveryStep cancels the caller's context at each step of
// Prepare, Commit and Remove (after the device-mapper call before it), and
// checks the call ends with its work either done or undone: no intent row,
// pool and records agreeing, the key free again, and the parent removable.
func TestCancelAtEveryStep(t *testing.T) {
	bg := context.Background()
	for _, step := range []string{"create:intent", "create:device", "create:activated"} {
		t.Run("prepare/"+step, func(t *testing.T) {
			s, pool := newFakeSnapshotter(t, Config{})
			mustParent(t, s, "parent")
			err := callCancelledAt(t, bg, s, step, func(ctx context.Context) error {
				_, err := s.Prepare(ctx, "child", "parent")
				return err
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Prepare cancelled at %s: got %v, want context.Canceled", step, err)
			}
			assertSettled(t, s, pool)
			if _, err := s.Stat(bg, "child"); !errdefs.IsNotFound(err) {
				t.Errorf("Stat of the cancelled key: got %v, want NotFound", err)
			}
			// The key is free again (not "being created").
			if _, err := s.Prepare(bg, "child", "parent"); err != nil {
				t.Fatalf("Prepare again after the cancel: %v", err)
			}
			removeAfterCancel(t, s, pool, "Prepare", "child", "parent")
		})
	}
	t.Run("commit/commit:deactivated", func(t *testing.T) {
		s, pool := newFakeSnapshotter(t, Config{})
		mustParent(t, s, "parent")
		if _, err := s.Prepare(bg, "work", "parent"); err != nil {
			t.Fatal(err)
		}
		err := callCancelledAt(t, bg, s, "commit:deactivated", func(ctx context.Context) error { return s.Commit(ctx, "done", "work") })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Commit cancelled: got %v, want context.Canceled", err)
		}
		assertSettled(t, s, pool)
		// The caller still has its active snapshot, mounted as before.
		if _, err := s.Stat(bg, "done"); !errdefs.IsNotFound(err) {
			t.Errorf("Stat of the cancelled commit's name: got %v, want NotFound", err)
		}
		if _, active := pool.Counts(); active != 1 {
			t.Errorf("%d devices mapped after a cancelled commit, want 1 (the active snapshot's)", active)
		}
		if _, err := s.Mounts(bg, "work"); err != nil {
			t.Fatalf("Mounts of the active snapshot after a cancelled commit: %v", err)
		}
		if err := s.Commit(bg, "done", "work"); err != nil {
			t.Fatalf("Commit again after the cancel: %v", err)
		}
		removeAfterCancel(t, s, pool, "Commit", "done", "parent")
	})
	for _, step := range []string{"remove:marked", "reclaim:deleted"} {
		t.Run("remove/"+step, func(t *testing.T) {
			s, pool := newFakeSnapshotter(t, Config{})
			mustParent(t, s, "parent")
			if _, err := s.Prepare(bg, "child", "parent"); err != nil {
				t.Fatal(err)
			}
			// The removal is recorded before the first step: the call
			// finishes it and reports success.
			err := callCancelledAt(t, bg, s, step, func(ctx context.Context) error { return s.Remove(ctx, "child") })
			if err != nil {
				t.Fatalf("Remove cancelled at %s: %v", step, err)
			}
			assertSettled(t, s, pool)
			if removed, err := s.reads().ThinDevices(bg, "removed"); err != nil || len(removed) != 0 {
				t.Errorf("devices awaiting Cleanup after a synchronous Remove: %v (%v)", removed, err)
			}
			removeAfterCancel(t, s, pool, "Remove of its child", "parent")
		})
	}
}

// TestCancelledCleanupStops checks a Cleanup whose caller gave up stops
// between devices, and leaves each device it reached either deleted with
// its record or still recorded for the next Cleanup.
func TestCancelledCleanupStops(t *testing.T) {
	bg := context.Background()
	s, pool := newFakeSnapshotter(t, Config{AsyncRemove: true})
	mustParent(t, s, "parent")
	for _, k := range []string{"a", "b", "c"} {
		if _, err := s.Prepare(bg, k, "parent"); err != nil {
			t.Fatal(err)
		}
		if err := s.Remove(bg, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := callCancelledAt(t, bg, s, "reclaim:deleted", s.Cleanup); !errors.Is(err, context.Canceled) {
		t.Fatalf("Cleanup cancelled at its first device: got %v, want context.Canceled", err)
	}
	assertSettled(t, s, pool)
	left, err := s.reads().ThinDevices(bg, "removed")
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 {
		t.Errorf("%d devices left for the next Cleanup, want 2 (it stopped after the first)", len(left))
	}
	if err := s.Cleanup(bg); err != nil {
		t.Fatal(err)
	}
	assertSettled(t, s, pool)
}

// mustParent makes the committed snapshot name on an empty filesystem.
func mustParent(t *testing.T, s *Snapshotter, name string) {
	t.Helper()
	bg := context.Background()
	if _, err := s.Prepare(bg, name+"-work", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(bg, name, name+"-work"); err != nil {
		t.Fatal(err)
	}
}

// A Commit whose active snapshot is removed between its deactivation and
// its record fails NotFound and leaves the removed device unmapped, so
// Cleanup can delete it.
func TestCommitOfRemovedSnapshotLeavesDeviceUnmapped(t *testing.T) {
	bg := context.Background()
	s, pool := newFakeSnapshotter(t, Config{AsyncRemove: true})
	if _, err := s.Prepare(bg, "work", ""); err != nil {
		t.Fatal(err)
	}
	s.hook = func(step string) error {
		if step == "commit:deactivated" {
			return s.Remove(bg, "work")
		}
		return nil
	}
	err := s.Commit(bg, "done", "work")
	s.hook = nil
	if !errdefs.IsNotFound(err) {
		t.Fatalf("Commit of a snapshot removed meanwhile: %v, want NotFound", err)
	}
	if _, active := pool.Counts(); active != 0 {
		t.Fatalf("%d devices mapped after the failed commit; the removed device must stay unmapped", active)
	}
	if err := s.Cleanup(bg); err != nil {
		t.Fatal(err)
	}
	assertSettled(t, s, pool)
}
