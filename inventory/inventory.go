// Package inventory is the operator's read-only view of what the database
// holds: the listings `ls` prints and `db` checks (images, unpacked
// images, chains, activations, locks). They read the SQL views of
// migration 8 (images, unpacked_images, snapshots, image_locks) and the
// tables they join, deriving every field from the stored facts at read
// time (an image's state, a device's reference count, a lock's age); each
// listing is one SELECT, consistent even while the daemon writes, and none
// writes.
package inventory

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// Values of the images view's status columns.
const (
	DownloadPending   = "pending"
	DownloadCompleted = "completed"
	DownloadFailed    = "failed"

	ActivationInactive = "inactive"
	ActivationActive   = "active"
	ActivationFailed   = "failed"
)

// Overall image states, as Image.State derives them.
const (
	ImageStatePending  = "pending"  // never pulled successfully, no failure recorded
	ImageStateUnpacked = "unpacked" // pulled; no activation now
	ImageStateActive   = "active"   // pulled and activated
	ImageStateFailed   = "failed"   // the last pull failed
)

// imageState derives an image's overall state: failed when its last pull
// failed (a failure is recorded: the views' statuses say so only when no
// activation of an earlier pull is left); otherwise active when it has an
// activation; unpacked when it was pulled; pending otherwise.
func imageState(downloadStatus, activationStatus, failureReason string) string {
	switch {
	case failureReason != "" || downloadStatus == DownloadFailed || activationStatus == ActivationFailed:
		return ImageStateFailed
	case activationStatus == ActivationActive:
		return ImageStateActive
	case downloadStatus == DownloadCompleted:
		return ImageStateUnpacked
	}
	return ImageStatePending
}

type rowScanner interface{ Scan(dest ...any) error }

// list is metadata.QueryAll on db's statements, with rows read through
// rowScanner and errors wrapped with what (the listing, for the message).
func list[T any](ctx context.Context, db *metadata.DB, what string, scan func(rowScanner) (T, error), query string, args ...any) ([]T, error) {
	out, err := metadata.QueryAll(ctx, db.Statements(), func(r *sql.Rows) (T, error) { return scan(r) }, query, args...)
	if err != nil {
		return nil, fmt.Errorf("inventory: %s: %w", what, err)
	}
	return out, nil
}

// sqlTime scans the text times of the views ("YYYY-MM-DD HH:MM:SS", UTC);
// NULL is the zero time.
type sqlTime struct{ t time.Time }

func (s *sqlTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		s.t = time.Time{}
	case time.Time:
		s.t = x.UTC()
	case string:
		return s.parse(x)
	case []byte:
		return s.parse(string(x))
	default:
		return fmt.Errorf("time column holds %T", v)
	}
	return nil
}

func (s *sqlTime) parse(text string) error {
	t, err := time.Parse(time.DateTime, text)
	if err != nil {
		return fmt.Errorf("time column %q: %w", text, err)
	}
	s.t = t.UTC()
	return nil
}

// Image is an image with what the other records say about it.
type Image struct {
	ImageID          string    `json:"image_id"`
	S3Key            string    `json:"s3_key"` // the source: s3://bucket/key or s3://bucket/prefix/
	Names            []string  `json:"names"`
	State            string    `json:"state"` // derived: ImageStatePending ... ImageStateFailed
	DownloadStatus   string    `json:"download_status"`
	ActivationStatus string    `json:"activation_status"`
	Layers           int       `json:"layers"`
	SizeBytes        int64     `json:"size_bytes"` // the layer objects' sizes, summed
	Checksum         string    `json:"checksum,omitempty"`
	LocalPath        string    `json:"local_path"`
	DeviceID         string    `json:"device_id,omitempty"` // the top chain's device
	DeviceName       string    `json:"device_name,omitempty"`
	ActiveSnapshots  int       `json:"active_snapshots"` // derived: 1 with an activation
	LockedBy         string    `json:"locked_by,omitempty"`
	FailureReason    string    `json:"failure_reason,omitempty"`
	CreatedAt        time.Time `json:"created_at"`
	UpdatedAt        time.Time `json:"updated_at"`
	// LastUsedAt is the image's last use, the later of its last pull (one
	// answered from the records too) and its last activation or touch:
	// what garbage collection removes the least recent of first. Zero, and
	// left out of JSON, for an image never pulled (the time of a failed
	// try, which retention reads, is no use).
	LastUsedAt time.Time `json:"last_used_at,omitzero"`
}

// Images lists every image, oldest first, with its derived state.
func Images(ctx context.Context, db *metadata.DB) ([]Image, error) {
	return list(ctx, db, "list image views", func(s rowScanner) (Image, error) {
		var (
			v                  Image
			created, updated   sqlTime
			names              string
			checksum, lockedBy sql.NullString
			used               sql.NullInt64
		)
		err := s.Scan(&v.ImageID, &v.S3Key, &v.DownloadStatus, &v.ActivationStatus, &v.SizeBytes, &checksum,
			&v.LocalPath, &v.FailureReason, &created, &updated, &v.DeviceID, &v.DeviceName,
			&v.ActiveSnapshots, &lockedBy, &v.Layers, &names, &used)
		v.Checksum, v.LockedBy = checksum.String, lockedBy.String
		v.CreatedAt, v.UpdatedAt = created.t, updated.t
		if used.Valid {
			v.LastUsedAt = time.Unix(0, used.Int64).UTC()
		}
		v.State = imageState(v.DownloadStatus, v.ActivationStatus, v.FailureReason)
		v.Names = []string{}
		if names != "" {
			v.Names = strings.Split(names, "\n")
		}
		return v, err
	}, `SELECT i.image_id, i.s3_key, i.download_status, i.activation_status, i.size_bytes, i.checksum,
		i.local_path, COALESCE(i.failure_reason, ''), i.created_at, i.updated_at,
		COALESCE(u.device_id, ''), COALESCE(u.device_name, ''),
		(SELECT count(*) FROM snapshots s WHERE s.image_id = i.image_id),
		(SELECT l.locked_by FROM image_locks l WHERE l.image_id = i.image_id LIMIT 1),
		(SELECT count(*) FROM image_layers il WHERE il.image_id = i.image_id),
		COALESCE((SELECT group_concat(n.name, char(10)) FROM (SELECT name FROM image_names
			WHERE image_id = i.image_id ORDER BY registered_ns, name) n), ''),
		(SELECT CASE WHEN s.pulled_ns IS NOT NULL THEN MAX(COALESCE(s.used_ns, 0), s.pulled_ns) END
			FROM s3_images s WHERE s.image_id = i.image_id)
		FROM images i
		LEFT JOIN unpacked_images u ON u.image_id = i.image_id
		ORDER BY i.id`)
}

// UnpackedImage is an unpacked image: its top chain's device, with its
// reference count.
type UnpackedImage struct {
	ImageID        string    `json:"image_id"`
	DeviceID       string    `json:"device_id"`
	DeviceName     string    `json:"device_name"`
	DevicePath     string    `json:"device_path"`
	SizeBytes      int64     `json:"size_bytes"`
	FileCount      int64     `json:"file_count"`
	LayoutVerified bool      `json:"layout_verified"`
	RefCount       int       `json:"ref_count"`   // derived: activations on this device
	ActiveRefs     int       `json:"active_refs"` // derived: active ones (every activation is active)
	UnpackedAt     time.Time `json:"unpacked_at"`
}

// UnpackedImages lists every unpacked image, oldest first, with the
// reference count of its device: the active snapshots on it whose key has
// metadata.ActivationPrefix, whatever image they belong to.
func UnpackedImages(ctx context.Context, db *metadata.DB) ([]UnpackedImage, error) {
	return list(ctx, db, "list unpacked views", func(s rowScanner) (UnpackedImage, error) {
		var (
			v  UnpackedImage
			at sqlTime
		)
		err := s.Scan(&v.ImageID, &v.DeviceID, &v.DeviceName, &v.DevicePath, &v.SizeBytes, &v.FileCount,
			&v.LayoutVerified, &at, &v.RefCount)
		v.UnpackedAt, v.ActiveRefs = at.t, v.RefCount
		return v, err
	}, `SELECT u.image_id, u.device_id, u.device_name, u.device_path, u.size_bytes,
		u.file_count, u.layout_verified, u.unpacked_at,
		(SELECT count(*) FROM cd_snapshots a JOIN cd_snapshots o ON o.id = a.parent_id
			WHERE o.device_id = CAST(u.device_id AS INTEGER) AND a.kind = 'active' AND a.key LIKE ? || '%')
		FROM unpacked_images u ORDER BY u.id`, metadata.ActivationPrefix)
}

// Chain is an unpacked chain: one layer on its parent chain, and its
// device.
type Chain struct {
	ChainID    string    `json:"chain_id"`
	Parent     string    `json:"parent_chain_id"`
	DiffID     string    `json:"diff_id"`
	DeviceID   uint32    `json:"device_id"`
	DeviceName string    `json:"device_name"`
	SizeBytes  int64     `json:"size_bytes"`
	FileCount  int64     `json:"file_count"`
	Images     int       `json:"images"` // derived: images with this chain among their layers
	Children   int       `json:"children"`
	UnpackedAt time.Time `json:"unpacked_at"`
}

// Chains lists every unpacked chain whose snapshot exists, oldest
// first, with the images that use it and its children.
func Chains(ctx context.Context, db *metadata.DB) ([]Chain, error) {
	return list(ctx, db, "list chains", func(s rowScanner) (Chain, error) {
		var (
			v  Chain
			ns int64
		)
		err := s.Scan(&v.ChainID, &v.Parent, &v.DiffID, &v.DeviceID, &v.DeviceName, &v.SizeBytes, &v.FileCount, &ns, &v.Images, &v.Children)
		v.UnpackedAt = time.Unix(0, ns).UTC()
		return v, err
	}, `SELECT c.chain_id, c.parent_chain_id, c.diff_id, s.device_id, t.name, c.size_bytes, c.file_count, c.unpacked_ns,
		(SELECT count(DISTINCT il.image_id) FROM image_layers il WHERE il.chain_id = c.chain_id),
		(SELECT count(*) FROM cd_snapshots k WHERE k.parent_id = s.id)
		FROM chains c
		JOIN cd_snapshots s ON s.key = c.chain_id AND s.kind = 'committed'
		JOIN thin_devices t ON t.device_id = s.device_id
		ORDER BY c.unpacked_ns, c.chain_id`)
}

// Snapshot is an image's activation with its image's source and origin
// device.
type Snapshot struct {
	SnapshotID       string    `json:"snapshot_id"`
	SnapshotName     string    `json:"snapshot_name"`
	ImageID          string    `json:"image_id"`
	S3Key            string    `json:"s3_key"`
	DevicePath       string    `json:"device_path"`
	OriginDeviceID   string    `json:"origin_device_id"`
	OriginDeviceName string    `json:"origin_device_name"`
	Active           bool      `json:"active"`
	CreatedAt        time.Time `json:"created_at"`
}

// Snapshots lists every activation, oldest first.
func Snapshots(ctx context.Context, db *metadata.DB) ([]Snapshot, error) {
	return list(ctx, db, "list snapshot views", func(s rowScanner) (Snapshot, error) {
		var (
			v  Snapshot
			at sqlTime
		)
		err := s.Scan(&v.SnapshotID, &v.SnapshotName, &v.ImageID, &v.S3Key, &v.DevicePath, &v.OriginDeviceID,
			&v.OriginDeviceName, &v.Active, &at)
		v.CreatedAt = at.t
		return v, err
	}, `SELECT s.snapshot_id, s.snapshot_name, s.image_id, COALESCE(i.s3_key, ''),
		s.device_path, s.origin_device_id, COALESCE(t.name, ''), s.active, s.created_at
		FROM snapshots s
		LEFT JOIN images i ON i.image_id = s.image_id
		LEFT JOIN thin_devices t ON t.device_id = CAST(s.origin_device_id AS INTEGER)
		ORDER BY s.id`)
}

// Lock is what a live run holds, with its age at the time of listing.
type Lock struct {
	ImageID  string        `json:"image_id"` // the run's idempotency id: an object, chain or image
	LockedBy string        `json:"locked_by"`
	LockedAt time.Time     `json:"locked_at"`
	Age      time.Duration `json:"age_ns"` // derived: now - locked_at
}

// Locks lists every lock (running run), newest first, with its age at
// now.
func Locks(ctx context.Context, db *metadata.DB, now time.Time) ([]Lock, error) {
	return list(ctx, db, "list locks", func(s rowScanner) (Lock, error) {
		var (
			v  Lock
			at int64
		)
		err := s.Scan(&v.ImageID, &at, &v.LockedBy)
		v.LockedAt = time.Unix(at, 0).UTC()
		v.Age = now.Sub(v.LockedAt)
		return v, err
	}, `SELECT image_id, locked_at, locked_by FROM image_locks ORDER BY locked_at DESC, image_id`)
}
