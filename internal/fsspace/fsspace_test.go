package fsspace

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestBytesCountsFragments: a filesystem's block counts are in fragments
// (f_frsize), as df reads them, not in its transfer size (f_bsize) where
// the two differ; without a fragment size the block size is the unit.
func TestBytesCountsFragments(t *testing.T) {
	fs := unix.Statfs_t{Bsize: 65536, Frsize: 4096, Blocks: 1000, Bavail: 250}
	if total, avail := Bytes(&fs); total != 4096000 || avail != 1024000 {
		t.Errorf("statfs of 1000 fragments of 4 KiB (transfer size 64 KiB), 250 available: total %d, available %d; want 4096000 and 1024000", total, avail)
	}
	fs.Frsize = 0
	if total, avail := Bytes(&fs); total != 65536000 || avail != 16384000 {
		t.Errorf("statfs without a fragment size: total %d, available %d; want 65536000 and 16384000", total, avail)
	}
}

// TestBytesOfRealFilesystem: the figures of a mounted filesystem are
// read, and no more is available than there is.
func TestBytesOfRealFilesystem(t *testing.T) {
	var fs unix.Statfs_t
	if err := unix.Statfs(t.TempDir(), &fs); err != nil {
		t.Fatal(err)
	}
	total, avail := Bytes(&fs)
	if total == 0 || avail > total {
		t.Errorf("statfs of the test's directory: total %d, available %d", total, avail)
	}
}
