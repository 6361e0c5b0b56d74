package thinpooltest

import (
	"context"
	"errors"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// TestSharedSectorsCountOnce: a snapshot maps what its origin mapped and
// shares it, so the pool's use counts it once and frees it only with the
// last device that maps it, as a thin pool frees a block.
func TestSharedSectorsCountOnce(t *testing.T) {
	ctx := context.Background()
	p := NewFakePool()
	if err := p.CreateThin(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Write(1, 100); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateSnap(ctx, 2, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Write(2, 10); err != nil {
		t.Fatal(err)
	}
	if got := p.UsedSectors(); got != 110 {
		t.Fatalf("used %d sectors, want 110 (100 shared, 10 the snapshot's own)", got)
	}
	if _, err := p.Activate(ctx, "snap", 2, 1<<20); err != nil {
		t.Fatal(err)
	}
	if st, err := p.ThinStatus(ctx, "snap"); err != nil || st.MappedSectors != 110 || !st.HasMapped {
		t.Fatalf("snapshot's status %+v, %v; want 110 sectors mapped", st, err)
	}
	if err := p.Delete(ctx, 2); !errors.Is(err, thinpool.ErrBusy) {
		t.Fatalf("delete of a mapped device: %v, want ErrBusy", err)
	}
	if err := p.Delete(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := p.UsedSectors(); got != 110 {
		t.Fatalf("used %d sectors once the origin is deleted, want 110: the snapshot still maps them", got)
	}
	if err := p.Deactivate(ctx, "snap"); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := p.UsedSectors(); got != 0 {
		t.Fatalf("used %d sectors with no device left, want 0", got)
	}
	if err := p.Write(2, 1); !errors.Is(err, thinpool.ErrNotFound) {
		t.Fatalf("write to a deleted id: %v, want ErrNotFound", err)
	}
}
