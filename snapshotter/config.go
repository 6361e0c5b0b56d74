package snapshotter

import (
	"fmt"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// DefaultBaseImageSize is the virtual size of the base device, and so of
// every snapshot, when Config.BaseImageSize is 0: 10 GiB.
const DefaultBaseImageSize int64 = 10 << 30

// Config tunes a Snapshotter. The zero value is valid: ext4 with the
// thinpool package's default mkfs options, 10 GiB devices, removal that
// deletes the device before Remove returns, unexplained devices
// quarantined but kept.
type Config struct {
	// FSType is the filesystem made on the base device: "ext4" (default) or
	// "xfs". A pool whose base is already formatted keeps its filesystem.
	FSType string
	// MkfsOptions are passed to thinpool.Mkfs; nil means its defaults.
	MkfsOptions []string
	// BaseImageSize is the virtual size in bytes of the base device and
	// every snapshot (thin: only written blocks use pool space).
	BaseImageSize int64
	// AsyncRemove makes Remove only forget the snapshot and leaves the
	// device's deletion to Cleanup (containerd's garbage collector); when
	// false Remove deletes the device before it returns.
	AsyncRemove bool
	// DeleteUnknownDevices makes start-up reconciliation delete thin devices
	// that nothing in the database explains (their ids stay quarantined).
	// When false they are quarantined and left in the pool untouched.
	DeleteUnknownDevices bool
}

func (c Config) withDefaults() (Config, error) {
	if c.FSType == "" {
		c.FSType = string(thinpool.FSExt4)
	}
	switch c.FSType {
	case string(thinpool.FSExt4), string(thinpool.FSXFS):
	default:
		return c, fmt.Errorf("snapshotter config: fs type %q: must be ext4 or xfs", c.FSType)
	}
	if c.BaseImageSize == 0 {
		c.BaseImageSize = DefaultBaseImageSize
	}
	if c.BaseImageSize < 16<<20 || c.BaseImageSize%512 != 0 {
		return c, fmt.Errorf("snapshotter config: base image size %d: must be at least 16 MiB and a multiple of 512", c.BaseImageSize)
	}
	return c, nil
}
