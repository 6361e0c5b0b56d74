package snapshotter

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// reconcile brings the database and the pool into agreement after a crash
// or an outside change, logging every decision:
//
//   - an intent without an outcome is rolled back: its device is
//     deactivated and deleted if it exists, then the intent is dropped (if
//     the device cannot be deleted its id is quarantined);
//   - a removed device already gone from the pool loses its record; one still
//     there is deleted now when removal is synchronous, else left to Cleanup;
//   - a device recorded inactive but active in dm is deactivated; one
//     recorded active but not active in dm is activated;
//   - a recorded device missing from the pool: the base record is dropped
//     (the base is made again when next needed); a snapshot without children
//     loses its record (its data is gone); one with children is reported;
//   - a thin id in the pool that nothing explains is quarantined, and deleted
//     only when Config.DeleteUnknownDevices is set.
func (s *Snapshotter) reconcile(ctx context.Context) error {
	logger := log.G(ctx).WithField("pool", s.pool.Name())
	ids, err := s.pool.ThinIDs(ctx)
	if err != nil {
		return fmt.Errorf("list thin ids: %w", err)
	}
	inPool := make(map[uint32]bool, len(ids))
	for _, id := range ids {
		inPool[id] = true
	}
	actives, err := s.pool.ActiveDevices(ctx)
	if err != nil {
		return fmt.Errorf("list active devices: %w", err)
	}
	activeByName := make(map[string]thinpool.ActiveDevice, len(actives))
	for _, a := range actives {
		activeByName[a.Name] = a
	}

	var errs []error

	// 1. Intents: work announced but never recorded as done.
	intents, err := s.reads().Intents(ctx)
	if err != nil {
		return err
	}
	for _, in := range intents {
		l := logger.WithFields(log.Fields{"intent": in.ID, "op": in.Op, "thin_id": in.DeviceID, "device": in.Name, "key": in.Key})
		if _, ok, err := s.reads().thinDevice(ctx, in.DeviceID); err != nil {
			return err
		} else if ok {
			if err := s.withTx(ctx, func(q Records) error { return q.deleteIntent(ctx, in.ID) }); err != nil {
				return err
			}
			l.Info("reconcile: intent whose outcome is recorded; dropped the intent")
			continue
		}
		var derr error
		if in.Op == intentFormatBase {
			s.pool.ReleaseFormat()
		}
		// Always: a crash inside Activate can leave a device of that name
		// with no table yet, which ActiveDevices does not list.
		if err := s.pool.Deactivate(ctx, in.Name); err != nil {
			derr = fmt.Errorf("deactivate %s: %w", in.Name, err)
		} else {
			delete(activeByName, in.Name)
		}
		if derr == nil && inPool[in.DeviceID] {
			if err := s.pool.Delete(ctx, in.DeviceID); err != nil && !errors.Is(err, thinpool.ErrNotFound) {
				derr = fmt.Errorf("delete thin id %d: %w", in.DeviceID, err)
			} else {
				delete(inPool, in.DeviceID)
			}
		}
		err := s.withTx(ctx, func(q Records) error {
			if derr != nil {
				if err := q.Quarantine(ctx, in.DeviceID, fmt.Sprintf("half-made by an interrupted %s and could not be rolled back: %v", in.Op, derr), false, nowNs()); err != nil {
					return err
				}
			}
			return q.deleteIntent(ctx, in.ID)
		})
		if err != nil {
			return err
		}
		if derr != nil {
			l.WithError(derr).Error("reconcile: interrupted create could not be rolled back; thin id quarantined")
		} else {
			l.Info("reconcile: rolled back interrupted create")
		}
	}

	// 2. Device records against the pool.
	devs, err := s.reads().ThinDevices(ctx, "")
	if err != nil {
		return err
	}
	known := make(map[uint32]bool, len(devs))
	knownNames := make(map[string]bool, len(devs))
	var missing []ThinDevice
	for _, d := range devs {
		known[d.ID] = true
		knownNames[d.Name] = true
		_, isActive := activeByName[d.Name]
		l := logger.WithFields(log.Fields{"thin_id": d.ID, "device": d.Name, "role": d.Role, "state": d.State})
		switch {
		case !inPool[d.ID]:
			missing = append(missing, d)
		case d.State == ThinStateRemoved:
			if !s.cfg.AsyncRemove {
				if err := s.reclaim(ctx, d); err != nil {
					l.WithError(err).Warn("reconcile: removed device could not be deleted; Cleanup will retry")
				} else {
					l.Info("reconcile: deleted removed device")
				}
			} else {
				l.Debug("reconcile: removed device awaits Cleanup")
			}
		case d.State == ThinStateInactive && isActive:
			if err := s.pool.Deactivate(ctx, d.Name); err != nil {
				l.WithError(err).Warn("reconcile: device recorded inactive is active and could not be deactivated")
			} else {
				l.Info("reconcile: deactivated device recorded inactive")
			}
		case d.State == ThinStateActive && !isActive:
			if _, err := s.pool.Activate(ctx, d.Name, d.ID, d.SizeBytes); err != nil {
				l.WithError(err).Warn("reconcile: device recorded active could not be activated; Mounts will retry")
			} else {
				l.Info("reconcile: activated device recorded active")
			}
		}
	}

	// A missing snapshot with children keeps its record for the operator;
	// its children may be missing too, so the drops are repeated until a
	// pass drops nothing, whatever the order of the ids.
	for len(missing) > 0 {
		var kept []ThinDevice
		for _, d := range missing {
			dropped, err := s.dropMissing(ctx, d, logger.WithFields(log.Fields{"thin_id": d.ID, "device": d.Name, "role": d.Role, "state": d.State}))
			if err != nil {
				errs = append(errs, err)
			} else if !dropped {
				kept = append(kept, d)
			}
		}
		if len(kept) == len(missing) {
			for _, d := range kept {
				logger.WithFields(log.Fields{"thin_id": d.ID, "device": d.Name}).
					Error("reconcile: snapshot device missing from the pool but the snapshot has children; record kept for the operator")
			}
			break
		}
		missing = kept
	}

	// 3. Thin ids in the pool that nothing explains.
	quarantined, err := s.reads().QuarantinedIDs(ctx)
	if err != nil {
		return err
	}
	for _, q := range quarantined {
		known[q.DeviceID] = true
	}
	for _, id := range ids {
		if known[id] || !inPool[id] {
			continue
		}
		l := logger.WithField("thin_id", id)
		deleted := false
		if s.cfg.DeleteUnknownDevices {
			var derr error
			for _, a := range activeByName {
				if a.ThinID == id {
					if err := s.pool.Deactivate(ctx, a.Name); err != nil {
						derr = err
					}
				}
			}
			if derr == nil {
				derr = s.pool.Delete(ctx, id)
			}
			if derr != nil {
				l.WithError(derr).Warn("reconcile: could not delete unexplained thin device")
			} else {
				deleted = true
			}
		}
		if err := s.withTx(ctx, func(q Records) error {
			return q.Quarantine(ctx, id, "in the pool at start-up; no record or intent explains it", deleted, nowNs())
		}); err != nil {
			return err
		}
		if deleted {
			l.Warn("reconcile: unexplained thin device deleted; its id is quarantined")
		} else {
			l.Warn("reconcile: unexplained thin device quarantined and kept")
		}
	}

	// 4. Active dm devices on the pool that no record names.
	for name, a := range activeByName {
		if knownNames[name] {
			continue
		}
		logger.WithFields(log.Fields{"device": name, "thin_id": a.ThinID}).Warn("reconcile: active device on the pool that no record names; left alone")
	}
	return errors.Join(errs...)
}

// dropMissing handles a recorded device that is not in the pool, and
// reports whether it dropped the records: it keeps those of a snapshot
// that has children.
func (s *Snapshotter) dropMissing(ctx context.Context, d ThinDevice, l *log.Entry) (bool, error) {
	switch {
	case d.State == ThinStateRemoved:
		if err := s.withTx(ctx, func(q Records) error { return q.deleteThinDevice(ctx, d.ID) }); err != nil {
			return false, err
		}
		l.Info("reconcile: removed device already gone from the pool; dropped its record")
		return true, nil
	case d.Role == ThinRoleBase:
		if err := s.withTx(ctx, func(q Records) error { return q.deleteThinDevice(ctx, d.ID) }); err != nil {
			return false, err
		}
		l.Error("reconcile: base device missing from the pool; dropped its record, it will be made again")
		return true, nil
	}
	var dropped, children bool
	err := s.withTx(ctx, func(q Records) error {
		r, ok, err := q.snapshotOnDevice(ctx, d.ID)
		if err != nil {
			return err
		}
		if ok {
			n, err := q.childCount(ctx, r.ID)
			if err != nil {
				return err
			}
			if n > 0 {
				children = true
				return nil
			}
			if err := q.deleteSnapshot(ctx, r.ID); err != nil {
				return err
			}
		}
		dropped = true
		return q.deleteThinDevice(ctx, d.ID)
	})
	if err != nil {
		return false, err
	}
	if dropped {
		l.Error("reconcile: snapshot device missing from the pool; its data is gone, dropped its records")
	}
	return dropped && !children, nil
}
