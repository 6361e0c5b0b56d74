//go:build dm

package thinpool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// TestMetadataSurvivesFullFilesystem: the filesystem holding a loop-file
// pool fills up (downloads, logs, the data file's own blocks). The
// pool's metadata commits write blocks of the metadata file never written
// before; in a sparse file each needs the filesystem to allocate it, and a
// failed metadata write turns the pool read-only with needs_check, every
// device refused until thin_repair. The metadata file holds its blocks
// from its creation, so devices are still made and the pool stays rw.
func TestMetadataSurvivesFullFilesystem(t *testing.T) {
	ctx := context.Background()
	mnt := scratch.Dir(t, "fullfs-")
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=24m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	cfg := Config{Name: "tp-fullfs", RootDir: filepath.Join(mnt, "pool"), DataSize: conf.Size(64 * mib),
		MetadataSize: conf.Size(8 * mib), NoSpaceTimeout: conf.D(testNoSpaceTimeout)}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(mnt, "filler")
	t.Cleanup(func() {
		os.Remove(filler)
		destroyPool(t, cfg)
	})
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("filling the filesystem: %v", err)
			}
			break
		}
	}
	f.Close()
	for id := uint32(1); id <= 300; id++ {
		if err := p.CreateThin(ctx, id); err != nil {
			st, _ := p.Status(ctx)
			t.Fatalf("create_thin %d on a pool whose filesystem is full: %v (pool mode %s, needs_check %v)", id, err, st.Mode, st.NeedsCheck)
		}
	}
	st, err := p.Status(ctx)
	if err != nil || st.Mode != ModeReadWrite || st.NeedsCheck {
		t.Fatalf("pool after 300 creates on a full filesystem: mode %s, needs_check %v, %v; want rw", st.Mode, st.NeedsCheck, err)
	}
}
