package thinpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// Deactivate retries DEV_REMOVE while the device is busy, sleeping
// deactivateFirstBackoff, doubling up to deactivateMaxBackoff, for at most
// deactivateAttempts attempts (about 5 s in total).
const (
	deactivateAttempts     = 14
	deactivateFirstBackoff = 10 * time.Millisecond
	deactivateMaxBackoff   = 640 * time.Millisecond
)

func checkID(what string, id uint32) error {
	if id > MaxThinID {
		return fmt.Errorf("%s %d is above the 24-bit maximum %d: %w", what, id, MaxThinID, ErrInvalid)
	}
	return nil
}

func (p *Pool) usable() error {
	if p == nil || p.ctl == nil {
		return fmt.Errorf("thinpool: pool is not open: %w", ErrInvalid)
	}
	if p.closed.Load() {
		return fmt.Errorf("thinpool: pool %q is closed: %w", p.name, ErrInvalid)
	}
	return nil
}

// errf builds the error of an operation on the pool: it names the pool,
// the operation and device, and wraps the typed error (when kind is not
// nil) and the cause.
func (p *Pool) errf(kind error, cause error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	switch {
	case kind != nil && cause != nil:
		return fmt.Errorf("thinpool: pool %q: %s: %w: %w", p.name, what, kind, cause)
	case kind != nil:
		return fmt.Errorf("thinpool: pool %q: %s: %w", p.name, what, kind)
	default:
		return fmt.Errorf("thinpool: pool %q: %s: %w", p.name, what, cause)
	}
}

// fullError returns ErrDataFull or ErrMetadataFull when the pool cannot
// allocate, nil when it can, and an error when it is failed or read-only
// for another reason.
func (p *Pool) fullError() error {
	st, err := p.status(true)
	if err != nil {
		return err
	}
	return st.FullError()
}

// kernelMetadataReserve is how many metadata blocks, out of total, the
// kernel keeps for its own commits: a tenth of the device, at most 4096
// blocks (16 MiB). A commit that leaves fewer free turns the pool
// read-only (status "ro"), and a read-only pool refuses deletes too, until
// its metadata device grows. The switch has also been seen, rarely, to
// fail the pool outright ("Fail", mended only by thin_repair). So no
// create may bring the pool there.
func kernelMetadataReserve(total uint64) uint64 {
	return min(4096, total/10)
}

// createMetadataHeadroom is the metadata blocks one create and its commit
// may take beyond the kernel's reserve: a few at most (the shadowed paths
// of the device trees and of the space map), under one on average; the
// VM test that fills a pool with devices checks each stays under it.
const createMetadataHeadroom = 16

// creatable returns fullError's answer; or ErrMetadataReserve when the
// metadata is at or past Config.MetadataThreshold, or so close to the
// kernel's own reserve (kernelMetadataReserve) that a create could push
// the pool into it: the rest is kept for deletes, which need metadata
// blocks too, so that a pool short of metadata can still be emptied
// instead of turning read-only; or ErrBelowReserve when the free data or
// metadata is under Config.MinFreeSpace, kept for the writes of the
// devices already made. It reads the pool's status once (one
// DM_TABLE_STATUS, without flushing the metadata): the price of every
// create.
func (p *Pool) creatable() error {
	st, err := p.status(true)
	if err != nil {
		return err
	}
	if err := st.FullError(); err != nil {
		return err
	}
	if total := st.TotalMetadataBlocks; total > 0 {
		free := total - min(st.UsedMetadataBlocks, total)
		if kernel := kernelMetadataReserve(total); free <= kernel+createMetadataHeadroom {
			return fmt.Errorf("metadata %d of %d blocks free, within %d blocks of the %d the kernel keeps for its commits (past them the pool turns read-only): %w",
				free, total, createMetadataHeadroom, kernel, ErrMetadataReserve)
		}
		limit := p.cfg.MetadataThreshold
		if used := 100 * float64(st.UsedMetadataBlocks) / float64(total); used >= limit {
			return fmt.Errorf("metadata %.1f%% used (%d of %d blocks), at or past the %v%% threshold for new devices: %w",
				used, st.UsedMetadataBlocks, total, limit, ErrMetadataReserve)
		}
	}
	return st.ReserveError(p.cfg.MinFreeSpace.Value(), p.cfg.ReserveSetting)
}

// FullError classifies a status for callers that saw IO fail: it returns
// ErrDataFull or ErrMetadataFull (both matching ErrPoolFull) when the pool
// cannot allocate, another error when the pool is failed or read-only for
// another reason (needs_check), and nil when it can allocate.
func (st PoolStatus) FullError() error {
	switch {
	case st.Mode == ModeFail || st.Mode == ModeError:
		return fmt.Errorf("pool is in %s mode (metadata needs thin_check/repair)", st.Mode)
	case st.TotalMetadataBlocks > 0 && st.UsedMetadataBlocks >= st.TotalMetadataBlocks:
		return ErrMetadataFull
	case st.Mode == ModeReadOnly && st.NeedsCheck:
		return fmt.Errorf("pool is read-only and flagged needs_check")
	case st.Mode == ModeReadOnly:
		// The kernel goes read-only when it runs out of metadata space.
		return ErrMetadataFull
	case st.Mode == ModeOutOfDataSpace, st.TotalDataBlocks > 0 && st.UsedDataBlocks >= st.TotalDataBlocks:
		return ErrDataFull
	}
	return nil
}

// poolMessage sends msg to the pool and maps its errno for thin id dev.
// The kernel commits the pool's metadata after a message succeeded but
// answers the message whatever the commit did: a failed commit aborts the
// transaction (the change is lost) and turns the pool failed, or read-only
// with needs_check. So a message that succeeded is followed by one status
// read (without a flush), and such a pool makes it an error.
func (p *Pool) poolMessage(msg string) error {
	err := p.ctl.message(p.name, msg)
	if err == nil {
		st, serr := p.status(true)
		if serr == nil && (st.Mode == ModeFail || st.Mode == ModeError || (st.Mode == ModeReadOnly && st.NeedsCheck)) {
			return p.errf(nil, fmt.Errorf("the pool is in %s mode (needs_check %v) after the message: its commit failed and the change is not in the pool's metadata", st.Mode, st.NeedsCheck), "%s", msg)
		}
		return nil
	}
	switch {
	case errors.Is(err, unix.EEXIST):
		return p.errf(ErrExists, err, "%s", msg)
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOENT):
		return p.errf(ErrNotFound, err, "%s", msg)
	case errors.Is(err, unix.EBUSY):
		return p.errf(ErrBusy, err, "%s", msg)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EINVAL):
		if full := p.fullError(); full != nil {
			return p.errf(full, err, "%s", msg)
		}
		if errors.Is(err, unix.ENOSPC) {
			return p.errf(ErrMetadataFull, err, "%s", msg)
		}
	}
	return p.errf(nil, err, "%s", msg)
}

// CreateThin creates a new empty thin device with the given id in the pool
// metadata. It returns ErrExists when the id is taken and ErrDataFull or
// ErrMetadataFull when the pool cannot allocate, ErrMetadataReserve when
// its metadata is past Config.MetadataThreshold, ErrBelowReserve when its
// free space is under Config.MinFreeSpace (nothing is created then).
func (p *Pool) CreateThin(ctx context.Context, id uint32) error {
	if err := p.usable(); err != nil {
		return err
	}
	if err := checkID("thin id", id); err != nil {
		return p.errf(nil, err, "create_thin %d", id)
	}
	if err := p.creatable(); err != nil {
		return p.errf(nil, err, "create_thin %d", id)
	}
	return p.poolMessage(fmt.Sprintf("create_thin %d", id))
}

// CreateSnap creates thin device id as a snapshot of originID. When the
// origin is active it is suspended (IO flushed, a mounted filesystem
// frozen) around the message and always resumed, even on error. It returns
// ErrNotFound when the origin does not exist, ErrExists when id is taken and
// ErrDataFull/ErrMetadataFull when the pool cannot allocate (and
// ErrMetadataReserve and ErrBelowReserve, as CreateThin).
func (p *Pool) CreateSnap(ctx context.Context, id, originID uint32) (err error) {
	if err := p.usable(); err != nil {
		return err
	}
	if err := checkID("thin id", id); err != nil {
		return p.errf(nil, err, "create_snap %d %d", id, originID)
	}
	if err := checkID("origin thin id", originID); err != nil {
		return p.errf(nil, err, "create_snap %d %d", id, originID)
	}
	if err := p.creatable(); err != nil {
		return p.errf(nil, err, "create_snap %d %d", id, originID)
	}
	// Concurrent snapshots of one origin would suspend and resume the
	// same devices under each other (the kernel refuses a second suspend
	// or resume with EINVAL): one at a time per origin.
	unlock := p.originMu.Lock(originID)
	defer unlock()
	names, err := p.activeNamesOf(originID)
	if err != nil {
		return p.errf(nil, err, "create_snap %d %d: find active origin devices", id, originID)
	}
	var suspended []string
	defer func() {
		for _, n := range suspended {
			if _, rerr := p.ctl.resume(n); rerr != nil {
				rerr = p.errf(nil, rerr, "resume origin device %q (thin %d) after create_snap %d", n, originID, id)
				log.G(ctx).WithError(rerr).Error("thinpool: origin left suspended")
				err = errors.Join(err, rerr)
			}
		}
	}()
	for _, n := range names {
		if serr := p.ctl.suspend(n, false); serr != nil {
			if errors.Is(serr, unix.ENXIO) {
				continue // deactivated meanwhile
			}
			return p.errf(nil, serr, "suspend origin device %q (thin %d) for create_snap %d", n, originID, id)
		}
		suspended = append(suspended, n)
	}
	return p.poolMessage(fmt.Sprintf("create_snap %d %d", id, originID))
}

// Delete removes thin device id from the pool metadata, freeing its blocks.
// It returns ErrNotFound when the id is absent and ErrBusy when the device
// is active.
func (p *Pool) Delete(ctx context.Context, id uint32) error {
	if err := p.usable(); err != nil {
		return err
	}
	if err := checkID("thin id", id); err != nil {
		return p.errf(nil, err, "delete %d", id)
	}
	return p.poolMessage(fmt.Sprintf("delete %d", id))
}

// thinUUID is the dm uuid Activate gives a device: it lets activeNamesOf
// find the devices of a thin id with one LIST_DEVICES call. Empty when it
// would not fit the kernel's 128 bytes (the device then has no uuid and is
// found through its table).
func (p *Pool) thinUUID(name string, id uint32) string {
	u := p.uuidPrefix() + strconv.FormatUint(uint64(id), 10) + "-" + name
	if len(u) > 128 {
		return ""
	}
	return u
}

func (p *Pool) uuidPrefix() string { return "thinpool-" + p.name + "-" }

// idFromUUID returns the thin id a uuid made by thinUUID names, ok false
// when the uuid is not one of ours for that device name.
func (p *Pool) idFromUUID(uuid, name string) (uint32, bool) {
	rest, ok := strings.CutPrefix(uuid, p.uuidPrefix())
	if !ok {
		return 0, false
	}
	digits, n, ok := strings.Cut(rest, "-")
	if !ok || n != name {
		return 0, false
	}
	id, err := strconv.ParseUint(digits, 10, 32)
	if err != nil || id > MaxThinID {
		return 0, false
	}
	return uint32(id), true
}

// Activate creates device-mapper device name mapping sizeBytes (rounded up
// to whole sectors) of thin id, and returns its node path (DevicePath(name)).
// It is idempotent: when name is already active on the same id it returns
// the path; when name is active on another id or as another kind of device
// it returns ErrExists. A device of that name without a live table that
// carries the uuid Activate gives name and id (what a process killed
// between creating the device and resuming its table leaves) is finished:
// its table is loaded and resumed. A missing thin id is ErrNotFound. On any
// failure the half-made device is removed.
func (p *Pool) Activate(ctx context.Context, name string, id uint32, sizeBytes int64) (path string, err error) {
	if err := p.usable(); err != nil {
		return "", err
	}
	if err := checkName("device", name); err != nil {
		return "", p.errf(nil, err, "activate thin %d", id)
	}
	if err := checkID("thin id", id); err != nil {
		return "", p.errf(nil, err, "activate %q", name)
	}
	if sizeBytes <= 0 {
		return "", p.errf(ErrInvalid, nil, "activate %q (thin %d): size %d bytes must be positive", name, id, sizeBytes)
	}
	if name == p.name {
		return "", p.errf(ErrExists, nil, "activate thin %d: name %q is the pool itself", id, name)
	}
	sectors := (uint64(sizeBytes) + 511) / 512
	if _, err := p.ctl.create(name, p.thinUUID(name, id)); err != nil {
		if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EEXIST) {
			return "", p.errf(nil, err, "activate %q (thin %d)", name, id)
		}
		existing, finish, aerr := p.alreadyActive(ctx, name, id, sizeBytes, err)
		if !finish {
			return existing, aerr
		}
		// The device is one of ours left without a live table: loading
		// (which replaces any inactive table) and resuming below is what
		// the interrupted Activate had still to do, and can itself be
		// interrupted and redone any number of times.
	}
	defer func() {
		if err != nil {
			if rmErr := p.ctl.remove(name); rmErr != nil && !errors.Is(rmErr, unix.ENXIO) {
				err = errors.Join(err, p.errf(nil, rmErr, "remove half-made device %q", name))
			}
		}
	}()
	table := []dmTarget{{Start: 0, Length: sectors, Type: "thin", Params: p.devStr + " " + strconv.FormatUint(uint64(id), 10)}}
	if err := p.ctl.load(name, table, false); err != nil {
		if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOENT) {
			return "", p.errf(ErrNotFound, err, "activate %q: thin %d is not in the pool", name, id)
		}
		return "", p.errf(nil, err, "activate %q (thin %d): load table", name, id)
	}
	dev, err := p.ctl.resume(name)
	if err != nil {
		return "", p.errf(nil, err, "activate %q (thin %d): resume", name, id)
	}
	path, err = ensureNode(name, dev)
	if err != nil {
		return "", p.errf(nil, err, "activate %q (thin %d)", name, id)
	}
	return path, nil
}

// alreadyActive handles DEV_CREATE refusing name (or its uuid). It returns
// the path when name is already active on id, and finish true (with no
// error) when name is a device of ours for id without a live table, which
// the caller is to load and resume.
func (p *Pool) alreadyActive(ctx context.Context, name string, id uint32, sizeBytes int64, createErr error) (path string, finish bool, err error) {
	targets, info, err := p.ctl.tableStatus(name, true, false)
	if errors.Is(err, unix.ENXIO) {
		// The name is free: the uuid is taken by a device of another name.
		return "", false, p.errf(ErrExists, createErr, "activate %q (thin %d): a device with the same uuid exists", name, id)
	}
	if err != nil {
		return "", false, p.errf(nil, err, "activate %q (thin %d): inspect existing device", name, id)
	}
	if !info.hasLiveTable() {
		// Only a device carrying the uuid this package gives name and id
		// is ours to finish; thinUUID is empty when it would not fit, and
		// such a device cannot be told from another tool's.
		if want := p.thinUUID(name, id); want != "" && info.UUID == want {
			log.G(ctx).WithField("pool", p.name).WithField("device", name).WithField("thin_id", id).
				WithField("inactive_table", info.hasInactiveTbl()).
				Warn("thinpool: finishing the activation of a device left without a live table")
			return "", true, nil
		}
		return "", false, p.errf(ErrExists, createErr, "activate %q (thin %d): name in use by a device without a live table and with uuid %q, not %q",
			name, id, info.UUID, p.thinUUID(name, id))
	}
	if len(targets) == 1 && targets[0].Type == "thin" {
		if t, perr := parseThinTable(targets[0].Params); perr == nil && t.PoolDev == p.devStr && t.ID == id {
			if want := (uint64(sizeBytes) + 511) / 512; targets[0].Length != want {
				log.G(ctx).WithField("pool", p.name).WithField("device", name).WithField("sectors", targets[0].Length).
					WithField("requested_sectors", want).Warn("thinpool: device already active with another size; keeping it")
			}
			if info.suspended() {
				if _, err := p.ctl.resume(name); err != nil {
					return "", false, p.errf(nil, err, "activate %q (thin %d): resume suspended device", name, id)
				}
			}
			path, err := ensureNode(name, info.Dev)
			if err != nil {
				return "", false, p.errf(nil, err, "activate %q (thin %d)", name, id)
			}
			return path, false, nil
		}
	}
	return "", false, p.errf(ErrExists, createErr, "activate %q (thin %d): name in use with table %v", name, id, targets)
}

// Deactivate removes device-mapper device name, retrying with backoff while
// the kernel reports it busy (bounded to about 5 s, or ctx; then ErrBusy). A
// device that is not active is not an error. A device whose table is not a
// thin target of this pool is refused (ErrInvalid).
func (p *Pool) Deactivate(ctx context.Context, name string) error {
	if err := p.usable(); err != nil {
		return err
	}
	if err := checkName("device", name); err != nil {
		return p.errf(nil, err, "deactivate")
	}
	if name == p.name {
		return p.errf(ErrInvalid, nil, "deactivate %q: that is the pool itself", name)
	}
	targets, _, err := p.ctl.tableStatus(name, true, true)
	if errors.Is(err, unix.ENXIO) {
		return removeNodeErr(p, name)
	}
	if err != nil {
		return p.errf(nil, err, "deactivate %q", name)
	}
	if len(targets) > 0 {
		t, perr := parseThinTable(targets[0].Params)
		if len(targets) != 1 || targets[0].Type != "thin" || perr != nil || t.PoolDev != p.devStr {
			return p.errf(ErrInvalid, nil, "deactivate %q: not a thin device of this pool (table %v)", name, targets)
		}
	}
	backoff := deactivateFirstBackoff
	for attempt := 1; ; attempt++ {
		err = p.ctl.remove(name)
		if err == nil || errors.Is(err, unix.ENXIO) {
			return removeNodeErr(p, name)
		}
		if !errors.Is(err, unix.EBUSY) {
			return p.errf(nil, err, "deactivate %q", name)
		}
		if attempt >= deactivateAttempts {
			return p.errf(ErrBusy, err, "deactivate %q: still busy after %d attempts", name, attempt)
		}
		log.G(ctx).WithField("pool", p.name).WithField("device", name).WithField("attempt", attempt).
			Debug("thinpool: device busy, retrying removal")
		select {
		case <-ctx.Done():
			return p.errf(ErrBusy, errors.Join(err, ctx.Err()), "deactivate %q", name)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, deactivateMaxBackoff)
	}
}

func removeNodeErr(p *Pool, name string) error {
	if err := removeNode(name); err != nil {
		return p.errf(nil, err, "deactivate %q", name)
	}
	return nil
}

// IsActive reports whether device-mapper device name exists.
func (p *Pool) IsActive(ctx context.Context, name string) (bool, error) {
	if err := p.usable(); err != nil {
		return false, err
	}
	if err := checkName("device", name); err != nil {
		return false, p.errf(nil, err, "is-active")
	}
	_, err := p.ctl.info(name)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENXIO):
		return false, nil
	}
	return false, p.errf(nil, err, "is-active %q", name)
}

// ThinExists reports whether thin id is in the pool metadata. It probes the
// kernel: a temporary device gets a thin table for id loaded into its
// inactive slot (the kernel refuses it with ENODATA when the id is absent)
// and is removed again whatever happens; nothing is activated or written.
func (p *Pool) ThinExists(ctx context.Context, id uint32) (bool, error) {
	if err := p.usable(); err != nil {
		return false, err
	}
	if err := checkID("thin id", id); err != nil {
		return false, p.errf(nil, err, "probe")
	}
	probe := fmt.Sprintf("%s%d-%d", probePrefix, os.Getpid(), p.probeSeq.Add(1))
	if _, err := p.ctl.create(probe, ""); err != nil {
		return false, p.errf(nil, err, "probe thin %d: create %q", id, probe)
	}
	defer func() {
		for i := 0; i < 50; i++ {
			err := p.ctl.remove(probe)
			if err == nil || errors.Is(err, unix.ENXIO) {
				return
			}
			if !errors.Is(err, unix.EBUSY) {
				log.G(ctx).WithError(err).WithField("pool", p.name).WithField("device", probe).Error("thinpool: probe device left behind")
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	table := []dmTarget{{Start: 0, Length: uint64(p.blockSize), Type: "thin", Params: p.devStr + " " + strconv.FormatUint(uint64(id), 10)}}
	err := p.ctl.load(probe, table, true)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, p.errf(nil, err, "probe thin %d", id)
}

// probePrefix starts the name of every probe device ThinExists makes:
// "thinpool-probe-<pid>-<seq>".
const probePrefix = "thinpool-probe-"

// removeDeadProbes removes the probe devices (ThinExists) of processes that
// are gone: one killed between creating its probe and removing it leaves
// the probe with a thin table in its inactive slot, which holds that thin
// id open in the pool (its delete fails with EBUSY) and the pool itself.
// The probes of live processes (a CLI's) are left alone; so are those of
// this process, unless it is the process that starts the pool (Adjust runs
// before any ThinExists of its own: a probe with its pid is a previous
// process's that had the same pid). A probe that cannot be removed is
// logged.
func (p *Pool) removeDeadProbes(ctx context.Context) error {
	entries, err := p.ctl.list()
	if err != nil {
		return fmt.Errorf("list devices for probes left behind: %w", err)
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name, probePrefix)
		if !ok {
			continue
		}
		digits, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(digits)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if pid != os.Getpid() && !errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
			continue // its process is alive: the probe is in use
		}
		l := log.G(ctx).WithField("pool", p.name).WithField("device", e.Name)
		if err := p.ctl.remove(e.Name); err != nil && !errors.Is(err, unix.ENXIO) {
			l.WithError(err).Error("thinpool: probe device of a process that is gone could not be removed")
			continue
		}
		l.Warn("thinpool: removed the probe device of a process that is gone (killed inside ThinExists)")
	}
	return nil
}

// ThinIDs returns every thin id the pool metadata holds, in increasing
// order. It reserves a metadata snapshot, reads the ids of its
// device-details btree from the metadata device (see thinmeta.go) and
// releases the snapshot, always, all under a host-wide lock
// (MetadataSnapLockFileName) that ThinIDs of other processes wait for, up
// to ctx. A snapshot found held while the lock is free was left by a
// reader that died, and is released. A read-only pool (metadata full)
// refuses messages but changes nothing, so its committed superblock is
// read instead, without the lock.
func (p *Pool) ThinIDs(ctx context.Context) (ids []uint32, err error) {
	if err := p.usable(); err != nil {
		return nil, err
	}
	p.metaSnapMu.Lock()
	defer p.metaSnapMu.Unlock()
	if st, err := p.status(true); err == nil && st.Mode != ModeReadWrite && st.Mode != ModeOutOfDataSpace {
		// A read-only (e.g. metadata full) or failed pool refuses messages,
		// and changes nothing: its committed superblock is current.
		ids, err := readThinIDs(p.metaPath, 0)
		if err != nil {
			return nil, p.errf(nil, err, "list thin ids of %s pool from metadata %s", st.Mode, p.metaPath)
		}
		return ids, nil
	}
	unlock, err := p.lockMetaSnap(ctx)
	if err != nil {
		return nil, p.errf(nil, err, "list thin ids")
	}
	defer unlock()
	err = p.ctl.message(p.name, "reserve_metadata_snap")
	if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EINVAL) {
		// Every reader holds the lock for as long as its snapshot is held,
		// and the lock is ours: the snapshot was left by a reader that
		// died (or by another tool). Drop it and retry.
		log.G(ctx).WithField("pool", p.name).WithField("lock", p.metaSnapLockPath()).
			Warn("thinpool: releasing a metadata snapshot left held")
		_ = p.ctl.message(p.name, "release_metadata_snap")
		err = p.ctl.message(p.name, "reserve_metadata_snap")
	}
	if err != nil {
		return nil, p.errf(nil, err, "list thin ids: reserve_metadata_snap")
	}
	defer func() {
		if rerr := p.ctl.message(p.name, "release_metadata_snap"); rerr != nil {
			err = errors.Join(err, p.errf(nil, rerr, "list thin ids: release_metadata_snap"))
		}
	}()
	st, err := p.status(true)
	if err != nil {
		return nil, p.errf(nil, err, "list thin ids")
	}
	if !st.HasHeldRoot {
		return nil, p.errf(nil, errors.New("status shows no held metadata root after reserve_metadata_snap"), "list thin ids")
	}
	ids, err = readThinIDs(p.metaPath, st.HeldMetadataRoot)
	if err != nil {
		return nil, p.errf(nil, err, "list thin ids from metadata %s", p.metaPath)
	}
	return ids, nil
}

// activeNamesOf returns the names of active devices mapping thin id. Devices
// carrying our uuid are recognised from LIST_DEVICES alone; any other device
// has its table read.
func (p *Pool) activeNamesOf(id uint32) ([]string, error) {
	entries, err := p.ctl.list()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Dev == p.dev {
			continue
		}
		if got, ok := p.idFromUUID(e.UUID, e.Name); ok {
			if got == id {
				names = append(names, e.Name)
			}
			continue
		}
		t, ok, err := p.thinTableOf(e.Name)
		if err != nil {
			return nil, err
		}
		if ok && t.ID == id {
			names = append(names, e.Name)
		}
	}
	return names, nil
}

// thinTableOf returns the thin table of device name when it is a thin
// device of this pool.
func (p *Pool) thinTableOf(name string) (thinTable, bool, error) {
	targets, _, err := p.ctl.tableStatus(name, true, true)
	if errors.Is(err, unix.ENXIO) {
		return thinTable{}, false, nil
	}
	if err != nil {
		return thinTable{}, false, err
	}
	if len(targets) != 1 || targets[0].Type != "thin" {
		return thinTable{}, false, nil
	}
	t, err := parseThinTable(targets[0].Params)
	if err != nil || t.PoolDev != p.devStr {
		return thinTable{}, false, nil
	}
	return t, true, nil
}

// ActiveDevices returns the device-mapper devices whose live table is a
// thin target on this pool, sorted by name. Every device's table is read,
// so devices made by other tools are included.
func (p *Pool) ActiveDevices(ctx context.Context) ([]ActiveDevice, error) {
	if err := p.usable(); err != nil {
		return nil, err
	}
	entries, err := p.ctl.list()
	if err != nil {
		return nil, p.errf(nil, err, "list active devices")
	}
	var out []ActiveDevice
	for _, e := range entries {
		if e.Dev == p.dev {
			continue
		}
		targets, info, err := p.ctl.tableStatus(e.Name, true, true)
		if errors.Is(err, unix.ENXIO) {
			continue
		}
		if err != nil {
			return nil, p.errf(nil, err, "list active devices: table of %q", e.Name)
		}
		if len(targets) != 1 || targets[0].Type != "thin" {
			continue
		}
		t, err := parseThinTable(targets[0].Params)
		if err != nil || t.PoolDev != p.devStr {
			continue
		}
		out = append(out, ActiveDevice{
			Name: e.Name, ThinID: t.ID, Sectors: targets[0].Length,
			Major: unix.Major(info.Dev), Minor: unix.Minor(info.Dev), Suspended: info.suspended(),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Status returns the pool's parsed status line (after the kernel commits
// outstanding metadata changes).
func (p *Pool) Status(ctx context.Context) (PoolStatus, error) { return p.usableStatus(false) }

// Peek returns the pool's parsed status line as the kernel holds it,
// without asking it to commit outstanding metadata changes first (a
// superblock write and its flushes). Blocks allocated since the last
// commit count as used; blocks freed since then (by discards: a device's
// deletion commits at once) still count as used until the next commit.
// So the data and metadata used it reports are never below what Status
// would report: a pool under a threshold by Peek is under it.
func (p *Pool) Peek(ctx context.Context) (PoolStatus, error) { return p.usableStatus(true) }

// usableStatus is status for the exported readers: refused on a pool
// that is not usable, and its error named for the pool.
func (p *Pool) usableStatus(noflush bool) (PoolStatus, error) {
	if err := p.usable(); err != nil {
		return PoolStatus{}, err
	}
	st, err := p.status(noflush)
	if err != nil {
		return PoolStatus{}, p.errf(nil, err, "status")
	}
	return st, nil
}

func (p *Pool) status(noflush bool) (PoolStatus, error) {
	targets, _, err := p.ctl.tableStatus(p.name, false, noflush)
	if err != nil {
		return PoolStatus{}, err
	}
	if len(targets) != 1 || targets[0].Type != "thin-pool" {
		return PoolStatus{}, fmt.Errorf("device %q is not a thin pool (status %v)", p.name, targets)
	}
	st, err := parsePoolStatus(targets[0].Params)
	if err != nil {
		return PoolStatus{}, err
	}
	st.BlockSizeSectors = p.blockSize
	return st, nil
}

// ThinStatus returns the parsed status of active thin device name; it
// returns ErrNotFound when the device is not active and ErrInvalid when it
// is not a thin device.
func (p *Pool) ThinStatus(ctx context.Context, name string) (ThinStatus, error) {
	if err := p.usable(); err != nil {
		return ThinStatus{}, err
	}
	if err := checkName("device", name); err != nil {
		return ThinStatus{}, p.errf(nil, err, "thin status")
	}
	targets, info, err := p.ctl.tableStatus(name, false, false)
	if errors.Is(err, unix.ENXIO) {
		return ThinStatus{}, p.errf(ErrNotFound, err, "thin status %q", name)
	}
	if err != nil {
		return ThinStatus{}, p.errf(nil, err, "thin status %q", name)
	}
	if len(targets) != 1 || targets[0].Type != "thin" {
		return ThinStatus{}, p.errf(ErrInvalid, nil, "thin status %q: not a thin device (status %v)", name, targets)
	}
	st, err := parseThinStatus(targets[0].Params)
	if err != nil {
		return ThinStatus{}, p.errf(nil, err, "thin status %q", name)
	}
	st.OpenCount = int(info.OpenCount)
	return st, nil
}
