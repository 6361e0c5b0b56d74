package snapshotter

import (
	"fmt"
	"strings"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// DefaultBaseImageSize is the virtual size of the base device, and so of
// every snapshot: 10 GiB.
const DefaultBaseImageSize = 10 << 30

// minBaseImageSize leaves room for a filesystem's own structures (an ext4
// journal alone takes several MiB) and a little data.
const minBaseImageSize = 16 << 20

// Config tunes a Snapshotter. It is the devices' part of the daemon's
// [pool] section: the toml tags are the keys. The zero value is valid
// for New: ext4 with the thinpool package's default mkfs options, 10 GiB
// devices, removal that deletes the device before Remove returns,
// unexplained devices quarantined but kept.
type Config struct {
	// BaseImageSize is the virtual size of the base device and every
	// snapshot (thin: only written blocks use pool space).
	BaseImageSize conf.Size `toml:"base_image_size"`
	// FSType is the filesystem made on the base device: "ext4" (default) or
	// "xfs". A pool whose base is already formatted keeps its filesystem.
	FSType string `toml:"fs_type"`
	// MkfsOptions are passed to thinpool.Mkfs; empty means its defaults.
	MkfsOptions []string `toml:"mkfs_options"`
	// AsyncRemove makes Remove only forget the snapshot and leaves the
	// device's deletion to Cleanup (containerd's garbage collector); when
	// false Remove deletes the device before it returns.
	AsyncRemove bool `toml:"async_remove"`
	// DiscardBlocks discards a removed device's blocks before deleting it
	// (thinpool.Pool.Discard), so that a loop-file pool gives them back to
	// the filesystem under it, or a pool on SSDs trims them; deleting
	// alone frees them in the pool only.
	DiscardBlocks bool `toml:"discard_blocks"`
	// DeleteUnknownDevices makes start-up reconciliation delete thin devices
	// that nothing in the database explains (their ids stay quarantined).
	// When false they are quarantined and left in the pool untouched.
	DeleteUnknownDevices bool `toml:"delete_unknown_devices"`
}

// DefaultConfig returns the daemon's defaults of the devices' keys: ext4,
// 10 GiB devices, deletion left to Cleanup, blocks discarded before it.
func DefaultConfig() Config {
	return Config{BaseImageSize: DefaultBaseImageSize, FSType: string(thinpool.FSExt4), AsyncRemove: true, DiscardBlocks: true}
}

// Validate checks every key and returns one error per bad value, joined,
// each naming the key as the [pool] section spells it.
func (c Config) Validate() error {
	var p conf.Problems
	if c.BaseImageSize < minBaseImageSize || c.BaseImageSize%512 != 0 {
		p.Add("pool.base_image_size", "must be a multiple of 512 bytes and at least 16MiB, got %s", c.BaseImageSize)
	}
	switch c.FSType {
	case string(thinpool.FSExt4), string(thinpool.FSXFS):
	default:
		p.Add("pool.fs_type", "must be %q or %q, got %q", thinpool.FSExt4, thinpool.FSXFS, c.FSType)
	}
	for i, o := range c.MkfsOptions {
		if strings.TrimSpace(o) == "" {
			p.Add(fmt.Sprintf("pool.mkfs_options[%d]", i), "must not be empty")
		}
	}
	return p.Err()
}

// withDefaults fills the zero fields that have no meaning of their own
// (the filesystem, the size) from DefaultConfig, so that a caller may give
// only what it changes.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.FSType == "" {
		c.FSType = d.FSType
	}
	if c.BaseImageSize == 0 {
		c.BaseImageSize = d.BaseImageSize
	}
	return c
}
