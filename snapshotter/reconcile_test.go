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
