package thinpool

import (
	"errors"
	"fmt"
)

// Typed errors. Callers match them with errors.Is; the returned errors wrap
// them with the pool, the device or thin id and the operation.
var (
	// ErrPoolFull means the pool cannot allocate: its data or its metadata
	// space is exhausted. ErrDataFull and ErrMetadataFull both match it.
	ErrPoolFull = errors.New("thin pool full")
	// ErrDataFull means the pool's data device has no free block (the pool
	// is in out_of_data_space mode, or the kernel answered ENOSPC).
	ErrDataFull = fmt.Errorf("data space exhausted: %w", ErrPoolFull)
	// ErrMetadataFull means the pool's metadata device has no free block
	// (the pool went read-only for lack of metadata space).
	ErrMetadataFull = fmt.Errorf("metadata space exhausted: %w", ErrPoolFull)
	// ErrMetadataReserve means a new device was refused because the pool's
	// metadata is at or past Config.MetadataThreshold, or near the blocks
	// the kernel keeps for its own commits; deletes still work. It matches
	// ErrMetadataFull and ErrPoolFull.
	ErrMetadataReserve = fmt.Errorf("down to the reserve kept for deletes: %w", ErrMetadataFull)
	// ErrBelowReserve means a new device was refused because the pool's
	// free data or metadata is under Config.MinFreeSpace: the rest is
	// kept for the writes of the devices already made. It matches
	// ErrPoolFull.
	ErrBelowReserve = fmt.Errorf("new devices refused under the reserve: %w", ErrPoolFull)
	// ErrNotFound means the thin id is not in the pool's metadata, or the
	// named device-mapper device does not exist.
	ErrNotFound = errors.New("not found")
	// ErrNotActive means the kernel has no active pool of the name
	// (OpenActive): no device-mapper device of that name, or one without
	// a live table.
	ErrNotActive = errors.New("pool not active")
	// ErrExists means the thin id or the device-mapper name is already taken.
	ErrExists = errors.New("already exists")
	// ErrBusy means the device is open or mounted (EBUSY from the kernel).
	ErrBusy = errors.New("device busy")
	// ErrInvalid means an argument broke a rule checked before any kernel
	// call (thin id above MaxThinID, empty or too long name, bad size).
	ErrInvalid = errors.New("invalid argument")
)
