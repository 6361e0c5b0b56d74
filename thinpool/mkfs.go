package thinpool

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
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
