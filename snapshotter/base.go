package snapshotter

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// ensureBase returns the pool's base device, creating and formatting it the
// first time: create_thin, activate, format (the pool's Format: mkfs, and
// the empty root containerd expects), deactivate. The outcome is recorded
// only after all of that succeeded; until then an intent row names the id,
// so a crash leaves nothing that reconciliation cannot roll back.
func (s *Snapshotter) ensureBase(ctx context.Context) (*ThinDevice, error) {
	s.baseMu.Lock()
	defer s.baseMu.Unlock()
	if s.base != nil {
		return s.base, nil
	}
	if d, ok, err := s.reads().baseDevice(ctx); err != nil {
		return nil, err
	} else if ok {
		if d.FSType != s.cfg.FSType {
			log.G(ctx).WithFields(log.Fields{"pool": s.pool.Name(), "base_fs": d.FSType, "config_fs": s.cfg.FSType}).
				Warn("pool's base device keeps the filesystem it was formatted with")
		}
		s.base = &d
		return s.base, nil
	}

	var (
		intentID int64
		id       uint32
		name     string
	)
	err := s.withTx(ctx, func(q Records) error {
		var err error
		id, err = probeID(ctx, candidateID("", baseSeedKey), q.thinIDUsed)
		if err != nil {
			return err
		}
		name = baseDeviceName(s.pool.Name(), id)
		intentID, err = q.insertIntent(ctx, DeviceIntent{Op: intentFormatBase, DeviceID: id, Name: name, CreatedNs: nowNs()})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("base device of pool %s: record intent: %w", s.pool.Name(), err)
	}
	plan := createPlan{intentID: intentID, id: id, name: name}
	logger := log.G(ctx).WithFields(log.Fields{"pool": s.pool.Name(), "thin_id": id, "device": name, "fs": s.cfg.FSType})
	// From here the call ends with the outcome or a rollback recorded,
	// whatever its caller does (see detached).
	fctx, cancel := detached(ctx)
	defer cancel()
	if err := s.step("base:intent"); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		s.rollbackCreate(fctx, plan, false, err)
		return nil, fmt.Errorf("base device of pool %s: caller gone before create_thin: %w", s.pool.Name(), err)
	}
	if err := s.pool.CreateThin(fctx, id); err != nil {
		if errors.Is(err, thinpool.ErrExists) {
			// Not ours: never touch it, never reuse the id. The next call
			// chooses another.
			if qerr := s.quarantineAndDrop(fctx, plan, "found in pool while creating the base device; no record explains it"); qerr != nil {
				err = errors.Join(err, fmt.Errorf("quarantine thin id %d: %w", id, qerr))
			}
		} else {
			s.rollbackCreate(fctx, plan, false, err)
		}
		return nil, exhausted(fmt.Errorf("base device of pool %s: create_thin %d: %w", s.pool.Name(), id, err))
	}
	// mkfs follows the caller's cancellation (it is the long part); the
	// rollback of what it leaves does not.
	if err := s.formatBase(ctx, name, id); err != nil {
		s.rollbackCreate(fctx, plan, true, err)
		return nil, fmt.Errorf("base device of pool %s: %w", s.pool.Name(), err)
	}
	if err := s.step("base:formatted"); err != nil {
		return nil, err
	}
	now := nowNs()
	d := ThinDevice{ID: id, Name: name, Role: ThinRoleBase, State: ThinStateInactive,
		SizeBytes: s.cfg.BaseImageSize.Bytes(), FSType: s.cfg.FSType, CreatedNs: now, UpdatedNs: now}
	err = s.withTx(fctx, func(q Records) error {
		if err := q.InsertThinDevice(fctx, d); err != nil {
			return err
		}
		return q.deleteIntent(fctx, intentID)
	})
	if err != nil {
		s.rollbackCreate(fctx, plan, true, err)
		return nil, fmt.Errorf("base device of pool %s: record outcome: %w", s.pool.Name(), err)
	}
	logger.Info("base device created and formatted")
	s.base = &d
	return s.base, nil
}

func (s *Snapshotter) formatBase(ctx context.Context, name string, id uint32) error {
	path, err := s.pool.Activate(ctx, name, id, s.cfg.BaseImageSize.Bytes())
	if err != nil {
		return fmt.Errorf("activate %s: %w", name, err)
	}
	if err := s.pool.Format(ctx, path, thinpool.FSType(s.cfg.FSType), s.cfg.MkfsOptions); err != nil {
		return fmt.Errorf("format %s as %s: %w", path, s.cfg.FSType, err)
	}
	if err := s.pool.Deactivate(ctx, name); err != nil {
		return fmt.Errorf("deactivate %s after formatting it: %w", name, err)
	}
	return nil
}
