package snapshotter

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// Quarantined is a quarantined thin id as an operator reviews it.
type Quarantined struct {
	QuarantinedID
	// InPool is whether the pool still holds the thin id (known only when
	// a pool was given: PoolChecked).
	InPool      bool
	PoolChecked bool
}

// ListQuarantine returns every quarantined thin id, with whether pool (when
// not nil) still holds it. A pool that is not active is passed as a nil
// interface, not as a nil *thinpool.Pool.
func ListQuarantine(ctx context.Context, db *metadata.DB, pool DevicePool) ([]Quarantined, error) {
	qs, err := ReadRecords(db).QuarantinedIDs(ctx)
	if err != nil {
		return nil, err
	}
	var inPool map[uint32]bool
	if pool != nil {
		ids, err := pool.ThinIDs(ctx)
		if err != nil {
			return nil, fmt.Errorf("thin ids of pool %s: %w", pool.Name(), err)
		}
		inPool = make(map[uint32]bool, len(ids))
		for _, id := range ids {
			inPool[id] = true
		}
	}
	out := make([]Quarantined, 0, len(qs))
	for _, q := range qs {
		out = append(out, Quarantined{QuarantinedID: q, InPool: inPool[q.DeviceID], PoolChecked: pool != nil})
	}
	return out, nil
}

// DeleteQuarantined deletes the device of quarantined thin id id from pool
// (after removing any device-mapper device mapping it) and records it
// deleted; the id stays quarantined (never reused) until released. An id
// that is not quarantined, or that a device record or an intent owns, is
// refused: only what start-up could not explain may be deleted this way.
func DeleteQuarantined(ctx context.Context, db *metadata.DB, pool DevicePool, id uint32) error {
	q, err := quarantineOf(ctx, db, id)
	if err != nil {
		return err
	}
	actives, err := pool.ActiveDevices(ctx)
	if err != nil {
		return fmt.Errorf("delete quarantined thin id %d: %w", id, err)
	}
	for _, a := range actives {
		if a.ThinID != id {
			continue
		}
		if err := pool.Deactivate(ctx, a.Name); err != nil {
			return fmt.Errorf("delete quarantined thin id %d: remove device %s mapping it (mounted?): %w", id, a.Name, err)
		}
	}
	if err := pool.Delete(ctx, id); err != nil && !errors.Is(err, thinpool.ErrNotFound) {
		return fmt.Errorf("delete quarantined thin id %d: %w", id, err)
	}
	err = db.WithTx(ctx, func(tx *sql.Tx) error {
		return RecordsTx(tx).Quarantine(ctx, id, q.Reason, true, q.QuarantinedNs)
	})
	if err != nil {
		return fmt.Errorf("delete quarantined thin id %d: the device is deleted but not recorded so: %w", id, err)
	}
	log.G(ctx).WithFields(log.Fields{"thin_id": id, "reason": q.Reason}).Warn("quarantined thin device deleted by the operator")
	return nil
}

// ReleaseQuarantined forgets the quarantine of thin id id, so that a new
// device may use it. It is refused while pool still holds the id (delete
// it first), or when a device record or an intent owns the id.
func ReleaseQuarantined(ctx context.Context, db *metadata.DB, pool DevicePool, id uint32) error {
	if _, err := quarantineOf(ctx, db, id); err != nil {
		return err
	}
	present, err := pool.ThinExists(ctx, id)
	if err != nil {
		return fmt.Errorf("release quarantined thin id %d: %w", id, err)
	}
	if present {
		return fmt.Errorf("release quarantined thin id %d: pool %s still holds it (delete it first): %w", id, pool.Name(), errdefs.ErrFailedPrecondition)
	}
	var released bool
	err = db.WithTx(ctx, func(tx *sql.Tx) error {
		released, err = RecordsTx(tx).releaseQuarantined(ctx, id)
		return err
	})
	if err != nil {
		return err
	}
	if !released {
		return fmt.Errorf("release quarantined thin id %d: not quarantined: %w", id, errdefs.ErrNotFound)
	}
	log.G(ctx).WithField("thin_id", id).Info("quarantined thin id released by the operator")
	return nil
}

// quarantineOf returns id's quarantine record, refusing an id that is not
// quarantined or that the snapshotter's records own.
func quarantineOf(ctx context.Context, db *metadata.DB, id uint32) (QuarantinedID, error) {
	r := ReadRecords(db)
	qs, err := r.QuarantinedIDs(ctx)
	if err != nil {
		return QuarantinedID{}, err
	}
	var found *QuarantinedID
	for i := range qs {
		if qs[i].DeviceID == id {
			found = &qs[i]
		}
	}
	if found == nil {
		return QuarantinedID{}, fmt.Errorf("thin id %d is not quarantined (pool quarantine ls lists those that are): %w", id, errdefs.ErrNotFound)
	}
	if _, owned, err := r.thinDevice(ctx, id); err != nil {
		return QuarantinedID{}, err
	} else if owned {
		return QuarantinedID{}, fmt.Errorf("thin id %d is quarantined but a device record owns it; leave it to the daemon: %w", id, errdefs.ErrFailedPrecondition)
	}
	intents, err := r.Intents(ctx)
	if err != nil {
		return QuarantinedID{}, err
	}
	for _, in := range intents {
		if in.DeviceID == id {
			return QuarantinedID{}, fmt.Errorf("thin id %d is quarantined but a %s under way owns it; leave it to the daemon: %w", id, in.Op, errdefs.ErrFailedPrecondition)
		}
	}
	return *found, nil
}
