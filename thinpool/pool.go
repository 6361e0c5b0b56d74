package thinpool

import (
	"context"
	"fmt"
	"os"
	"sync"
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
	// kernel raises a dm event (0 = no event).
	LowWaterMarkBlocks uint64
}

// Pool is an open thin pool. Its methods are safe for concurrent use.
type Pool struct {
	cfg     Config
	name    string
	dataDev string // block device path of the data device
	metaDev string // block device path of the metadata device
	loops   []*os.File

	mu     sync.Mutex
	closed bool
}

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

// PoolMode is the allocation mode the kernel reports for a pool.
type PoolMode string

// Pool modes, as printed in the kernel's thin-pool status line.
const (
	ModeReadWrite      PoolMode = "rw"
	ModeReadOnly       PoolMode = "ro"
	ModeOutOfDataSpace PoolMode = "out_of_data_space"
	ModeFail           PoolMode = "Fail"
	ModeError          PoolMode = "Error"
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
	// Mode is rw, ro, out_of_data_space, Fail or Error.
	Mode PoolMode
	// DiscardPassdown is true when discards are passed down to the data
	// device; DiscardIgnored when the pool ignores discards.
	DiscardPassdown, DiscardIgnored bool
	// ErrorIfNoSpace is true when IO fails at once when the data space is
	// exhausted instead of being queued.
	ErrorIfNoSpace bool
	// NeedsCheck is true when the kernel flagged the metadata for
	// thin_check.
	NeedsCheck bool
	// MetadataLowWatermark is the metadata low-water mark in blocks, when
	// the kernel reports it (0 otherwise).
	MetadataLowWatermark uint64
}

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

// Open creates the pool described by cfg when it is absent and reuses it
// when it is present: an active pool of that name is reused as is (daemon
// restart); when the pool is gone but its files are present (reboot), the
// loop devices are reattached and the table reloaded, keeping the metadata.
// A fresh metadata file has its first 4 KiB zeroed so the kernel formats it.
func Open(ctx context.Context, cfg Config) (*Pool, error) {
	return nil, fmt.Errorf("thinpool: open pool %q: %w", cfg.PoolName, ErrNotImplemented)
}

// Close releases the package's handles. It never removes the pool or any
// thin device: the pool survives for the next Open.
func (p *Pool) Close() error { return nil }

// Name returns the device-mapper name of the pool.
func (p *Pool) Name() string { return p.name }

// CreateThin creates a new empty thin device with the given id in the pool
// metadata. It returns ErrExists when the id is taken and ErrDataFull or
// ErrMetadataFull when the pool cannot allocate.
func (p *Pool) CreateThin(ctx context.Context, id uint32) error {
	return fmt.Errorf("thinpool: pool %q: create_thin %d: %w", p.name, id, ErrNotImplemented)
}

// CreateSnap creates thin device id as a snapshot of originID. When the
// origin is active it is suspended around the message and always resumed,
// even on error. It returns ErrNotFound when the origin does not exist and
// ErrExists when id is taken.
func (p *Pool) CreateSnap(ctx context.Context, id, originID uint32) error {
	return fmt.Errorf("thinpool: pool %q: create_snap %d from %d: %w", p.name, id, originID, ErrNotImplemented)
}

// Delete removes thin device id from the pool metadata, freeing its blocks.
// It returns ErrNotFound when the id is absent and ErrBusy when the device
// is active.
func (p *Pool) Delete(ctx context.Context, id uint32) error {
	return fmt.Errorf("thinpool: pool %q: delete %d: %w", p.name, id, ErrNotImplemented)
}

// Activate creates device-mapper device name mapping sizeBytes (rounded up
// to whole sectors) of thin id, and returns its node path (DevicePath(name)).
// It is idempotent: when name is already active on the same id it returns
// the path; when name is active on another id it returns ErrExists.
func (p *Pool) Activate(ctx context.Context, name string, id uint32, sizeBytes int64) (string, error) {
	return "", fmt.Errorf("thinpool: pool %q: activate %q (thin %d): %w", p.name, name, id, ErrNotImplemented)
}

// Deactivate removes device-mapper device name, retrying with backoff while
// the kernel reports it busy (bounded; then ErrBusy). A device that is not
// active is not an error.
func (p *Pool) Deactivate(ctx context.Context, name string) error {
	return fmt.Errorf("thinpool: pool %q: deactivate %q: %w", p.name, name, ErrNotImplemented)
}

// IsActive reports whether device-mapper device name exists.
func (p *Pool) IsActive(ctx context.Context, name string) (bool, error) {
	return false, fmt.Errorf("thinpool: pool %q: is-active %q: %w", p.name, name, ErrNotImplemented)
}

// ThinExists reports whether thin id is in the pool metadata. It has no
// lasting side effect.
func (p *Pool) ThinExists(ctx context.Context, id uint32) (bool, error) {
	return false, fmt.Errorf("thinpool: pool %q: probe thin %d: %w", p.name, id, ErrNotImplemented)
}

// ThinIDs returns every thin id the pool metadata holds, in increasing order.
func (p *Pool) ThinIDs(ctx context.Context) ([]uint32, error) {
	return nil, fmt.Errorf("thinpool: pool %q: list thin ids: %w", p.name, ErrNotImplemented)
}

// ActiveDevices returns the device-mapper devices whose table is a thin
// target on this pool, sorted by name.
func (p *Pool) ActiveDevices(ctx context.Context) ([]ActiveDevice, error) {
	return nil, fmt.Errorf("thinpool: pool %q: list active devices: %w", p.name, ErrNotImplemented)
}

// Status returns the pool's parsed status line.
func (p *Pool) Status(ctx context.Context) (PoolStatus, error) {
	return PoolStatus{}, fmt.Errorf("thinpool: pool %q: status: %w", p.name, ErrNotImplemented)
}

// ThinStatus returns the parsed status of active thin device name; it
// returns ErrNotFound when the device is not active.
func (p *Pool) ThinStatus(ctx context.Context, name string) (ThinStatus, error) {
	return ThinStatus{}, fmt.Errorf("thinpool: pool %q: thin status %q: %w", p.name, name, ErrNotImplemented)
}
