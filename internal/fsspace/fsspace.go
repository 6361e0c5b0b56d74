// Package fsspace turns what statfs(2) says of a filesystem into bytes,
// the one reading of its block counts that every package reporting a
// host filesystem's size or free space shares. It imports nothing of the
// project, so any package may use it.
package fsspace

import "golang.org/x/sys/unix"

// Bytes returns the size of the filesystem fs describes and the bytes of
// it available to an unprivileged process (f_bavail: the blocks reserved
// for root are not free to the daemon either). The block counts are in
// fragments (f_frsize), as df reads them; f_bsize is the size of an
// efficient transfer, the same on most filesystems but larger on some,
// and is the unit only where a filesystem gives no fragment size.
func Bytes(fs *unix.Statfs_t) (total, avail uint64) {
	unit := uint64(fs.Frsize)
	if unit == 0 {
		unit = uint64(fs.Bsize)
	}
	return fs.Blocks * unit, fs.Bavail * unit
}
