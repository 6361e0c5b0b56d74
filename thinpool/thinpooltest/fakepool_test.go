package thinpooltest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
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

// TestFilesFollowTheDevices: in a pool that keeps files, a snapshot starts
// with its origin's files and then goes its own way, Format empties a
// device, and Delete takes its files with it.
func TestFilesFollowTheDevices(t *testing.T) {
	ctx := context.Background()
	p, err := NewFakePoolAt(filepath.Join(t.TempDir(), "pool"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CreateThin(ctx, 1); err != nil {
		t.Fatal(err)
	}
	path, err := p.Activate(ctx, "base", 1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := p.MappedDir(path)
	if err != nil || !p.Mapped(path) {
		t.Fatalf("files of the mapped base: %q, %v (mapped %v)", dir, err, p.Mapped(path))
	}
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "f"), []byte("origin"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateSnap(ctx, 2, 1); err != nil {
		t.Fatal(err)
	}
	snap, err := p.ThinDir(2)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(snap, "etc", "f")); err != nil || string(b) != "origin" {
		t.Fatalf("the snapshot's copy of the origin's file: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(snap, "etc", "f"), []byte("snapshot"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc", "f")); string(b) != "origin" {
		t.Fatalf("a write to the snapshot changed its origin: %q", b)
	}
	if err := p.Format(ctx, path, thinpool.FSExt4, nil); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("formatted device holds %v (%v), want an empty root", ents, err)
	}
	if err := p.Deactivate(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.MappedDir(path); !errors.Is(err, thinpool.ErrNotFound) || p.Mapped(path) {
		t.Fatalf("files at an unmapped path: %v, want ErrNotFound", err)
	}
	if err := p.Delete(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(snap); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a deleted device's files: %v, want gone", err)
	}
	if _, err := p.ThinDir(2); !errors.Is(err, thinpool.ErrNotFound) {
		t.Fatalf("files of a deleted id: %v, want ErrNotFound", err)
	}
}
