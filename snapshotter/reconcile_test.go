package snapshotter

import (
	"context"
	"testing"

	"github.com/containerd/errdefs"
)

// A snapshot whose device vanished from the pool while the daemon was
// down loses its records at start-up when nothing is on it, and keeps them
// (for the operator) when a child is.
func TestReconcileDropsSnapshotsWhoseDeviceIsGone(t *testing.T) {
	ctx := context.Background()
	s, pool := newFakeSnapshotter(t, Config{})
	mustParent(t, s, "parent")
	mustParent(t, s, "lone")
	if _, err := s.Prepare(ctx, "child", "parent"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"parent", "lone"} {
		_, _, id, err := s.DeviceOf(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := pool.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(ctx, s.db, pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, "lone"); !errdefs.IsNotFound(err) {
		t.Errorf("snapshot whose device is gone and that has no child: Stat = %v, want NotFound", err)
	}
	if _, err := s.Stat(ctx, "parent"); err != nil {
		t.Errorf("snapshot whose device is gone but that has a child was dropped: %v", err)
	}
	if _, err := s.Stat(ctx, "child"); err != nil {
		t.Errorf("child of the snapshot whose device is gone: %v", err)
	}
}

// TestReconcileDropsMissingParentAndChild: a committed snapshot and the
// active one on it, both gone from the pool, are both dropped at start-up,
// whichever has the smaller thin id (records are walked in id order).
func TestReconcileDropsMissingParentAndChild(t *testing.T) {
	ctx := context.Background()
	seen := map[bool]bool{}
	for i := 0; i < 40 && len(seen) < 2; i++ {
		s, pool := newFakeSnapshotter(t, Config{})
		p, c := "p"+string(rune('a'+i)), "c"+string(rune('a'+i))
		mustParent(t, s, p)
		if _, err := s.Prepare(ctx, c, p); err != nil {
			t.Fatal(err)
		}
		_, _, pid, _ := s.DeviceOf(ctx, p)
		_, _, cid, _ := s.DeviceOf(ctx, c)
		if seen[pid < cid] {
			continue
		}
		seen[pid < cid] = true
		for _, id := range []uint32{pid, cid} {
			_ = pool.Deactivate(ctx, deviceName(pool.Name(), id))
			if err := pool.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		s2, err := New(ctx, s.db, pool, Config{})
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{c, p} {
			if _, err := s2.Stat(ctx, key); !errdefs.IsNotFound(err) {
				t.Errorf("parent id %d, child id %d: Stat(%s) = %v after start-up, want not found", pid, cid, key, err)
			}
		}
	}
	if len(seen) < 2 {
		t.Fatalf("40 tries gave only one order of the ids: %v", seen)
	}
}
