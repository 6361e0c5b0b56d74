package thinpool

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/keyed"
)

// MaxThinID is the largest thin device id a pool accepts: the kernel's thin
// ids are 24-bit numbers. Every operation taking an id rejects a larger one
// with ErrInvalid before calling the kernel.
const MaxThinID = 0xffffff

// Pool is an open thin pool. Its methods are safe for concurrent use.
type Pool struct {
	cfg       Config
	name      string
	ctl       *dmControl
	dev       uint64 // device number of the pool's dm device
	devStr    string // "major:minor" as thin tables name the pool
	metaPath  string // a node of the metadata device, for ThinIDs
	blockSize uint32

	metaSnapMu sync.Mutex          // one metadata snapshot at a time
	growMu     sync.Mutex          // one table reload at a time
	originMu   keyed.Mutex[uint32] // one suspend/create_snap/resume per origin id
	probeSeq   atomic.Uint64
	// lowWaterRecheck replaces LowWaterRecheckInterval in Watch when
	// positive (tests).
	lowWaterRecheck time.Duration
	closed          atomic.Bool
}

// MinFreePercent returns the pool's reserve (Config.MinFreeSpace): the
// percent of its data and of its metadata under which it refuses new
// devices.
func (p *Pool) MinFreePercent() float64 { return p.cfg.MinFreeSpace.Value() }

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
	// OpenCount is how many opens of the device are held now: a mount, a
	// VM given its path as a disk, any process reading it.
	OpenCount int
}
