package thinpool

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// FSType is a filesystem Mkfs can make.
type FSType string

// Supported filesystems.
const (
	FSExt4 FSType = "ext4"
	FSXFS  FSType = "xfs"
)

// DefaultExt4Options are the mkfs.ext4 options used when Mkfs gets none: no
// discard of the fresh thin device (it is already unmapped) and eager inode
// table and journal initialisation, so no background writer touches a
// snapshot's origin later.
var DefaultExt4Options = []string{"-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"}

// DefaultXFSOptions are the mkfs.xfs options used when Mkfs gets none: no
// discard of the fresh thin device.
var DefaultXFSOptions = []string{"-K"}

// Mkfs makes a filesystem of type fs on devPath by running mkfs.ext4 or
// mkfs.xfs. opts replace the defaults (DefaultExt4Options,
// DefaultXFSOptions) when non-nil; the force flag is always added. The
// tool's output is included in the error.
func Mkfs(ctx context.Context, devPath string, fs FSType, opts []string) error {
	var bin string
	var args []string
	switch fs {
	case FSExt4, "":
		bin = "mkfs.ext4"
		if opts == nil {
			opts = DefaultExt4Options
		}
		args = append([]string{"-F", "-q"}, opts...)
	case FSXFS:
		bin = "mkfs.xfs"
		if opts == nil {
			opts = DefaultXFSOptions
		}
		args = append([]string{"-f", "-q"}, opts...)
	default:
		return fmt.Errorf("thinpool: mkfs %s: filesystem %q: %w (want ext4 or xfs)", devPath, fs, ErrInvalid)
	}
	if !filepath.IsAbs(devPath) {
		return fmt.Errorf("thinpool: mkfs: device path %q must be absolute: %w", devPath, ErrInvalid)
	}
	args = append(args, devPath)
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("thinpool: mkfs %s on %s (%s %v): %w: %s", fs, devPath, bin, args, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// Format makes a filesystem of type fs on the active thin device at
// devPath (Mkfs, with opts), then mounts it once to empty its root:
// lost+found is removed and the root made 0755, so that a snapshot of the
// device starts as the empty directory containerd expects. The mount point
// is fixed per pool, so that ReleaseFormat finds what a crash left mounted
// there.
func (p *Pool) Format(ctx context.Context, devPath string, fs FSType, opts []string) error {
	if fs == "" {
		fs = FSExt4
	}
	if err := Mkfs(ctx, devPath, fs, opts); err != nil {
		return err
	}
	if err := emptyRoot(devPath, string(fs), p.formatDir()); err != nil {
		return fmt.Errorf("thinpool: pool %q: %w", p.name, err)
	}
	return nil
}

// ReleaseFormat detaches whatever a Format cut short by a crash left
// mounted on the pool's mount point, and removes the mount point, so
// that the device under it can be deactivated. Nothing there is not an
// error.
func (p *Pool) ReleaseFormat() {
	dir := p.formatDir()
	_ = unix.Unmount(dir, unix.MNT_DETACH)
	_ = os.Remove(dir)
}

// formatDir is where Format mounts the device it formats.
func (p *Pool) formatDir() string {
	return filepath.Join(os.TempDir(), "flyio-snapshotter-base-"+p.name)
}

// emptyRoot mounts the fresh filesystem on path at dir, removes lost+found
// and makes the root 0755.
func emptyRoot(path, fsType, dir string) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mount %s to empty its root: %w", path, err)
	}
	defer os.Remove(dir)
	if err := unix.Mount(path, dir, fsType, 0, ""); err != nil {
		return fmt.Errorf("mount %s (%s) on %s to empty its root: %w", path, fsType, dir, err)
	}
	defer func() {
		if uerr := unix.Unmount(dir, 0); uerr != nil && err == nil {
			err = fmt.Errorf("unmount %s from %s: %w", path, dir, uerr)
		}
	}()
	if err := os.Remove(filepath.Join(dir, "lost+found")); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove lost+found on %s: %w", path, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("chmod root of %s: %w", path, err)
	}
	return nil
}

// MountOptions returns the mount options for a thin device holding fs:
// "ro" when readOnly, and for xfs "nouuid" (every snapshot of an xfs origin
// carries the same filesystem UUID, which xfs otherwise refuses to mount
// twice).
func MountOptions(fs FSType, readOnly bool) []string {
	var o []string
	if readOnly {
		o = append(o, "ro")
	}
	if fs == FSXFS {
		o = append(o, "nouuid")
	}
	return o
}
