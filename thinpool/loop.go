package thinpool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// loopDevPath is the node of loop device n.
func loopDevPath(n int) string { return fmt.Sprintf("/dev/loop%d", n) }

// attachLoop attaches file to a free loop device with the LOOP_CTL_GET_FREE
// and LOOP_CONFIGURE ioctls (LOOP_SET_FD + LOOP_SET_STATUS64 on kernels
// without LOOP_CONFIGURE), with LO_FLAGS_AUTOCLEAR: the loop device detaches
// itself when its last user (the pool table) closes it, so removing the pool
// leaves no loop device behind. The returned file is the open loop device;
// the caller keeps it open until the pool table holds the device.
//
// An existing loop device already backed by the same file (same device and
// inode) is reused instead.
func attachLoop(file string) (*os.File, error) {
	backing, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open loop backing file: %w", err)
	}
	defer backing.Close()
	var bst unix.Stat_t
	if err := unix.Fstat(int(backing.Fd()), &bst); err != nil {
		return nil, fmt.Errorf("stat %s: %w", file, err)
	}
	if lf, err := findLoop(bst.Dev, bst.Ino); err == nil && lf != nil {
		return lf, nil
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/loop-control: %w", err)
	}
	defer ctl.Close()
	for attempt := 0; attempt < 20; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		lf, err := openLoopNode(n)
		if err != nil {
			return nil, err
		}
		err = configureLoop(lf, backing, file)
		if err == nil {
			return lf, nil
		}
		lf.Close()
		if errors.Is(err, unix.EBUSY) {
			continue // another process took this loop device first
		}
		return nil, fmt.Errorf("attach %s to %s: %w", file, loopDevPath(n), err)
	}
	return nil, fmt.Errorf("attach %s: every free loop device was taken before we could configure it", file)
}

// openLoopNode opens /dev/loopN, making the node (major 7) when devtmpfs
// has not.
func openLoopNode(n int) (*os.File, error) {
	path := loopDevPath(n)
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		if mkErr := unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); mkErr != nil && !errors.Is(mkErr, unix.EEXIST) {
			return nil, fmt.Errorf("mknod %s: %w", path, mkErr)
		}
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return f, nil
}

func configureLoop(lf, backing *os.File, file string) error {
	var info unix.LoopInfo64
	info.Flags = unix.LO_FLAGS_AUTOCLEAR
	name := file
	if len(name) >= len(info.File_name) {
		name = name[len(name)-len(info.File_name)+1:]
	}
	copy(info.File_name[:], name)
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Info: info}
	err := unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
	if err == nil || !(errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY)) {
		return err
	}
	// Kernel older than 5.8: two-step attach.
	if err := unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_SET_FD, int(backing.Fd())); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(int(lf.Fd()), &info); err != nil {
		_ = unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_CLR_FD, 0)
		return fmt.Errorf("LOOP_SET_STATUS64: %w", err)
	}
	return nil
}

// findLoop returns an open loop device whose backing file is (dev, ino),
// or nil when none is attached.
func findLoop(dev, ino uint64) (*os.File, error) {
	matches, _ := filepath.Glob("/sys/block/loop*")
	for _, m := range matches {
		n := 0
		if _, err := fmt.Sscanf(filepath.Base(m), "loop%d", &n); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(m, "loop")); err != nil {
			continue // not attached
		}
		lf, err := os.OpenFile(loopDevPath(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(int(lf.Fd()))
		if err == nil && info.Device == dev && info.Inode == ino {
			return lf, nil
		}
		lf.Close()
	}
	return nil, nil
}

// loopBackingFile returns the backing file of the loop device with number
// dev, or "" when dev is not a loop device.
func loopBackingFile(dev uint64) string {
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
