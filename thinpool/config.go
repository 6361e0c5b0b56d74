package thinpool

import (
	"regexp"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// Defaults of Config (DefaultConfig), also applied by Open to the zero
// fields that have no meaning of their own.
const (
	// DefaultPoolName is the device-mapper name of the daemon's pool.
	DefaultPoolName = "flyio-pool"
	// DefaultBlockSize is the pool data block size: 64 KiB (128 sectors),
	// the kernel's smallest, which keeps snapshots' copy-on-write cheap.
	DefaultBlockSize = 64 << 10
	// DefaultDataSize is the sparse data file size of a loop-file pool
	// (100 GiB).
	DefaultDataSize = 100 << 30
	// DefaultMetadataSize is the sparse metadata file size of a loop-file
	// pool (1 GiB).
	DefaultMetadataSize = 1 << 30
	// DefaultGrowthReserve is the free space growth leaves on the
	// filesystem holding the loop files (1 GiB): the host keeps room for
	// its logs and the daemon's database and downloads.
	DefaultGrowthReserve = 1 << 30
	// DefaultMetadataThreshold is Config.MetadataThreshold's default: new
	// devices are refused once 95% of the metadata is used.
	DefaultMetadataThreshold = 95.0
	// DefaultMinFreePercent is the reserve (Config.MinFreeSpace): 10% of
	// the data and of the metadata, Docker's devicemapper
	// dm.min_free_space default.
	DefaultMinFreePercent = 10.0
	// DefaultNoSpaceTimeout is how long the kernel queues writes on a pool
	// out of data space before failing them: the dm_thin_pool module's own
	// default.
	DefaultNoSpaceTimeout = 60 * time.Second
)

// Keys of the [pool] section that other packages' messages name.
const (
	// KeyMinFreeSpace is the key of the reserve, which refusals name so
	// the operator knows what to change.
	KeyMinFreeSpace = "pool.min_free_space"
)

// Limits enforced by Validate.
const (
	// The kernel's data block size is a multiple of 128 sectors between
	// 128 and 2097152 sectors.
	minBlockSize = 64 << 10
	maxBlockSize = 1 << 30
	// The kernel's thin-provisioning guide sizes metadata at 48 bytes per
	// data block, rounded up to 2 MiB when smaller, and lvm2 refuses
	// less: a fresh pool formats its superblock, two space maps and the
	// mapping trees into 4 KiB metadata blocks, which a few blocks cannot
	// hold for long. 2 MiB is the floor.
	minMetadataSize = 2 << 20
	// The kernel uses at most 255 * 2^14 * 8 sectors (15.9 GiB) of a thin
	// pool's metadata device.
	maxMetadataSize = 16 << 30
	minDataSize     = 16 << 20
	// DM_NAME_LEN is 128 including the NUL; leave room for device suffixes.
	maxPoolName = 96
	// A reserve over half the pool would leave images less room than the
	// containers' writes.
	maxMinFreeSpace = 50
	// The kernel queues a full pool's writes at most this long here: a
	// writer hung longer than an hour is an outage, not a wait.
	maxNoSpaceTimeout = time.Hour
)

var poolNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// Config describes the pool Open creates or reopens. It is the pool's part
// of the daemon's [pool] section: the toml tags are the keys.
type Config struct {
	// Name is the device-mapper name of the pool, e.g. "flyio-pool".
	Name string `toml:"name"`
	// RootDir holds the loop-backed files "data" and "metadata" of a
	// loop-file pool, and for any pool the lock file of its metadata
	// snapshot (MetadataSnapLockFileName). It may be empty when both
	// devices are given: the lock file is then kept under
	// /dev/mapper/.thinpool.
	RootDir string `toml:"root_dir"`
	// DataDevice and MetadataDevice name existing block devices to use
	// instead of loop files. Both or neither must be set.
	DataDevice     string `toml:"data_device"`
	MetadataDevice string `toml:"metadata_device"`
	// DataSize and MetadataSize are the sizes of the sparse loop files
	// created on first Open (ignored for existing files and devices).
	DataSize     conf.Size `toml:"data_size"`
	MetadataSize conf.Size `toml:"metadata_size"`
	// BlockSize is the pool's data block size: a multiple of 64 KiB
	// between 64 KiB and 1 GiB. Only applies when the pool is created.
	BlockSize conf.Size `toml:"block_size"`
	// LowWaterMark is the free data block count under which the kernel
	// raises a dm event (Watch reports it); 0 means the reserve's data
	// blocks (ReserveBlocks of MinFreeSpace), or DefaultLowWaterPercent of
	// the data blocks when there is no reserve.
	LowWaterMark uint64 `toml:"low_water_mark"`
	// MaxDataSize, when positive, lets Grow extend a loop-file pool's data
	// up to this size; 0 leaves the size fixed.
	MaxDataSize conf.Size `toml:"max_data_size"`
	// GrowthReserve is the free space Grow leaves on the filesystem
	// holding the loop files.
	GrowthReserve conf.Size `toml:"growth_reserve"`
	// MetadataThreshold is the metadata usage, in percent, from which
	// CreateThin and CreateSnap refuse new devices, keeping the rest for
	// deletes. Whatever its value, they also stop a few blocks short of
	// the share the kernel keeps for itself (a tenth of the metadata, at
	// most 16 MiB), past which the pool turns read-only.
	MetadataThreshold float64 `toml:"metadata_threshold"`
	// MinFreeSpace is the reserve: CreateThin and CreateSnap refuse new
	// devices (ErrBelowReserve) while the free data blocks or the free
	// metadata blocks are fewer than this share of the pool's (see
	// ReserveBlocks), so that what is left serves the writes of the
	// devices already made. 0% keeps no reserve.
	MinFreeSpace conf.Percent `toml:"min_free_space"`
	// ReserveSetting names, in a refusal, where the operator changes
	// MinFreeSpace (the daemon gives KeyMinFreeSpace). Empty: the refusal
	// names none.
	ReserveSetting string `toml:"-"`
	// NoSpaceTimeout is how long the kernel queues the writes that find
	// the pool out of data space before failing them (the dm_thin_pool
	// module's no_space_timeout, whole seconds, shared by every pool of
	// the host); Adjust sets it.
	NoSpaceTimeout conf.Duration `toml:"no_space_timeout"`
}

// DefaultConfig returns the [pool] defaults of the pool's keys, with
// RootDir empty (the daemon derives it from its root directory).
func DefaultConfig() Config {
	return Config{
		Name:              DefaultPoolName,
		DataSize:          DefaultDataSize,
		MetadataSize:      DefaultMetadataSize,
		BlockSize:         DefaultBlockSize,
		GrowthReserve:     DefaultGrowthReserve,
		MetadataThreshold: DefaultMetadataThreshold,
		MinFreeSpace:      conf.Pct(DefaultMinFreePercent),
		NoSpaceTimeout:    conf.D(DefaultNoSpaceTimeout),
	}
}

// withDefaults fills the zero fields whose zero means nothing (sizes, the
// metadata threshold, the no-space timeout) from DefaultConfig, so that a
// caller may describe a pool by its name and directory alone. Zero
// LowWaterMark, MaxDataSize and MinFreeSpace keep their meaning.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	fill := func(v *conf.Size, def conf.Size) {
		if *v == 0 {
			*v = def
		}
	}
	if c.DataDevice == "" {
		fill(&c.DataSize, d.DataSize)
		fill(&c.MetadataSize, d.MetadataSize)
	}
	fill(&c.BlockSize, d.BlockSize)
	fill(&c.GrowthReserve, d.GrowthReserve)
	if c.MetadataThreshold == 0 {
		c.MetadataThreshold = d.MetadataThreshold
	}
	if c.NoSpaceTimeout.Duration == 0 {
		c.NoSpaceTimeout = d.NoSpaceTimeout
	}
	return c
}

// blockSizeSectors is BlockSize in 512-byte sectors, as the kernel's table
// takes it.
func (c Config) blockSizeSectors() uint32 { return uint32(c.BlockSize / 512) }

// Validate checks every key and returns one error per bad value, joined,
// each naming the key as the [pool] section spells it ("pool.block_size:
// must be ..., got ..."). The root directory may be empty when both
// devices are given.
func (c Config) Validate() error {
	var p conf.Problems
	switch {
	case c.Name == "":
		p.Add("pool.name", "must not be empty")
	case len(c.Name) > maxPoolName || !poolNameRE.MatchString(c.Name):
		p.Add("pool.name", "must be at most %d characters of letters, digits and ._+- starting with a letter or digit (a device-mapper name), got %q", maxPoolName, c.Name)
	}
	p.AbsPath("pool.root_dir", c.RootDir, c.DataDevice != "" && c.MetadataDevice != "")
	p.AbsPath("pool.data_device", c.DataDevice, true)
	p.AbsPath("pool.metadata_device", c.MetadataDevice, true)
	if (c.DataDevice == "") != (c.MetadataDevice == "") {
		if c.DataDevice == "" {
			p.Add("pool.data_device", "must be set when pool.metadata_device is set (give both devices or neither)")
		} else {
			p.Add("pool.metadata_device", "must be set when pool.data_device is set (give both devices or neither)")
		}
	}
	if c.DataDevice != "" && c.DataDevice == c.MetadataDevice {
		p.Add("pool.metadata_device", "must differ from pool.data_device, both are %q", c.DataDevice)
	}
	blockOK := c.BlockSize >= minBlockSize && c.BlockSize <= maxBlockSize && c.BlockSize%minBlockSize == 0
	if !blockOK {
		p.Add("pool.block_size", "must be a multiple of 128 sectors (64 KiB) between 64 KiB and 1 GiB, got %s", c.BlockSize)
	}
	if c.DataDevice == "" {
		switch {
		case c.DataSize < minDataSize || c.DataSize%512 != 0:
			p.Add("pool.data_size", "must be a multiple of 512 bytes and at least 16MiB, got %s", c.DataSize)
		case blockOK && c.DataSize < c.BlockSize:
			p.Add("pool.data_size", "must hold at least one data block of pool.block_size %s, got %s", c.BlockSize, c.DataSize)
		}
		if c.MetadataSize < minMetadataSize || c.MetadataSize > maxMetadataSize || c.MetadataSize%4096 != 0 {
			p.Add("pool.metadata_size", "must be a multiple of 4KiB between 2MiB and 16GiB (the kernel uses at most 15.9GiB), got %s", c.MetadataSize)
		}
		if blockOK && c.DataSize >= minDataSize {
			if blocks := uint64(c.DataSize / c.BlockSize); c.LowWaterMark >= blocks {
				p.Add("pool.low_water_mark", "must be fewer than the pool's %d data blocks (pool.data_size / pool.block_size), got %d", blocks, c.LowWaterMark)
			}
		}
		if c.MaxDataSize != 0 && (c.MaxDataSize < c.DataSize || c.MaxDataSize%512 != 0) {
			p.Add("pool.max_data_size", "must be 0 (no growth) or a multiple of 512 bytes at least pool.data_size %s, got %s", c.DataSize, c.MaxDataSize)
		}
		if c.GrowthReserve < 0 {
			p.Add("pool.growth_reserve", "must not be negative, got %s", c.GrowthReserve)
		}
	} else if c.MaxDataSize != 0 {
		p.Add("pool.max_data_size", "must be 0 when pool.data_device is set (only a loop-file pool grows), got %s", c.MaxDataSize)
	}
	if !(c.MetadataThreshold > 0 && c.MetadataThreshold <= 100) {
		p.Add("pool.metadata_threshold", "must be a percent above 0 and at most 100, got %v", c.MetadataThreshold)
	}
	if v := c.MinFreeSpace.Value(); v < 0 || v > maxMinFreeSpace {
		p.Add(KeyMinFreeSpace, "must be between 0%% (no reserve) and %s, got %s", conf.Pct(maxMinFreeSpace), c.MinFreeSpace)
	}
	if t := c.NoSpaceTimeout.Duration; t < time.Second || t > maxNoSpaceTimeout || t%time.Second != 0 {
		p.Add("pool.no_space_timeout", "must be whole seconds between 1s and %s (the kernel counts seconds; 0, waiting forever, would hang every writer of a full pool), got %q",
			maxNoSpaceTimeout, c.NoSpaceTimeout.String())
	}
	return p.Err()
}
