package thinpool

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBackingOvercommitted: loop files overcommit their filesystem when what
// they may still claim (virtual size less what they hold) is more than it
// has free; a pool on block devices never does.
func TestBackingOvercommitted(t *testing.T) {
	for _, c := range []struct {
		b    Backing
		want bool
	}{
		{Backing{Loop: true, FSFree: 50 << 30, Virtual: 101 << 30, Allocated: 1 << 30}, true},   // the default 100 GiB files on 50 GiB free
		{Backing{Loop: true, FSFree: 50 << 30, Virtual: 101 << 30, Allocated: 60 << 30}, false}, // 41 GiB still to claim
		{Backing{Loop: true, FSFree: 0, Virtual: 4 << 20, Allocated: 8 << 20}, false},           // fully allocated
		{Backing{FSFree: 0, Virtual: 0}, false},
	} {
		if got := c.b.Overcommitted(); got != c.want {
			t.Errorf("%+v: Overcommitted = %v, want %v (unbacked %d)", c.b, got, c.want, c.b.Unbacked())
		}
	}
}

// TestBackingCountsFragments: a filesystem's block counts are in fragments
// (f_frsize), as df reads them, not in its transfer size (f_bsize) where
// the two differ (FUSE filesystems give both): the free space growth
// takes from must not be read as sixteen times what it is.
func TestBackingCountsFragments(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{DataFileName, MetadataFileName} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	real := statfs
	t.Cleanup(func() { statfs = real })
	frsize := int64(4096)
	// fakeStatfs: the filesystem of dir is 1000 fragments of 4 KiB, 250 of
	// them available, with a 64 KiB transfer size.
	statfs = func(path string, fs *unix.Statfs_t) error {
		if path != dir {
			return real(path, fs)
		}
		*fs = unix.Statfs_t{Bsize: 65536, Frsize: frsize, Blocks: 1000, Bavail: 250}
		return nil
	}
	p := &Pool{cfg: Config{Name: "test", RootDir: dir}, name: "test", ctl: &dmControl{fd: -1}}
	b, err := p.Backing(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if b.DataAllocated != 0 {
		t.Errorf("Backing of an empty data file: %d bytes of data allocated, want 0", b.DataAllocated)
	}
	if b.FSFree != 250*4096 || b.FSSize != 1000*4096 {
		t.Errorf("Backing of 1000 fragments of 4 KiB, 250 available (transfer size 64 KiB): free %d, size %d; want %d and %d",
			b.FSFree, b.FSSize, 250*4096, 1000*4096)
	}
	frsize = 0 // not given: the block size is the unit
	if b, err = p.Backing(context.Background()); err != nil || b.FSSize != 1000*65536 {
		t.Errorf("Backing without a fragment size: size %d, %v; want %d", b.FSSize, err, 1000*65536)
	}
}

// TestBackingDataRoom: the pool data a loop-file pool's filesystem can
// still back is what it has free and the data file's blocks the pool does
// not use; a pool on block devices has none to count.
func TestBackingDataRoom(t *testing.T) {
	for _, c := range []struct {
		b    Backing
		used uint64
		want uint64
	}{
		{Backing{Loop: true, FSFree: 5 << 30, GrowthReserve: 1 << 30, DataAllocated: 10 << 30}, 10 << 30, 5 << 30},
		{Backing{Loop: true, FSFree: 5 << 30, GrowthReserve: 1 << 30, DataAllocated: 10 << 30}, 7 << 30, 8 << 30}, // 3 GiB of deleted devices' blocks
		{Backing{Loop: true, FSFree: 5 << 30, GrowthReserve: 1 << 30, DataAllocated: 2 << 30}, 3 << 30, 5 << 30},  // partly written blocks
		{Backing{Loop: true}, 0, 0},
		{Backing{}, 0, 0},
	} {
		if got := c.b.DataRoom(c.used); got != c.want {
			t.Errorf("%+v with %d bytes used: DataRoom = %d, want %d", c.b, c.used, got, c.want)
		}
	}
}
