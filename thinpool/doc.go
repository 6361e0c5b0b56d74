// Package thinpool drives a device-mapper thin pool through the kernel's
// ioctl interface on /dev/mapper/control, in pure Go (no dmsetup, no udev,
// no losetup).
//
// A Pool is either the embedded default (two sparse files under
// Config.RootDir, attached to loop devices by this package) or a pair of
// existing block devices (Config.DataDevice and Config.MetadataDevice).
// Open creates the pool when it is absent and reuses or reloads it when it is
// present, so the same call serves a first start, a daemon restart (pool still
// active) and a reboot (pool gone, files kept, metadata preserved).
//
// Thin devices are addressed by a 24-bit thin id inside the pool
// (CreateThin, CreateSnap, Delete, ThinExists, ThinIDs) and, once activated,
// by a device-mapper name (Activate, Deactivate, IsActive, ThinStatus). The
// package never chooses names or ids: that is the caller's bookkeeping.
//
// Errors callers can act on are matched with errors.Is: ErrPoolFull (wrapped
// by ErrDataFull and ErrMetadataFull), ErrNotFound, ErrExists and ErrBusy.
// Every message names the pool and the device or thin id involved.
package thinpool
