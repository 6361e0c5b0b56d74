package metadata

// Typed queries for seed 000's snapshots table (migration 0001): the
// activations of S3 images. containerd's snapshot records are elsewhere
// (cd_snapshots, snapshotter_store.go).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Snapshot is one row of seed 000's snapshots table.
type Snapshot struct {
	ID             int64
	ImageID        string
	SnapshotID     string
	SnapshotName   string
	DevicePath     string
	OriginDeviceID string // unpacked_images.device_id it was snapshotted from
	Active         bool
	CreatedAt      time.Time
	DeactivatedAt  time.Time // zero when NULL
	UpdatedAt      time.Time
}

// SnapshotRecord is what the Activate pipeline stores for a snapshot.
type SnapshotRecord struct {
	ImageID        string
	SnapshotID     string
	SnapshotName   string
	DevicePath     string
	OriginDeviceID string
}

const snapshotColumns = `id, image_id, snapshot_id, snapshot_name, device_path, origin_device_id,
	active, created_at, deactivated_at, updated_at`

func scanSnapshot(s rowScanner) (*Snapshot, error) {
	var (
		sn          Snapshot
		deactivated sql.NullTime
	)
	if err := s.Scan(&sn.ID, &sn.ImageID, &sn.SnapshotID, &sn.SnapshotName, &sn.DevicePath, &sn.OriginDeviceID,
		&sn.Active, &sn.CreatedAt, &deactivated, &sn.UpdatedAt); err != nil {
		return nil, err
	}
	sn.DeactivatedAt = deactivated.Time
	return &sn, nil
}

func (d *DB) querySnapshots(ctx context.Context, what, query string, args ...any) ([]*Snapshot, error) {
	return queryAll(ctx, d.db, what, scanSnapshot, query, args...)
}

func (r SnapshotRecord) validate() error {
	if r.ImageID == "" || r.SnapshotID == "" || r.SnapshotName == "" || r.OriginDeviceID == "" {
		return fmt.Errorf("metadata: snapshot %q of image %q (id %q, origin %q): image id, snapshot id, name and origin device id must be non-empty: %w",
			r.SnapshotName, r.ImageID, r.SnapshotID, r.OriginDeviceID, ErrInvalidArgument)
	}
	return nil
}

// upsertSnapshot is seed 000's snapshot insert: a new row is active; an
// existing row with the same name is re-activated (its other columns kept).
const upsertSnapshot = `INSERT INTO snapshots (image_id, snapshot_id, snapshot_name, device_path, origin_device_id, active, created_at)
	VALUES (?, ?, ?, ?, ?, 1, CURRENT_TIMESTAMP)
	ON CONFLICT(snapshot_name) DO UPDATE SET
		active = 1,
		deactivated_at = NULL,
		updated_at = CURRENT_TIMESTAMP`

// CheckSnapshotExists returns image imageID's snapshot named snapshotName,
// or nil (and no error) when there is none. Callers check Active (seed 000).
func (d *DB) CheckSnapshotExists(ctx context.Context, imageID, snapshotName string) (*Snapshot, error) {
	sn, err := scanSnapshot(d.db.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots
		WHERE image_id = ? AND snapshot_name = ?`, imageID, snapshotName))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: does snapshot %q of image %q exist: %w", snapshotName, imageID, err)
	}
	return sn, nil
}

// StoreSnapshot records an active snapshot: a new row, or, when the name is
// already recorded, the existing row marked active again. The image and the
// origin device must exist (foreign keys).
func (d *DB) StoreSnapshot(ctx context.Context, r SnapshotRecord) error {
	if err := r.validate(); err != nil {
		return err
	}
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, upsertSnapshot, r.ImageID, r.SnapshotID, r.SnapshotName, r.DevicePath, r.OriginDeviceID); err != nil {
			return fmt.Errorf("metadata: store snapshot %q of image %q: %w", r.SnapshotName, r.ImageID, err)
		}
		return nil
	})
}

// RegisterActivation is seed 000's Activate register transaction: in one
// transaction, the snapshot is stored (or re-activated) and its image marked
// active with activated_at stamped. Nothing changes if either step fails
// (e.g. the image or origin device does not exist). Repeating it is harmless.
func (d *DB) RegisterActivation(ctx context.Context, r SnapshotRecord) error {
	if err := r.validate(); err != nil {
		return err
	}
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, upsertSnapshot, r.ImageID, r.SnapshotID, r.SnapshotName, r.DevicePath, r.OriginDeviceID); err != nil {
			return fmt.Errorf("metadata: register activation of image %q: store snapshot %q: %w", r.ImageID, r.SnapshotName, err)
		}
		res, err := tx.ExecContext(ctx, `UPDATE images SET activation_status = 'active',
			activated_at = CURRENT_TIMESTAMP,
			failure_reason = CASE WHEN download_status = 'failed' THEN failure_reason END,
			updated_at = CURRENT_TIMESTAMP WHERE image_id = ?`, r.ImageID)
		if err != nil {
			return fmt.Errorf("metadata: register activation of image %q: %w", r.ImageID, err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return fmt.Errorf("metadata: register activation of image %q: %w", r.ImageID, ErrNotFound)
		}
		return nil
	})
}

// GetSnapshotByID returns the snapshot with snapshot_id snapshotID, or an
// error wrapping ErrNotFound.
func (d *DB) GetSnapshotByID(ctx context.Context, snapshotID string) (*Snapshot, error) {
	sn, err := scanSnapshot(d.db.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE snapshot_id = ?`, snapshotID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("metadata: snapshot %q: %w", snapshotID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: get snapshot %q: %w", snapshotID, err)
	}
	return sn, nil
}

// GetSnapshotsByImageID returns every snapshot of image imageID (active or
// not), oldest first; none is an empty list.
func (d *DB) GetSnapshotsByImageID(ctx context.Context, imageID string) ([]*Snapshot, error) {
	return d.querySnapshots(ctx, fmt.Sprintf("snapshots of image %q", imageID),
		`SELECT `+snapshotColumns+` FROM snapshots WHERE image_id = ? ORDER BY id`, imageID)
}

// DeactivateSnapshot marks snapshot snapshotID inactive and stamps
// deactivated_at (kept from the first deactivation when repeated). An
// unknown snapshot wraps ErrNotFound.
func (d *DB) DeactivateSnapshot(ctx context.Context, snapshotID string) error {
	res, err := d.db.ExecContext(ctx, `UPDATE snapshots SET active = 0,
		deactivated_at = COALESCE(deactivated_at, CURRENT_TIMESTAMP),
		updated_at = CURRENT_TIMESTAMP WHERE snapshot_id = ?`, snapshotID)
	if err != nil {
		return fmt.Errorf("metadata: deactivate snapshot %q: %w", snapshotID, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("metadata: deactivate snapshot %q: %w", snapshotID, ErrNotFound)
	}
	return nil
}

// DeleteSnapshot removes snapshot snapshotID's row (cleanup after a failure).
// Deleting an absent snapshot is not an error.
func (d *DB) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if _, err := d.db.ExecContext(ctx, `DELETE FROM snapshots WHERE snapshot_id = ?`, snapshotID); err != nil {
		return fmt.Errorf("metadata: delete snapshot %q: %w", snapshotID, err)
	}
	return nil
}

// ListActiveSnapshots lists the active snapshots, oldest first.
func (d *DB) ListActiveSnapshots(ctx context.Context) ([]*Snapshot, error) {
	return d.querySnapshots(ctx, "list active snapshots",
		`SELECT `+snapshotColumns+` FROM snapshots WHERE active = 1 ORDER BY id`)
}

// ListSnapshots lists every snapshot, active or not, oldest first.
func (d *DB) ListSnapshots(ctx context.Context) ([]*Snapshot, error) {
	return d.querySnapshots(ctx, "list snapshots", `SELECT `+snapshotColumns+` FROM snapshots ORDER BY id`)
}
