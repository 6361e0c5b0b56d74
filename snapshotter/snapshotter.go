package snapshotter

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/filters"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/keyed"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// Snapshotter is containerd's snapshots.Snapshotter and snapshots.Cleaner
// over a thin pool. It is safe for concurrent use. It does not own the
// database or the pool: Close leaves both open.
type Snapshotter struct {
	db   *metadata.DB
	pool DevicePool
	cfg  Config

	baseMu sync.Mutex
	base   *ThinDevice // set once the base device is formatted

	// reclaiming serialises the reclaims of one thin id (see reclaim).
	reclaiming keyed.Mutex[uint32]
	// mapping serialises, per thin id, a commit's unmapping and record
	// change with the calls that map an active or view snapshot's device
	// (Mounts, Usage): without it one of them could read the record as
	// active just before the commit and map the committed device again,
	// writable (see current).
	mapping keyed.Mutex[uint32]

	closed atomic.Bool

	// hook, when set (by tests only), is called at named points between the
	// steps of an operation; an error wrapping errSimulatedCrash makes the
	// operation stop there without undoing anything, as a crash would.
	hook func(step string) error
}

// errSimulatedCrash marks a test hook's stop: no rollback is attempted.
var errSimulatedCrash = errors.New("simulated crash")

var (
	_ snapshots.Snapshotter = (*Snapshotter)(nil)
	_ snapshots.Cleaner     = (*Snapshotter)(nil)
)

// New returns a Snapshotter on pool (the daemon's *thinpool.Pool) with its
// records in db, after reconciling the database with the pool (the package
// doc says how). db must have been opened read-write (migrated to include
// 0004_snapshotter).
func New(ctx context.Context, db *metadata.DB, pool DevicePool, cfg Config) (*Snapshotter, error) {
	if db == nil || pool == nil {
		return nil, fmt.Errorf("new snapshotter: database and pool are required: %w", errdefs.ErrInvalidArgument)
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new snapshotter: invalid config: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	s := &Snapshotter{db: db, pool: pool, cfg: cfg}
	if err := s.reconcile(ctx); err != nil {
		return nil, fmt.Errorf("new snapshotter on pool %s: reconcile: %w", pool.Name(), err)
	}
	return s, nil
}

func (s *Snapshotter) step(name string) error {
	if s.hook == nil {
		return nil
	}
	return s.hook(name)
}

func (s *Snapshotter) reads() Records { return ReadRecords(s.db) }

func (s *Snapshotter) withTx(ctx context.Context, fn func(q Records) error) error {
	return s.db.WithTx(ctx, func(tx *sql.Tx) error { return fn(RecordsTx(tx)) })
}

// keyspace is the one namespace every record is kept under (Records
// writes and matches it as the empty string in SQL) and the namespace thin
// id candidates derive from. Like containerd's built-in snapshotters, this
// one ignores the request's namespace: containerd's metadata store
// already makes every key it sends unique per namespace ("<ns>/<n>/<key>"),
// and its garbage collector calls Walk, Remove and Cleanup with no
// namespace at all, so keys scoped by the request's namespace could never
// be reclaimed.
const keyspace = ""

// open checks the snapshotter is open.
func (s *Snapshotter) open() error {
	if s.closed.Load() {
		return fmt.Errorf("snapshotter on pool %s is closed: %w", s.pool.Name(), errdefs.ErrFailedPrecondition)
	}
	return nil
}

func nowNs() int64 { return time.Now().UTC().UnixNano() }

func kindOf(k string) snapshots.Kind {
	switch k {
	case SnapKindActive:
		return snapshots.KindActive
	case SnapKindView:
		return snapshots.KindView
	case SnapKindCommitted:
		return snapshots.KindCommitted
	}
	return snapshots.KindUnknown
}

// InfoOf is containerd's view of snapshot record r (what Stat and Walk
// return).
func InfoOf(r CDSnapshot) snapshots.Info {
	return snapshots.Info{
		Kind:    kindOf(r.Kind),
		Name:    r.Key,
		Parent:  r.ParentKey,
		Labels:  r.Labels,
		Created: time.Unix(0, r.CreatedNs).UTC(),
		Updated: time.Unix(0, r.UpdatedNs).UTC(),
	}
}

// withoutEmpty returns the labels of m that have a value: as in
// containerd's own snapshotters (and Update here), a label given with an
// empty value is no label. m itself is left alone.
func withoutEmpty(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := maps.Clone(m)
	maps.DeleteFunc(out, func(_, v string) bool { return v == "" })
	return out
}

func validateLabels(m map[string]string) error {
	for k, v := range m {
		if err := labels.Validate(k, v); err != nil {
			return fmt.Errorf("label %q: %w", k, err)
		}
	}
	return nil
}

func (s *Snapshotter) get(ctx context.Context, key string) (CDSnapshot, error) {
	r, ok, err := s.reads().Snapshot(ctx, key)
	if err != nil {
		return r, err
	}
	if !ok {
		return r, fmt.Errorf("snapshot %q: %w", key, errdefs.ErrNotFound)
	}
	return r, nil
}

// Stat returns the info of the snapshot key (one keyspace, see keyspace).
func (s *Snapshotter) Stat(ctx context.Context, key string) (snapshots.Info, error) {
	err := s.open()
	if err != nil {
		return snapshots.Info{}, err
	}
	r, err := s.get(ctx, key)
	if err != nil {
		return snapshots.Info{}, err
	}
	return InfoOf(r), nil
}

// Update changes the labels of snapshot info.Name: all of them when no
// fieldpaths are given or "labels" is one of them, or the single labels
// named "labels.<key>" (an empty or absent value deletes the label). Any
// other fieldpath is an invalid argument.
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (snapshots.Info, error) {
	err := s.open()
	if err != nil {
		return snapshots.Info{}, err
	}
	var out snapshots.Info
	err = s.withTx(ctx, func(q Records) error {
		r, ok, err := q.Snapshot(ctx, info.Name)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("update snapshot %q: %w", info.Name, errdefs.ErrNotFound)
		}
		updated := maps.Clone(r.Labels)
		if len(fieldpaths) == 0 {
			updated = maps.Clone(info.Labels)
		}
		for _, fp := range fieldpaths {
			if k, ok := strings.CutPrefix(fp, "labels."); ok {
				if updated == nil {
					updated = map[string]string{}
				}
				if v := info.Labels[k]; v != "" {
					updated[k] = v
				} else {
					delete(updated, k)
				}
				continue
			}
			if fp == "labels" {
				updated = maps.Clone(info.Labels)
				continue
			}
			return fmt.Errorf("update snapshot %q: cannot update field %q (only labels and labels.<key>): %w", info.Name, fp, errdefs.ErrInvalidArgument)
		}
		maps.DeleteFunc(updated, func(_, v string) bool { return v == "" })
		if err := validateLabels(updated); err != nil {
			return fmt.Errorf("update snapshot %q: %w", info.Name, err)
		}
		now := nowNs()
		if err := q.updateSnapshotLabels(ctx, r.ID, updated, now); err != nil {
			return err
		}
		r.Labels = updated
		if len(r.Labels) == 0 {
			r.Labels = nil
		}
		r.UpdatedNs = now
		out = InfoOf(r)
		return nil
	})
	return out, err
}

// Usage returns the bytes the snapshot key maps beyond its parent: for a
// committed snapshot as recorded at commit, for an active or view snapshot
// read from the pool now. Inodes are not counted (0).
func (s *Snapshotter) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	err := s.open()
	if err != nil {
		return snapshots.Usage{}, err
	}
	r, err := s.get(ctx, key)
	if err != nil {
		return snapshots.Usage{}, err
	}
	size := r.SizeBytes
	if r.Kind != SnapKindCommitted {
		unlock := s.mapping.Lock(r.DeviceID)
		if r, err = s.current(ctx, r, "usage"); err == nil {
			size, err = s.mappedBytes(ctx, r)
		}
		unlock()
		if err != nil {
			return snapshots.Usage{}, fmt.Errorf("usage of snapshot %q: %w", key, err)
		}
	}
	if r.ParentID != 0 {
		p, ok, err := s.reads().snapshotByID(ctx, r.ParentID)
		if err != nil {
			return snapshots.Usage{}, err
		}
		if ok {
			size -= p.SizeBytes
		}
	}
	return snapshots.Usage{Size: max(size, 0)}, nil
}

// HeldOpen reports whether the device of snapshot key is held open now
// (a mount, or a VM or process given its path): something outside the
// daemon uses it, which no record says. A device that is not active is
// not held. A missing snapshot is an error matching errdefs.ErrNotFound.
func (s *Snapshotter) HeldOpen(ctx context.Context, key string) (bool, error) {
	if err := s.open(); err != nil {
		return false, err
	}
	r, err := s.get(ctx, key)
	if err != nil {
		return false, err
	}
	st, err := s.pool.ThinStatus(ctx, r.DeviceName)
	if errors.Is(err, thinpool.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("snapshot %q: %w", key, err)
	}
	return st.OpenCount > 0, nil
}

// mappedBytes reads the mapped size of r's device, activating it if needed.
func (s *Snapshotter) mappedBytes(ctx context.Context, r CDSnapshot) (int64, error) {
	st, err := s.pool.ThinStatus(ctx, r.DeviceName)
	if err != nil {
		dev, ok, derr := s.reads().thinDevice(ctx, r.DeviceID)
		if derr != nil || !ok {
			return 0, err
		}
		if _, aerr := s.pool.Activate(ctx, dev.Name, dev.ID, dev.SizeBytes); aerr != nil {
			return 0, errors.Join(err, aerr)
		}
		if st, err = s.pool.ThinStatus(ctx, r.DeviceName); err != nil {
			return 0, err
		}
	}
	return int64(st.MappedSectors) * 512, nil
}

// Mounts returns the mounts of the active or view snapshot key, activating
// its device if it is not active (after a reboot, for example).
func (s *Snapshotter) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	err := s.open()
	if err != nil {
		return nil, err
	}
	r, err := s.get(ctx, key)
	if err != nil {
		return nil, err
	}
	if r.Kind == SnapKindCommitted {
		return nil, fmt.Errorf("mounts of snapshot %q: a committed snapshot has no mounts (view it instead): %w", key, errdefs.ErrFailedPrecondition)
	}
	defer s.mapping.Lock(r.DeviceID)()
	if r, err = s.current(ctx, r, "mounts"); err != nil {
		return nil, err
	}
	dev, ok, err := s.reads().thinDevice(ctx, r.DeviceID)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("mounts of snapshot %q: device %d has no record: %w", key, r.DeviceID, errdefs.ErrNotFound)
	}
	path, err := s.pool.Activate(ctx, dev.Name, dev.ID, dev.SizeBytes)
	if err != nil {
		return nil, fmt.Errorf("mounts of snapshot %q: activate %s: %w", key, dev.Name, err)
	}
	return s.mounts(dev.FSType, path, r.Kind == SnapKindView), nil
}

// current re-reads r, an active or view snapshot, under its device's
// mapping lock: a commit that ran between reading r and taking the lock
// made it a committed snapshot under another name, whose device must stay
// unmapped and must never be handed out writable.
func (s *Snapshotter) current(ctx context.Context, r CDSnapshot, what string) (CDSnapshot, error) {
	cur, ok, err := s.reads().snapshotByID(ctx, r.ID)
	if err != nil {
		return r, err
	}
	if !ok || cur.Kind == SnapKindCommitted || cur.DeviceID != r.DeviceID {
		return r, fmt.Errorf("%s of snapshot %q: committed or removed meanwhile: %w", what, r.Key, errdefs.ErrNotFound)
	}
	return cur, nil
}

func (s *Snapshotter) mounts(fsType, path string, readOnly bool) []mount.Mount {
	opts := thinpool.MountOptions(thinpool.FSType(fsType), readOnly)
	if readOnly && fsType == string(thinpool.FSExt4) {
		opts = appendMissing(opts, "ro", "noload")
	} else if readOnly {
		opts = appendMissing(opts, "ro")
	}
	return []mount.Mount{{Type: fsType, Source: path, Options: opts}}
}

func appendMissing(opts []string, add ...string) []string {
	out := append([]string(nil), opts...)
	for _, a := range add {
		found := false
		for _, o := range out {
			if o == a {
				found = true
				break
			}
		}
		if !found {
			out = append(out, a)
		}
	}
	return out
}

// Prepare creates the active snapshot key on parent ("" for an empty
// filesystem) and returns its mounts. When the label
// containerd.io/snapshot.ref names a committed snapshot that already exists
// on the same parent, nothing is created and the error is AlreadyExists, as
// containerd's unpacker expects. While the pool is full or under its
// reserve nothing is created and the error is ResourceExhausted (and
// matches thinpool.ErrPoolFull), naming the pool's free space and the
// reserve.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, SnapKindActive, key, parent, opts)
}

// View creates the view snapshot key on parent, a snapshot whose mounts are
// read-only.
func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, SnapKindView, key, parent, opts)
}

// createPlan is what the intent transaction of create decided.
type createPlan struct {
	intentID int64
	id       uint32
	name     string
	origin   uint32
	parentID int64
	size     int64
	fsType   string
}

func (s *Snapshotter) create(ctx context.Context, kind, key, parent string, opts []snapshots.Opt) ([]mount.Mount, error) {
	err := s.open()
	if err != nil {
		return nil, err
	}
	if key == "" {
		return nil, fmt.Errorf("create snapshot: empty key: %w", errdefs.ErrInvalidArgument)
	}
	var base snapshots.Info
	for _, o := range opts {
		if err := o(&base); err != nil {
			return nil, err
		}
	}
	if err := validateLabels(base.Labels); err != nil {
		return nil, fmt.Errorf("create snapshot %q: %w", key, err)
	}
	base.Labels = withoutEmpty(base.Labels)
	logger := log.G(ctx).WithFields(log.Fields{"key": key, "parent": parent, "kind": kind})

	var baseDev *ThinDevice
	if parent == "" {
		if baseDev, err = s.ensureBase(ctx); err != nil {
			return nil, fmt.Errorf("create snapshot %q: %w", key, err)
		}
	}

	// Once the intent is recorded, the call ends by recording the outcome or
	// by rolling back, whatever the caller does meanwhile: fctx. A caller
	// that gave up is seen between the steps and rolled back, so it leaves
	// neither an intent nor a snapshot nobody asked for.
	fctx, cancel := detached(ctx)
	defer cancel()
	var plan createPlan
	for attempt := 0; ; attempt++ {
		plan, err = s.planCreate(ctx, kind, key, parent, base.Labels, baseDev)
		if err != nil {
			return nil, err
		}
		if err := s.step("create:intent"); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			s.rollbackCreate(fctx, plan, false, err)
			return nil, fmt.Errorf("create snapshot %q: caller gone before create_snap: %w", key, err)
		}
		err = s.pool.CreateSnap(fctx, plan.id, plan.origin)
		if err == nil {
			break
		}
		if errors.Is(err, thinpool.ErrExists) && attempt < 8 {
			// The pool holds a device that nothing recorded: never touch it,
			// never reuse its id.
			if qerr := s.quarantineAndDrop(fctx, plan, "found in pool while creating a snapshot; no record explains it"); qerr != nil {
				return nil, fmt.Errorf("create snapshot %q: quarantine thin id %d: %w", key, plan.id, qerr)
			}
			continue
		}
		s.rollbackCreate(fctx, plan, snapMayExist(err), err)
		return nil, exhausted(fmt.Errorf("create snapshot %q: create_snap %d of %d: %w", key, plan.id, plan.origin, err))
	}
	if err := s.step("create:device"); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		s.rollbackCreate(fctx, plan, true, err)
		return nil, fmt.Errorf("create snapshot %q: caller gone after create_snap: %w", key, err)
	}
	path, err := s.pool.Activate(fctx, plan.name, plan.id, plan.size)
	if err != nil {
		s.rollbackCreate(fctx, plan, true, err)
		return nil, fmt.Errorf("create snapshot %q: activate %s: %w", key, plan.name, err)
	}
	if err := s.step("create:activated"); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		s.rollbackCreate(fctx, plan, true, err)
		return nil, fmt.Errorf("create snapshot %q: caller gone after activation: %w", key, err)
	}
	now := nowNs()
	err = s.withTx(fctx, func(q Records) error {
		if err := q.InsertThinDevice(fctx, ThinDevice{
			ID: plan.id, Name: plan.name, OriginID: plan.origin, Role: ThinRoleSnapshot,
			State: ThinStateActive, SizeBytes: plan.size, FSType: plan.fsType, CreatedNs: now, UpdatedNs: now,
		}); err != nil {
			return err
		}
		if _, err := q.InsertSnapshot(fctx, CDSnapshot{
			Key: key, Kind: kind, ParentID: plan.parentID, DeviceID: plan.id,
			Labels: base.Labels, CreatedNs: now, UpdatedNs: now,
		}); err != nil {
			return err
		}
		return q.deleteIntent(fctx, plan.intentID)
	})
	if err != nil {
		s.rollbackCreate(fctx, plan, true, err)
		return nil, fmt.Errorf("create snapshot %q: record outcome: %w", key, err)
	}
	logger.WithFields(log.Fields{"thin_id": plan.id, "device": plan.name}).Debug("snapshot created")
	return s.mounts(plan.fsType, path, kind == SnapKindView), nil
}

// snapMayExist reports whether a failed CreateSnap may have left its new
// device in the pool, so that its rollback must delete it. The pool's
// typed errors mean create_snap was refused (before the message, or by the
// kernel) and made nothing: ErrExists (the id holds a device that is not
// this call's, never to be touched), ErrNotFound (no origin), ErrPoolFull
// and the reserves, ErrBusy, ErrInvalid. Any other error may come after a
// create_snap that succeeded (resuming a suspended origin failed), so the
// device may exist. Deleting it then is safe: the id was free of records,
// intents and quarantine, reconcile quarantines at start-up every device
// nothing explains, and a device already absent is not an error to
// destroy.
func snapMayExist(err error) bool {
	for _, refused := range []error{thinpool.ErrExists, thinpool.ErrNotFound, thinpool.ErrPoolFull, thinpool.ErrBusy, thinpool.ErrInvalid} {
		if errors.Is(err, refused) {
			return false
		}
	}
	return true
}

// exhausted puts err, when the pool refused a device for want of space
// (full, or under its reserve: thinpool.ErrPoolFull), in containerd's
// error space as ResourceExhausted, so that it crosses the proxy's gRPC
// with its class and containerd's clients (`ctr run`, the CRI) print it
// as what it is; the message, which names the pool's free space and what
// to change, is kept whole. Other errors are returned as they are.
func exhausted(err error) error {
	if errors.Is(err, thinpool.ErrPoolFull) && !errdefs.IsResourceExhausted(err) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
	}
	return err
}

// planCreate checks the request and records the create intent, in one write
// transaction; it returns the plan of the device work.
func (s *Snapshotter) planCreate(ctx context.Context, kind, key, parent string, lbls map[string]string, baseDev *ThinDevice) (createPlan, error) {
	var plan createPlan
	err := s.withTx(ctx, func(q Records) error {
		if target := lbls[snapshots.LabelSnapshotRef]; target != "" && kind == SnapKindActive {
			found, err := q.refTarget(ctx, snapshots.LabelSnapshotRef, target, parent)
			if err != nil {
				return err
			}
			if found != "" {
				return fmt.Errorf("target snapshot %q (committed as %q): %w", target, found, errdefs.ErrAlreadyExists)
			}
		}
		if _, ok, err := q.Snapshot(ctx, key); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("snapshot %q: %w", key, errdefs.ErrAlreadyExists)
		}
		if reserved, err := q.keyReserved(ctx, key); err != nil {
			return err
		} else if reserved {
			return fmt.Errorf("snapshot %q is being created: %w", key, errdefs.ErrAlreadyExists)
		}
		if parent != "" {
			p, ok, err := q.Snapshot(ctx, parent)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("parent snapshot %q of %q: %w", parent, key, errdefs.ErrNotFound)
			}
			if p.Kind != SnapKindCommitted {
				return fmt.Errorf("parent snapshot %q of %q is %s, not committed: %w", parent, key, p.Kind, errdefs.ErrInvalidArgument)
			}
			pd, ok, err := q.thinDevice(ctx, p.DeviceID)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("parent snapshot %q: device %d has no record: %w", parent, p.DeviceID, errdefs.ErrNotFound)
			}
			plan.origin, plan.parentID, plan.size, plan.fsType = pd.ID, p.ID, pd.SizeBytes, pd.FSType
		} else {
			plan.origin, plan.size, plan.fsType = baseDev.ID, baseDev.SizeBytes, baseDev.FSType
		}
		id, err := probeID(ctx, candidateID(keyspace, key), q.thinIDUsed)
		if err != nil {
			return err
		}
		plan.id, plan.name = id, deviceName(s.pool.Name(), id)
		plan.intentID, err = q.insertIntent(ctx, DeviceIntent{
			Op: intentCreate, DeviceID: id, Name: plan.name, OriginID: plan.origin,
			Key: key, CreatedNs: nowNs(),
		})
		return err
	})
	return plan, err
}

// rollbackCreate undoes the device work of a failed create and drops its
// intent. If the device cannot be removed, its id is quarantined in the same
// transaction that drops the intent, so it is never reused. ctx must not be
// the caller's own (see detached): a rollback cut short leaves the intent.
func (s *Snapshotter) rollbackCreate(ctx context.Context, plan createPlan, created bool, cause error) {
	if errors.Is(cause, errSimulatedCrash) {
		return
	}
	logger := log.G(ctx).WithFields(log.Fields{"thin_id": plan.id, "device": plan.name, "cause": cause})
	var derr error
	if created {
		derr = s.destroy(ctx, plan.name, plan.id)
	}
	err := s.withTx(ctx, func(q Records) error {
		if derr != nil {
			if err := q.Quarantine(ctx, plan.id, fmt.Sprintf("rollback of a failed create could not delete it: %v", derr), false, nowNs()); err != nil {
				return err
			}
		}
		return q.deleteIntent(ctx, plan.intentID)
	})
	if err != nil {
		logger.WithError(err).Error("rollback of failed create: could not drop the intent; start-up reconciliation will finish it")
		return
	}
	if derr != nil {
		logger.WithError(derr).Error("rollback of failed create: device could not be deleted; its id is quarantined")
		return
	}
	logger.Info("rolled back failed create")
}

// quarantineAndDrop records plan's id as never to be reused (a device that
// nothing explains holds it) and drops plan's intent, in one transaction.
func (s *Snapshotter) quarantineAndDrop(ctx context.Context, plan createPlan, reason string) error {
	log.G(ctx).WithFields(log.Fields{"thin_id": plan.id, "reason": reason}).Warn("quarantining thin id")
	return s.withTx(ctx, func(q Records) error {
		if err := q.Quarantine(ctx, plan.id, reason, false, nowNs()); err != nil {
			return err
		}
		return q.deleteIntent(ctx, plan.intentID)
	})
}

// discard gives back the blocks of removed device dev before its deletion
// (Config.DiscardBlocks): it activates the device, which reclaim unmapped
// first, and discards all of it. A failure only costs the space the discard would
// have given back, so it is logged and the deletion goes on; a crash
// leaves the device removed, and the next reclaim discards it again.
func (s *Snapshotter) discard(ctx context.Context, dev ThinDevice) {
	lg := log.G(ctx).WithFields(log.Fields{"device": dev.Name, "thin_id": dev.ID})
	if _, err := s.pool.Activate(ctx, dev.Name, dev.ID, dev.SizeBytes); err != nil {
		lg.WithError(err).Warn("reclaim: could not activate the device to discard its blocks; deleting it without")
		return
	}
	switch err := s.pool.Discard(ctx, dev.Name); {
	case errors.Is(err, errors.ErrUnsupported):
		lg.WithError(err).Debug("reclaim: the pool ignores discards")
	case err != nil:
		lg.WithError(err).Warn("reclaim: discarding the device's blocks failed; deleting it without")
	}
}

// destroy deactivates and deletes a thin device; a device already gone is
// not an error.
func (s *Snapshotter) destroy(ctx context.Context, name string, id uint32) error {
	if err := s.pool.Deactivate(ctx, name); err != nil {
		return fmt.Errorf("deactivate %s: %w", name, err)
	}
	if err := s.pool.Delete(ctx, id); err != nil && !errors.Is(err, thinpool.ErrNotFound) {
		return fmt.Errorf("delete thin id %d (%s): %w", id, name, err)
	}
	return nil
}

// Commit turns the active snapshot key into the committed snapshot name:
// it records the device's mapped bytes as its usage, replaces its labels
// with those given, and deactivates its device.
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	err := s.open()
	if err != nil {
		return err
	}
	if name == "" {
		return fmt.Errorf("commit %q: empty name: %w", key, errdefs.ErrInvalidArgument)
	}
	var base snapshots.Info
	for _, o := range opts {
		if err := o(&base); err != nil {
			return err
		}
	}
	if err := validateLabels(base.Labels); err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	base.Labels = withoutEmpty(base.Labels)
	r, err := s.get(ctx, key)
	if err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	if r.Kind != SnapKindActive {
		return fmt.Errorf("commit %q as %q: snapshot is %s, not active: %w", key, name, r.Kind, errdefs.ErrFailedPrecondition)
	}
	if base.Parent != "" && base.Parent != r.ParentKey {
		return fmt.Errorf("commit %q as %q: cannot rebase onto parent %q (a thin device holds its parent's content; parent is %q): %w",
			key, name, base.Parent, r.ParentKey, errdefs.ErrInvalidArgument)
	}
	if _, ok, err := s.reads().Snapshot(ctx, name); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("commit %q as %q: %w", key, name, errdefs.ErrAlreadyExists)
	}
	defer s.mapping.Lock(r.DeviceID)()
	size, err := s.mappedBytes(ctx, r)
	if err != nil {
		return fmt.Errorf("commit %q as %q: usage: %w", key, name, err)
	}
	if err := s.pool.Deactivate(ctx, r.DeviceName); err != nil {
		return fmt.Errorf("commit %q as %q: deactivate %s (still mounted?): %w", key, name, r.DeviceName, err)
	}
	fctx, cancel := detached(ctx)
	defer cancel()
	if err := s.step("commit:deactivated"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		// The caller keeps the active snapshot it still believes in: give
		// it its device back.
		s.reactivate(fctx, r)
		return fmt.Errorf("commit %q as %q: caller gone after deactivation: %w", key, name, err)
	}
	err = s.withTx(fctx, func(q Records) error {
		cur, ok, err := q.Snapshot(fctx, key)
		if err != nil {
			return err
		}
		if !ok || cur.ID != r.ID {
			return fmt.Errorf("commit %q as %q: snapshot was removed meanwhile: %w", key, name, errdefs.ErrNotFound)
		}
		if _, ok, err := q.Snapshot(fctx, name); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("commit %q as %q: %w", key, name, errdefs.ErrAlreadyExists)
		}
		if reserved, err := q.keyReserved(fctx, name); err != nil {
			return err
		} else if reserved {
			return fmt.Errorf("commit %q as %q: snapshot %q is being created: %w", key, name, name, errdefs.ErrAlreadyExists)
		}
		if err := q.commitSnapshot(fctx, r.ID, name, base.Labels, nowNs(), size, 0); err != nil {
			return err
		}
		return q.setThinDeviceState(fctx, r.DeviceID, ThinStateInactive, nowNs())
	})
	if err != nil {
		s.reactivate(fctx, r)
		return err
	}
	log.G(ctx).WithFields(log.Fields{"key": key, "name": name, "thin_id": r.DeviceID, "size": size}).Debug("snapshot committed")
	return nil
}

// reactivate maps the device of active snapshot r again after a commit
// that deactivated it did not go through, unless r was removed (or
// changed) meanwhile: a removed device must stay unmapped to be deleted.
// Failing is only logged: Mounts activates a device it finds unmapped.
func (s *Snapshotter) reactivate(ctx context.Context, r CDSnapshot) {
	cur, ok, err := s.reads().snapshotByID(ctx, r.ID)
	if err == nil && (!ok || cur.Kind != SnapKindActive || cur.DeviceID != r.DeviceID) {
		return
	}
	var dev ThinDevice
	if err == nil {
		dev, ok, err = s.reads().thinDevice(ctx, r.DeviceID)
	}
	if err == nil && ok && dev.State != ThinStateRemoved {
		_, err = s.pool.Activate(ctx, dev.Name, dev.ID, dev.SizeBytes)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithFields(log.Fields{"key": r.Key, "device": r.DeviceName}).Warn("commit not done: device left unmapped; Mounts will map it")
	}
}

// Recommit puts the device of active snapshot key in place of the device
// of committed snapshot name, which must be gone from the pool (deleted
// behind our back), and removes key. key must have been prepared on name's
// parent and filled with name's content: the snapshots on name keep their
// own devices (a thin snapshot does not need its origin's) and are not
// touched; later snapshots of name are made from the new device. When name
// no longer holds the device it had when the call began (another Recommit
// replaced it first), it fails with errdefs.ErrFailedPrecondition and
// leaves key in place.
func (s *Snapshotter) Recommit(ctx context.Context, name, key string) error {
	err := s.open()
	if err != nil {
		return err
	}
	old, err := s.get(ctx, name)
	if err != nil {
		return fmt.Errorf("recommit %q as %q: %w", key, name, err)
	}
	r, err := s.get(ctx, key)
	if err != nil {
		return fmt.Errorf("recommit %q as %q: %w", key, name, err)
	}
	if old.Kind != SnapKindCommitted || r.Kind != SnapKindActive || old.ParentKey != r.ParentKey {
		return fmt.Errorf("recommit %q (%s on %q) as %q (%s on %q): want an active snapshot on the committed one's parent: %w",
			key, r.Kind, r.ParentKey, name, old.Kind, old.ParentKey, errdefs.ErrFailedPrecondition)
	}
	if present, err := s.pool.ThinExists(ctx, old.DeviceID); err != nil {
		return fmt.Errorf("recommit %q as %q: %w", key, name, err)
	} else if present {
		return fmt.Errorf("recommit %q as %q: %q's thin device %d is still in the pool: %w", key, name, name, old.DeviceID, errdefs.ErrFailedPrecondition)
	}
	if err := s.step("recommit:checked"); err != nil {
		return err
	}
	defer s.mapping.Lock(r.DeviceID)()
	size, err := s.mappedBytes(ctx, r)
	if err != nil {
		return fmt.Errorf("recommit %q as %q: usage: %w", key, name, err)
	}
	if err := s.pool.Deactivate(ctx, r.DeviceName); err != nil {
		return fmt.Errorf("recommit %q as %q: deactivate %s (still mounted?): %w", key, name, r.DeviceName, err)
	}
	fctx, cancel := detached(ctx)
	defer cancel()
	err = s.withTx(fctx, func(q Records) error {
		cur, ok, err := q.Snapshot(fctx, key)
		if err != nil {
			return err
		}
		if !ok || cur.ID != r.ID {
			return fmt.Errorf("recommit %q as %q: snapshot was removed meanwhile: %w", key, name, errdefs.ErrNotFound)
		}
		if err := q.deleteSnapshot(fctx, r.ID); err != nil {
			return err
		}
		if err := q.moveDevice(fctx, old.ID, old.DeviceID, r.DeviceID, size, nowNs()); err != nil {
			return fmt.Errorf("recommit %q as %q: %w", key, name, err)
		}
		if err := q.setThinDeviceState(fctx, r.DeviceID, ThinStateInactive, nowNs()); err != nil {
			return err
		}
		return q.deleteThinDevice(fctx, old.DeviceID)
	})
	if err != nil {
		s.reactivate(fctx, r)
		return err
	}
	log.G(ctx).WithFields(log.Fields{"key": key, "name": name, "thin_id": r.DeviceID, "lost_thin_id": old.DeviceID}).Warn("snapshot's lost device replaced")
	return nil
}

// Remove drops the snapshot key. A snapshot with children cannot be removed
// (FailedPrecondition). The device is deleted by Cleanup, or before Remove
// returns unless Config.AsyncRemove is set.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	return s.RemoveIf(ctx, key, nil)
}

// RemoveGuard decides, inside the transaction that removes a snapshot's
// record, whether it may go: a non-nil error refuses the removal and is
// returned as is. It reads through tx, so what it checks cannot change
// before the removal commits.
type RemoveGuard func(ctx context.Context, tx *sql.Tx) error

// RemoveIf is Remove, with guard (when not nil) consulted in the same
// transaction as the removal of the record.
func (s *Snapshotter) RemoveIf(ctx context.Context, key string, guard RemoveGuard) error {
	err := s.open()
	if err != nil {
		return err
	}
	var dev ThinDevice
	err = s.db.WithTx(ctx, func(tx *sql.Tx) error {
		if guard != nil {
			if err := guard(ctx, tx); err != nil {
				return err
			}
		}
		q := RecordsTx(tx)
		d, children, found, err := q.RemoveSnapshot(ctx, key, nowNs())
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("remove snapshot %q: %w", key, errdefs.ErrNotFound)
		}
		if children > 0 {
			return fmt.Errorf("cannot remove snapshot %q: it has %d children: %w", key, children, errdefs.ErrFailedPrecondition)
		}
		dev = d
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.step("remove:marked"); err != nil {
		return err
	}
	if !s.cfg.AsyncRemove {
		// The removal is recorded: deleting the device is this call's to
		// finish, even for a caller that gave up.
		fctx, cancel := detached(ctx)
		defer cancel()
		if err := s.reclaim(fctx, dev); err != nil {
			if errors.Is(err, errSimulatedCrash) {
				return err
			}
			log.G(ctx).WithError(err).WithFields(log.Fields{"key": key, "device": dev.Name}).Warn("remove: device not deleted yet; Cleanup will retry")
		}
	}
	return nil
}

// reclaim deletes a removed device from the pool and then its record. ctx
// should be detached from a caller's cancellation: a reclaim cut between
// the deletion and the record leaves the record for Cleanup.
//
// dev may be stale: Cleanup lists the removed devices once, and a
// synchronous Remove races with any Cleanup. Once another reclaim has
// deleted the device and its record, the thin id is free, and a create of
// the same key gets the same id and dm name back (ids derive from the key),
// so acting on dev could delete that new device. reclaim therefore holds
// the id's lock and goes on only while the record still says dev is the
// removed device: a create cannot take the id while that record exists,
// and once the Snapshotter is in use (reconcile is done) a removed
// device's record is only dropped here, under the same lock. No path takes
// the lock while holding a database transaction, so waiting for one inside
// it cannot deadlock; a reclaim that finds the device gone returns without
// touching the pool, so a Cleanup behind another one costs one read per
// device.
func (s *Snapshotter) reclaim(ctx context.Context, dev ThinDevice) error {
	unlock := s.reclaiming.Lock(dev.ID)
	defer unlock()
	cur, ok, err := s.reads().thinDevice(ctx, dev.ID)
	if err != nil {
		return fmt.Errorf("reclaim %s: %w", dev.Name, err)
	}
	if !ok || cur.State != ThinStateRemoved || cur.Name != dev.Name {
		log.G(ctx).WithFields(log.Fields{"device": dev.Name, "thin_id": dev.ID, "recorded": ok, "state": cur.State}).
			Debug("reclaim: device already reclaimed by another caller; its id is left to its new record")
		return nil
	}
	// Unmap it first: the kernel refuses to remove a device anyone holds
	// open (a mount, or a VM given its path as a disk), and that refusal
	// is the only check that sees a plain open, which the discard's
	// exclusive one does not conflict with. Such a holder keeps the device
	// for as long as it runs, so the pool's busy retry (seconds, meant for
	// udev's brief probe of a new mapping) is cut short: every Cleanup,
	// which the collector runs after each image it removes, would pay it
	// again for each held device.
	hctx, cancel := context.WithTimeout(ctx, heldCheckTimeout)
	err = s.pool.Deactivate(hctx, dev.Name)
	cancel()
	if err != nil {
		return fmt.Errorf("reclaim %s: deactivate (held open? the device is left for a later Cleanup): %w", dev.Name, err)
	}
	if s.cfg.DiscardBlocks {
		// Discarded on a mapping of this call's own.
		s.discard(ctx, dev)
	}
	if err := s.destroy(ctx, dev.Name, dev.ID); err != nil {
		return err
	}
	if err := s.step("reclaim:deleted"); err != nil {
		return err
	}
	var deleted bool
	err = s.withTx(ctx, func(q Records) error {
		deleted, err = q.deleteRemovedThinDevice(ctx, dev.ID, dev.Name)
		return err
	})
	if err != nil {
		return err
	}
	if !deleted {
		return fmt.Errorf("reclaim %s: thin id %d was deleted but its record is no longer that removed device; record left in place: %w",
			dev.Name, dev.ID, errdefs.ErrConflict)
	}
	return nil
}

// heldCheckTimeout bounds reclaim's first deactivation of a removed
// device, which fails while something holds the device open: a few of
// the pool's busy retries, not all of them.
const heldCheckTimeout = 250 * time.Millisecond

// Cleanup deletes from the pool every device whose snapshot was removed.
// It carries on past a device it cannot delete and returns all the errors.
// Cleanup and Remove may run concurrently: each removed device is deleted
// once, and a device made later under the same thin id is never touched.
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("snapshotter on pool %s is closed: %w", s.pool.Name(), errdefs.ErrFailedPrecondition)
	}
	devs, err := s.reads().ThinDevices(ctx, ThinStateRemoved)
	if err != nil {
		return err
	}
	if err := s.step("cleanup:listed"); err != nil {
		return err
	}
	var errs []error
	for i, d := range devs {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("cleanup stopped with %d devices left: %w", len(devs)-i, err))
			break
		}
		fctx, cancel := detached(ctx)
		err := s.reclaim(fctx, d)
		cancel()
		if err != nil {
			if errors.Is(err, errSimulatedCrash) {
				return err
			}
			log.G(ctx).WithError(err).WithFields(log.Fields{"device": d.Name, "thin_id": d.ID}).Warn("cleanup: could not delete device")
			errs = append(errs, fmt.Errorf("cleanup device %s: %w", d.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Walk calls fn for every snapshot (of the one keyspace) that matches
// any of filters (containerd's filter syntax over kind, name, parent and
// labels.<key>). fn may call the snapshotter. A single filter's equality
// selectors are answered by the database (containerd's lookup of a layer by
// its snapshot.ref label and parent, a walk of one snapshot's children), so
// such a walk costs what it returns, not the number of snapshots.
func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, fs ...string) error {
	err := s.open()
	if err != nil {
		return err
	}
	filter, err := filters.ParseAll(fs...)
	if err != nil {
		return fmt.Errorf("walk: filters %q: %w", fs, err)
	}
	var rows []CDSnapshot
	if narrow, ok := pushdown(fs, filter); ok {
		rows, err = s.reads().snapshotsWhere(ctx, narrow)
	} else {
		rows, err = s.reads().Snapshots(ctx)
	}
	if err != nil {
		return err
	}
	for _, r := range rows {
		info := InfoOf(r)
		if !filter.Match(FilterAdaptor(info)) {
			continue
		}
		if err := fn(ctx, info); err != nil {
			return err
		}
	}
	return nil
}

// Close marks the snapshotter closed; later calls fail. It leaves the
// database and the pool open (the caller owns them) and may be called more
// than once.
func (s *Snapshotter) Close() error {
	s.closed.Store(true)
	return nil
}

// DeviceOf returns the dm name, device path and thin id of snapshot key in
// the keyspace (NotFound if there is none). The path exists only
// while the device is active (active and view snapshots).
func (s *Snapshotter) DeviceOf(ctx context.Context, key string) (name, path string, id uint32, err error) {
	err = s.open()
	if err != nil {
		return "", "", 0, err
	}
	r, err := s.get(ctx, key)
	if err != nil {
		return "", "", 0, err
	}
	return r.DeviceName, thinpool.DevicePath(r.DeviceName), r.DeviceID, nil
}

// Exists reports whether snapshot key exists (in the one keyspace).
func (s *Snapshotter) Exists(ctx context.Context, key string) (bool, error) {
	err := s.open()
	if err != nil {
		return false, err
	}
	_, ok, err := s.reads().Snapshot(ctx, key)
	return ok, err
}

// DeviceCounts returns how many devices are in each state, for metrics:
// "active", "view", "committed" (snapshots by kind), "removed-pending"
// (awaiting Cleanup), "quarantined" (ids never reused whose device is kept)
// and "base". Every key is present.
func (s *Snapshotter) DeviceCounts(ctx context.Context) (map[string]int, error) {
	return s.reads().DeviceStateCounts(ctx)
}
