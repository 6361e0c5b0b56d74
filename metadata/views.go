package metadata

// Read-time views of the seed tables for operators (`ls`), after seed 003:
// fields that can be derived from the stored rows (an image's overall state,
// a device's reference count, a lock's age and staleness) are computed when
// read, never stored. Each view is one SELECT, so it is consistent even while
// the daemon writes.

import (
	"context"
	"database/sql"
	"time"
)

// Overall image states derived by ImageState.
const (
	ImageStatePending    = "pending"    // not downloaded yet (pending or downloading)
	ImageStateDownloaded = "downloaded" // tarball stored, not unpacked (or not verified)
	ImageStateUnpacked   = "unpacked"   // verified unpacked device, no active snapshot
	ImageStateActive     = "active"     // at least one active snapshot
	ImageStateFailed     = "failed"     // download/validation or activation failed
)

// ImageState derives an image's overall state from its rows: failed when its
// download or activation failed; otherwise active when it has an active
// snapshot; unpacked when it has a verified unpacked device; downloaded when
// its download completed; pending otherwise.
func ImageState(downloadStatus, activationStatus string, verifiedUnpack bool, activeSnapshots int) string {
	switch {
	case downloadStatus == DownloadFailed || activationStatus == ActivationFailed:
		return ImageStateFailed
	case activeSnapshots > 0:
		return ImageStateActive
	case verifiedUnpack:
		return ImageStateUnpacked
	case downloadStatus == DownloadCompleted:
		return ImageStateDownloaded
	}
	return ImageStatePending
}

// ImageView is an image with what the other tables say about it.
type ImageView struct {
	ImageID          string    `json:"image_id"`
	S3Key            string    `json:"s3_key"`
	State            string    `json:"state"` // derived: ImageStatePending ... ImageStateFailed
	DownloadStatus   string    `json:"download_status"`
	ActivationStatus string    `json:"activation_status"`
	SizeBytes        int64     `json:"size_bytes"`
	Checksum         string    `json:"checksum,omitempty"`
	LocalPath        string    `json:"local_path"`
	DeviceID         string    `json:"device_id,omitempty"`
	DeviceName       string    `json:"device_name,omitempty"`
	LayoutVerified   bool      `json:"layout_verified"`
	Snapshots        int       `json:"snapshots"`        // derived: snapshot rows of the image
	ActiveSnapshots  int       `json:"active_snapshots"` // derived: active ones
	LockedBy         string    `json:"locked_by,omitempty"`
	FailureReason    string    `json:"failure_reason,omitempty"`
	CreatedAt        time.Time `json:"created_at"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// ImageViews lists every image, oldest first, with its derived state.
func (d *DB) ImageViews(ctx context.Context) ([]ImageView, error) {
	reason := "i.failure_reason"
	if d.noFailureReason {
		reason = "NULL"
	}
	return queryAll(ctx, d.db, "list image views", func(s rowScanner) (ImageView, error) {
		var v ImageView
		err := s.Scan(&v.ImageID, &v.S3Key, &v.DownloadStatus, &v.ActivationStatus, &v.SizeBytes, &v.Checksum,
			&v.LocalPath, &v.FailureReason, &v.CreatedAt, &v.UpdatedAt, &v.DeviceID, &v.DeviceName, &v.LayoutVerified,
			&v.Snapshots, &v.ActiveSnapshots, &v.LockedBy)
		v.State = ImageState(v.DownloadStatus, v.ActivationStatus, v.LayoutVerified, v.ActiveSnapshots)
		return v, err
	}, `SELECT i.image_id, i.s3_key, i.download_status, COALESCE(i.activation_status, ''),
		i.size_bytes, COALESCE(i.checksum, ''), i.local_path, COALESCE(`+reason+`, ''), i.created_at, i.updated_at,
		COALESCE(u.device_id, ''), COALESCE(u.device_name, ''), COALESCE(u.layout_verified, 0),
		(SELECT count(*) FROM snapshots s WHERE s.image_id = i.image_id),
		(SELECT count(*) FROM snapshots s WHERE s.image_id = i.image_id AND s.active = 1),
		COALESCE(l.locked_by, '')
		FROM images i
		LEFT JOIN unpacked_images u ON u.image_id = i.image_id
		LEFT JOIN image_locks l ON l.image_id = i.image_id
		ORDER BY i.id`)
}

// UnpackedView is an unpacked device with its reference count.
type UnpackedView struct {
	ImageID        string    `json:"image_id"`
	DeviceID       string    `json:"device_id"`
	DeviceName     string    `json:"device_name"`
	DevicePath     string    `json:"device_path"`
	SizeBytes      int64     `json:"size_bytes"`
	FileCount      int64     `json:"file_count"`
	LayoutVerified bool      `json:"layout_verified"`
	RefCount       int       `json:"ref_count"`   // derived: snapshot rows whose origin is this device
	ActiveRefs     int       `json:"active_refs"` // derived: active ones
	UnpackedAt     time.Time `json:"unpacked_at"`
}

// UnpackedViews lists every unpacked device, oldest first, with its
// reference count.
func (d *DB) UnpackedViews(ctx context.Context) ([]UnpackedView, error) {
	return queryAll(ctx, d.db, "list unpacked views", func(s rowScanner) (UnpackedView, error) {
		var v UnpackedView
		err := s.Scan(&v.ImageID, &v.DeviceID, &v.DeviceName, &v.DevicePath, &v.SizeBytes, &v.FileCount,
			&v.LayoutVerified, &v.UnpackedAt, &v.RefCount, &v.ActiveRefs)
		return v, err
	}, `SELECT u.image_id, u.device_id, u.device_name, u.device_path, u.size_bytes,
		u.file_count, u.layout_verified, u.unpacked_at,
		(SELECT count(*) FROM snapshots s WHERE s.origin_device_id = u.device_id),
		(SELECT count(*) FROM snapshots s WHERE s.origin_device_id = u.device_id AND s.active = 1)
		FROM unpacked_images u ORDER BY u.id`)
}

// SnapshotView is a seed snapshot with its image's key and origin device.
type SnapshotView struct {
	SnapshotID       string     `json:"snapshot_id"`
	SnapshotName     string     `json:"snapshot_name"`
	ImageID          string     `json:"image_id"`
	S3Key            string     `json:"s3_key"`
	DevicePath       string     `json:"device_path"`
	OriginDeviceID   string     `json:"origin_device_id"`
	OriginDeviceName string     `json:"origin_device_name"`
	Active           bool       `json:"active"`
	CreatedAt        time.Time  `json:"created_at"`
	DeactivatedAt    *time.Time `json:"deactivated_at,omitempty"`
}

// SnapshotViews lists every seed snapshot (active or not), oldest first.
func (d *DB) SnapshotViews(ctx context.Context) ([]SnapshotView, error) {
	return queryAll(ctx, d.db, "list snapshot views", func(s rowScanner) (SnapshotView, error) {
		var (
			v           SnapshotView
			deactivated sql.NullTime
		)
		err := s.Scan(&v.SnapshotID, &v.SnapshotName, &v.ImageID, &v.S3Key, &v.DevicePath, &v.OriginDeviceID,
			&v.OriginDeviceName, &v.Active, &v.CreatedAt, &deactivated)
		if deactivated.Valid {
			t := deactivated.Time
			v.DeactivatedAt = &t
		}
		return v, err
	}, `SELECT s.snapshot_id, s.snapshot_name, s.image_id, COALESCE(i.s3_key, ''),
		s.device_path, s.origin_device_id, COALESCE(u.device_name, ''), s.active, s.created_at, s.deactivated_at
		FROM snapshots s
		LEFT JOIN images i ON i.image_id = s.image_id
		LEFT JOIN unpacked_images u ON u.device_id = s.origin_device_id
		ORDER BY s.id`)
}

// LockView is an image lock with its age and staleness at the time of
// listing.
type LockView struct {
	ImageID  string        `json:"image_id"`
	LockedBy string        `json:"locked_by"`
	LockedAt time.Time     `json:"locked_at"`
	Age      time.Duration `json:"age_ns"` // derived: now - locked_at
	Stale    bool          `json:"stale"`  // derived: Age > the stale age
}

// LockViews lists every lock, newest first, with its age at the database
// clock's now and whether it is older than staleAge (DefaultStaleLockAge
// when zero).
func (d *DB) LockViews(ctx context.Context, staleAge time.Duration) ([]LockView, error) {
	if staleAge <= 0 {
		staleAge = DefaultStaleLockAge
	}
	locks, err := d.ListImageLocks(ctx)
	if err != nil {
		return nil, err
	}
	now := d.now()
	out := make([]LockView, 0, len(locks))
	for _, l := range locks {
		out = append(out, LockView{ImageID: l.ImageID, LockedBy: l.LockedBy, LockedAt: l.LockedAt,
			Age: l.Age(now), Stale: l.Stale(now, staleAge)})
	}
	return out, nil
}
