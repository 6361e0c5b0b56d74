package thinpool

import (
	"context"
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Discard gives back the blocks active thin device name maps. A
// BLKDISCARD over the whole device unmaps them; the pool frees those no
// other thin device shares (a snapshot's origin keeps its own), and a pool
// that passes discards down (its default) discards them on its data device
// too, so a loop-file pool's file gives them back to the filesystem under
// it. Deleting a thin id frees its blocks in the pool only: the loop file
// keeps them allocated. The device is opened exclusively, so one mounted or
// opened exclusively elsewhere is refused with ErrBusy and its data left as
// it is; a plain open elsewhere (a VM's disk) is not seen: the caller must
// know nobody holds it (a deactivation the kernel allowed tells). A pool
// that ignores discards gives an error matching errors.ErrUnsupported.
func (p *Pool) Discard(ctx context.Context, name string) error {
	if err := p.usable(); err != nil {
		return err
	}
	if err := checkName("device", name); err != nil {
		return p.errf(nil, err, "discard")
	}
	path := DevicePath(name)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.EBUSY):
		return p.errf(ErrBusy, err, "discard %q: open %s", name, path)
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO):
		return p.errf(ErrNotFound, err, "discard %q: open %s", name, path)
	case err != nil:
		return p.errf(nil, err, "discard %q: open %s", name, path)
	}
	defer unix.Close(fd)
	size, err := fdSize(fd)
	if err != nil {
		return p.errf(nil, err, "discard %q: size of %s", name, path)
	}
	span := [2]uint64{0, size}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKDISCARD, uintptr(unsafe.Pointer(&span))); errno != 0 {
		if errno == unix.EOPNOTSUPP {
			return p.errf(errors.ErrUnsupported, errno, "discard %q: the pool ignores discards", name)
		}
		return p.errf(nil, errno, "discard %q: %d bytes", name, size)
	}
	return nil
}
