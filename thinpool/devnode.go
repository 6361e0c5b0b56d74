package thinpool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// MapperDir is where device nodes for device-mapper names live.
const MapperDir = "/dev/mapper"

// DevicePath returns /dev/mapper/<name>, the node path of device-mapper
// device name. The package makes the node itself (no udev) when it
// activates a device, and removes it when it deactivates it.
func DevicePath(name string) string { return filepath.Join(MapperDir, name) }

// ensureNode makes DevicePath(name) a block node for dev unless it already
// resolves to that device (a node udev or an earlier call made, or a
// symlink to /dev/dm-N). A node for another device number (left over from
// before a reboot) is replaced.
func ensureNode(name string, dev uint64) (string, error) {
	path := DevicePath(name)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == dev {
			return path, nil
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("replace stale node %s: %w", path, err)
		}
	} else if !errors.Is(err, unix.ENOENT) {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	if err := os.MkdirAll(MapperDir, 0o755); err != nil {
		return "", fmt.Errorf("make %s: %w", MapperDir, err)
	}
	err := unix.Mknod(path, unix.S_IFBLK|0o600, int(dev))
	if errors.Is(err, unix.EEXIST) {
		// Someone (udev) made it between our stat and mknod: accept it
		// if it is the right device.
		if unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == dev {
			return path, nil
		}
	}
	if err != nil {
		return "", fmt.Errorf("mknod %s (%d:%d): %w", path, unix.Major(dev), unix.Minor(dev), err)
	}
	return path, nil
}

// removeNode deletes DevicePath(name); absence is not an error.
func removeNode(name string) error {
	if err := os.Remove(DevicePath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove node %s: %w", DevicePath(name), err)
	}
	return nil
}

// devString formats a device number as the kernel prints it in tables.
func devString(dev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
}

// blockDevNumber returns the device number of block device path.
func blockDevNumber(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("%s is not a block device: %w", path, ErrInvalid)
	}
	return st.Rdev, nil
}

// removeStaleNodes removes the block nodes in MapperDir named with prefix
// that no device-mapper device of that name and device number stands
// behind: what a deactivation cut between the kernel's removal and the
// node's leaves, naming a device number a later device may take. A name
// the kernel still has is asked again just before its node goes, so a
// device activated meanwhile keeps its node. Symlinks (udev's) are left
// alone. It returns the names whose nodes it removed.
func (p *Pool) removeStaleNodes(prefix string) ([]string, error) {
	entries, err := os.ReadDir(MapperDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", MapperDir, err)
	}
	var (
		removed []string
		errs    []error
	)
	for _, e := range entries {
		name := e.Name()
		if len(name) <= len(prefix) || name[:len(prefix)] != prefix || e.Type()&os.ModeType != os.ModeDevice {
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(MapperDir, name), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
			continue
		}
		info, err := p.ctl.info(name)
		switch {
		case err == nil && info.Dev == st.Rdev:
			continue
		case err != nil && !errors.Is(err, unix.ENXIO):
			errs = append(errs, fmt.Errorf("stale node %s: %w", DevicePath(name), err))
			continue
		}
		if err := removeNode(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
