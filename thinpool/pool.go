package thinpool

import (
	"sync"
	"sync/atomic"
	"time"
)

// MaxThinID is the largest thin device id a pool accepts: the kernel's thin
// ids are 24-bit numbers. Every operation taking an id rejects a larger one
// with ErrInvalid before calling the kernel.
const MaxThinID = 0xffffff

// Defaults applied by Open to zero Config fields.
const (
	// DefaultBlockSizeSectors is the pool data block size used when
	// Config.BlockSizeSectors is zero: 128 sectors = 64 KiB.
	DefaultBlockSizeSectors = 128
	// DefaultDataSize is the sparse data file size used when
	// Config.DataSize is zero and no DataDevice is given (100 GiB).
	DefaultDataSize = 100 << 30
	// DefaultMetadataThreshold is Config.MetadataThreshold's default: new
	// devices are refused once 95% of the metadata is used.
	DefaultMetadataThreshold = 95.0
	// DefaultMinFreePercent is the reserve the daemon keeps unless told
	// otherwise (Config.MinFreePercent): 10% of the data and of the
	// metadata, Docker's devicemapper dm.min_free_space default.
	DefaultMinFreePercent = 10.0
	// DefaultNoSpaceTimeout is how long the kernel queues writes on a pool
	// out of data space before failing them, when nothing sets it: the
	// dm_thin_pool module's own default.
	DefaultNoSpaceTimeout = 60 * time.Second
	// DefaultMetadataSize is the sparse metadata file size used when
	// Config.MetadataSize is zero and no MetadataDevice is given (1 GiB).
	DefaultMetadataSize = 1 << 30
)

// Config describes the pool Open creates or reopens.
type Config struct {
	// PoolName is the device-mapper name of the pool, e.g. "flyio-pool".
	PoolName string
	// RootDir holds the loop-backed files "data" and "metadata" of the
	// embedded default pool. Unused when both devices are given.
	RootDir string
	// DataDevice and MetadataDevice name existing block devices to use
	// instead of loop files. Both or neither must be set.
	DataDevice, MetadataDevice string
	// DataSize and MetadataSize are the sizes in bytes of the sparse loop
	// files created on first Open (ignored for existing files/devices).
	DataSize, MetadataSize int64
	// BlockSizeSectors is the pool data block size in 512-byte sectors
	// (default 128 = 64 KiB; must be a multiple of 128 between 128 and
	// 2097152).
	BlockSizeSectors uint32
	// LowWaterMarkBlocks is the free data block count under which the
	// kernel raises a dm event (Watch reports it); 0 means the reserve's
	// data blocks (ReserveBlocks of MinFreePercent), or
	// DefaultLowWaterPercent of the data blocks when there is no reserve.
	LowWaterMarkBlocks uint64
	// MaxDataSize, when positive, lets Grow extend a loop-file pool's data
	// up to this many bytes; 0 leaves the size fixed.
	MaxDataSize int64
	// GrowthReserve is the free space, in bytes, Grow leaves on the
	// filesystem holding the loop files (0 means DefaultGrowthReserve).
	GrowthReserve int64
	// MetadataThreshold is the metadata usage, in percent, from which
	// CreateThin and CreateSnap refuse new devices (0 means
	// DefaultMetadataThreshold).
	MetadataThreshold float64
	// MinFreePercent is the reserve: CreateThin and CreateSnap refuse new
	// devices (ErrBelowReserve) while the free data blocks or the free
	// metadata blocks are fewer than this percent of the pool's (see
	// ReserveBlocks), so that what is left serves the writes of the
	// devices already made. 0 keeps no reserve.
	MinFreePercent float64
	// ReserveSetting names, in a refusal, where the operator changes
	// MinFreePercent (the daemon gives its configuration key). Empty: the
	// refusal names none.
	ReserveSetting string
	// NoSpaceTimeout is how long the kernel queues the writes that find
	// the pool out of data space before failing them (the dm_thin_pool
	// module's no_space_timeout, whole seconds, shared by every pool of
	// the host); Adjust sets it. 0 leaves the kernel's value.
	NoSpaceTimeout time.Duration
}

// Pool is an open thin pool. Its methods are safe for concurrent use.
type Pool struct {
	cfg       Config
	name      string
	ctl       *dmControl
	dev       uint64 // device number of the pool's dm device
	devStr    string // "major:minor" as thin tables name the pool
	metaPath  string // a node of the metadata device, for ThinIDs
	blockSize uint32

	metaSnapMu sync.Mutex // one metadata snapshot at a time
	growMu     sync.Mutex // one table reload at a time
	originMu   keyedMutex // one suspend/create_snap/resume per origin id
	probeSeq   atomic.Uint64
	closed     atomic.Bool
}

// MinFreePercent returns the pool's reserve (Config.MinFreePercent): the
// percent of its data and of its metadata under which it refuses new
// devices.
func (p *Pool) MinFreePercent() float64 { return p.cfg.MinFreePercent }

// ActiveDevice is a device-mapper device whose table is a thin target on
// this pool.
type ActiveDevice struct {
	// Name is the device-mapper name.
	Name string
	// ThinID is the thin id inside the pool the table maps.
	ThinID uint32
	// Sectors is the table length in 512-byte sectors.
	Sectors uint64
	// Major and Minor are the block device numbers (/dev/dm-<Minor>).
	Major, Minor uint32
	// Suspended is true when the device is suspended.
	Suspended bool
}

// PoolMode is the allocation mode the kernel reports for a pool, in
// lowercase: the kernel prints the healthy modes in lowercase and the two
// failed states capitalised ("Fail", "Error"); one case lets a log line,
// a metric label or a JSON field be matched with one spelling.
type PoolMode string

// Pool modes. The first three are the kernel's own words; ModeFail and
// ModeError are its "Fail" and "Error" status lines.
const (
	ModeReadWrite      PoolMode = "rw"
	ModeReadOnly       PoolMode = "ro"
	ModeOutOfDataSpace PoolMode = "out_of_data_space"
	ModeFail           PoolMode = "fail"
	ModeError          PoolMode = "error"
)

// PoolStatus is the parsed thin-pool status line.
type PoolStatus struct {
	// TransactionID is the pool's userspace transaction id.
	TransactionID uint64
	// UsedMetadataBlocks and TotalMetadataBlocks count 4 KiB metadata blocks.
	UsedMetadataBlocks, TotalMetadataBlocks uint64
	// UsedDataBlocks and TotalDataBlocks count data blocks of
	// BlockSizeSectors sectors.
	UsedDataBlocks, TotalDataBlocks uint64
	// BlockSizeSectors is the pool's data block size, from its table.
	BlockSizeSectors uint32
	// HeldMetadataRoot is the block of a reserved metadata snapshot, valid
	// when HasHeldRoot.
	HeldMetadataRoot uint64
	HasHeldRoot      bool
	// Mode is rw, ro, out_of_data_space, fail or error.
	Mode PoolMode
	// DiscardPassdown is true when discards are passed down to the data
	// device; DiscardIgnored when the pool ignores discards.
	DiscardPassdown, DiscardIgnored bool
	// ErrorIfNoSpace is true when IO fails at once when the data space is
	// exhausted; QueueIfNoSpace when such IO waits (for the kernel's
	// no_space_timeout) for space to be freed or added. The kernel turns
	// a queueing pool to ErrorIfNoSpace when that timeout expires, until
	// the pool has space again. Kernels that print neither leave both
	// false.
	ErrorIfNoSpace, QueueIfNoSpace bool
	// NeedsCheck is true when the kernel flagged the metadata for
	// thin_check.
	NeedsCheck bool
	// MetadataLowWatermark is the metadata low-water mark in blocks, when
	// the kernel reports it (0 otherwise).
	MetadataLowWatermark uint64
}

// WritesQueued reports whether writes that need a new block are waiting
// now: the pool is out of data space and queues them.
func (s PoolStatus) WritesQueued() bool { return s.Mode == ModeOutOfDataSpace && s.QueueIfNoSpace }

// WritesFailing reports whether writes that need a new block fail now:
// the pool is out of data space and fails them (loaded that way, or its
// no-space timeout expired).
func (s PoolStatus) WritesFailing() bool { return s.Mode == ModeOutOfDataSpace && s.ErrorIfNoSpace }

// ThinStatus is the parsed status of an active thin device.
type ThinStatus struct {
	// MappedSectors is the number of sectors backed by pool data blocks.
	MappedSectors uint64
	// HighestMappedSector is the last mapped sector, valid when HasMapped.
	HighestMappedSector uint64
	HasMapped           bool
	// Failed is true when the kernel reports the device as failed.
	Failed bool
}
