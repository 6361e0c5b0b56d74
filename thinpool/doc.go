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
// by a device-mapper name (Activate, Deactivate, IsActive, ThinStatus).
// Format makes a filesystem on an active device (Mkfs) with an empty root.
// The package never chooses names or ids: that is the caller's bookkeeping.
//
// Choices worth knowing:
//   - The pool table carries skip_block_zeroing and not error_if_no_space
//     (see poolFeatures): first writes cost one write, and on a full pool
//     the writes that need a new block wait for Config.NoSpaceTimeout (the
//     kernel's no_space_timeout, which Adjust sets) for space to be freed
//     or added before they fail with ENOSPC. PoolStatus.WritesQueued says
//     when they wait.
//   - Loop devices are attached with LO_FLAGS_AUTOCLEAR: removing the pool
//     detaches them, as a reboot would.
//   - Activate gives each device the dm uuid "thinpool-<pool>-<id>-<name>"
//     (when it fits in 128 bytes), so finding the active devices of a thin
//     id (CreateSnap's suspend of an active origin) takes one LIST_DEVICES
//     call; devices without it are recognised by their table.
//   - ThinIDs reads the ids from a kernel metadata snapshot with a small
//     reader of the on-disk btree (thinmeta.go) rather than forking
//     thin_ls/thin_dump, which are not always installed.
//   - ThinExists probes with a temporary device whose inactive table maps
//     the id: the kernel refuses the table when the id is absent.
//   - The table's low-water mark defaults to DefaultLowWaterPercent of the
//     data blocks; Watch waits for the kernel's events with DM_DEV_WAIT on
//     the pool's event counter (no dmeventd), and also reports a pool it
//     finds at or under the mark (at its start, and while the pool stays
//     there), since the kernel raises that event once per crossing; Grow
//     extends a loop-file pool online (file, synced; LOOP_SET_CAPACITY;
//     table reload) within Config.MaxDataSize and the filesystem's free
//     space less Config.GrowthReserve, and Open extends a data file found
//     shorter than the metadata records when no block in use lies past
//     its end. Adjust, run once by the pool's owner, resumes a pool or
//     thin device a killed process left suspended, reloads a mark the live
//     table does not have and warns when the loop files could outgrow their
//     filesystem (Backing).
//   - CreateThin and CreateSnap refuse new devices once the metadata is
//     Config.MetadataThreshold used, or is a few blocks from the share the
//     kernel keeps for its commits (ErrMetadataReserve either way), keeping
//     the rest for deletes so the pool never turns read-only for lack of
//     it.
//     They also refuse them while the free data or metadata is under
//     Config.MinFreeSpace (ErrBelowReserve): the reserve is left for the
//     writes of the devices already made, and the default low-water mark
//     is the reserve's edge, so the owner hears of it when refusals begin.
//     The check reads the status line the create reads anyway: it costs no
//     extra ioctl. After a create or delete message the status is read once
//     more (no flush): the kernel answers a message whose commit failed as
//     a success, and only the pool's mode (fail, or ro with needs_check)
//     tells.
//
// Errors callers can act on are matched with errors.Is: ErrPoolFull (wrapped
// by ErrDataFull, ErrBelowReserve and ErrMetadataFull, itself wrapped by
// ErrMetadataReserve),
// ErrNotFound, ErrExists and ErrBusy.
// Every message names the pool and the device or thin id involved.
package thinpool
