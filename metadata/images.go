package metadata

// Typed queries for seed 000's images table (migration 0001, failure_reason
// from 0006).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Download statuses of images.download_status (seed 000).
const (
	DownloadPending     = "pending"
	DownloadDownloading = "downloading"
	DownloadCompleted   = "completed"
	DownloadFailed      = "failed"
)

// Activation statuses of images.activation_status (seed 000).
const (
	ActivationInactive = "inactive"
	ActivationActive   = "active"
	ActivationFailed   = "failed"
)

// ErrNotFound is wrapped by the Get* queries of the seed tables when no row
// matches (the Check* queries return nil instead, as seed 000 says).
var ErrNotFound = errors.New("metadata: not found")

// ErrInvalidArgument is wrapped when an argument breaks a rule the schema
// enforces (an unknown status, a negative size, an empty id).
var ErrInvalidArgument = errors.New("metadata: invalid argument")

// Image is one row of images.
type Image struct {
	ID               int64
	ImageID          string
	S3Key            string
	LocalPath        string
	Checksum         string // "" when NULL
	SizeBytes        int64
	DownloadStatus   string // DownloadPending ... DownloadFailed
	ActivationStatus string // ActivationInactive, ActivationActive or ActivationFailed ("" when NULL)
	FailureReason    string // why the image failed; "" unless failed
	CreatedAt        time.Time
	DownloadedAt     time.Time // zero when NULL
	ActivatedAt      time.Time // zero when NULL
	UpdatedAt        time.Time
}

const imageColumns = `id, image_id, s3_key, local_path, checksum, size_bytes, download_status,
	activation_status, failure_reason, created_at, downloaded_at, activated_at, updated_at`

// imageCols is imageColumns for this database: a read-only DB at a schema
// before migration 6 has no failure_reason column and reads NULL instead.
func (d *DB) imageCols() string {
	if d.noFailureReason {
		return strings.Replace(imageColumns, "failure_reason", "NULL", 1)
	}
	return imageColumns
}

type rowScanner interface{ Scan(dest ...any) error }

func scanImage(s rowScanner) (*Image, error) {
	var (
		img                   Image
		checksum, act, reason sql.NullString
		downloaded, activated sql.NullTime
	)
	if err := s.Scan(&img.ID, &img.ImageID, &img.S3Key, &img.LocalPath, &checksum, &img.SizeBytes,
		&img.DownloadStatus, &act, &reason, &img.CreatedAt, &downloaded, &activated, &img.UpdatedAt); err != nil {
		return nil, err
	}
	img.Checksum, img.ActivationStatus, img.FailureReason = checksum.String, act.String, reason.String
	img.DownloadedAt, img.ActivatedAt = downloaded.Time, activated.Time
	return &img, nil
}

func (d *DB) queryImages(ctx context.Context, what, query string, args ...any) ([]*Image, error) {
	return queryAll(ctx, d.db, what, scanImage, query, args...)
}

// CheckImageDownloaded returns the image stored under s3Key if its download
// completed, or nil (and no error) if there is none or it is not completed.
func (d *DB) CheckImageDownloaded(ctx context.Context, s3Key string) (*Image, error) {
	img, err := scanImage(d.db.QueryRowContext(ctx, `SELECT `+d.imageCols()+` FROM images
		WHERE s3_key = ? AND download_status = 'completed'`, s3Key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: is s3 key %q downloaded: %w", s3Key, err)
	}
	return img, nil
}

// StoreImageMetadata records a completed download (seed 000's store-metadata
// transaction): it inserts the image, or, when s3Key is already recorded,
// updates its path, checksum and size, marks it completed, stamps
// downloaded_at and clears any failure reason. Calling it again with the same
// values is harmless. imageID must not belong to another s3 key (UNIQUE).
func (d *DB) StoreImageMetadata(ctx context.Context, imageID, s3Key, localPath, checksum string, sizeBytes int64) error {
	if imageID == "" || s3Key == "" {
		return fmt.Errorf("metadata: store image metadata (image %q, s3 key %q): image id and s3 key must be non-empty: %w", imageID, s3Key, ErrInvalidArgument)
	}
	if sizeBytes < 0 {
		return fmt.Errorf("metadata: store image metadata for %q: size %d is negative: %w", imageID, sizeBytes, ErrInvalidArgument)
	}
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO images (image_id, s3_key, local_path, checksum, size_bytes, download_status, downloaded_at)
			VALUES (?, ?, ?, ?, ?, 'completed', CURRENT_TIMESTAMP)
			ON CONFLICT(s3_key) DO UPDATE SET
				local_path = excluded.local_path,
				checksum = excluded.checksum,
				size_bytes = excluded.size_bytes,
				download_status = 'completed',
				failure_reason = NULL,
				downloaded_at = CURRENT_TIMESTAMP,
				updated_at = CURRENT_TIMESTAMP`,
			imageID, s3Key, localPath, nullString(checksum), sizeBytes)
		if err != nil {
			return fmt.Errorf("metadata: store image metadata for image %q (s3 key %q): %w", imageID, s3Key, err)
		}
		return nil
	})
}

// ImageFailure describes an image whose download or validation failed.
type ImageFailure struct {
	ImageID   string
	S3Key     string
	LocalPath string // where the tarball was (it should be removed by then)
	SizeBytes int64
	Reason    string // required: what failed and why, e.g. the entry and the rule it broke
}

// MarkImageFailed records that the image under f.S3Key failed to download or
// validate, with the reason: it inserts a row in download_status 'failed'
// or, when the s3 key is known, sets its status to 'failed' and its reason.
func (d *DB) MarkImageFailed(ctx context.Context, f ImageFailure) error {
	if f.ImageID == "" || f.S3Key == "" || f.Reason == "" {
		return fmt.Errorf("metadata: mark image %q (s3 key %q) failed: image id, s3 key and reason must be non-empty: %w", f.ImageID, f.S3Key, ErrInvalidArgument)
	}
	if f.SizeBytes < 0 {
		f.SizeBytes = 0
	}
	_, err := d.db.ExecContext(ctx, `INSERT INTO images (image_id, s3_key, local_path, size_bytes, download_status, failure_reason)
		VALUES (?, ?, ?, ?, 'failed', ?)
		ON CONFLICT(s3_key) DO UPDATE SET
			download_status = 'failed',
			failure_reason = excluded.failure_reason,
			updated_at = CURRENT_TIMESTAMP`,
		f.ImageID, f.S3Key, f.LocalPath, f.SizeBytes, f.Reason)
	if err != nil {
		return fmt.Errorf("metadata: mark image %q (s3 key %q) failed: %w", f.ImageID, f.S3Key, err)
	}
	return nil
}

// GetImageByID returns the image with image_id imageID, or an error wrapping
// ErrNotFound.
func (d *DB) GetImageByID(ctx context.Context, imageID string) (*Image, error) {
	img, err := scanImage(d.db.QueryRowContext(ctx, `SELECT `+d.imageCols()+` FROM images WHERE image_id = ?`, imageID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("metadata: image %q: %w", imageID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: get image %q: %w", imageID, err)
	}
	return img, nil
}

// UpdateImageActivationStatus sets the activation status of image imageID
// (ActivationInactive, ActivationActive or ActivationFailed); 'active' also
// stamps activated_at and clears any failure reason. An unknown image wraps
// ErrNotFound; an unknown status wraps ErrInvalidArgument.
func (d *DB) UpdateImageActivationStatus(ctx context.Context, imageID, status string) error {
	return d.setActivation(ctx, imageID, status, "")
}

// MarkImageActivationFailed sets activation_status 'failed' on image imageID
// with the reason. An unknown image wraps ErrNotFound.
func (d *DB) MarkImageActivationFailed(ctx context.Context, imageID, reason string) error {
	if reason == "" {
		return fmt.Errorf("metadata: mark activation of image %q failed: reason must be non-empty: %w", imageID, ErrInvalidArgument)
	}
	return d.setActivation(ctx, imageID, ActivationFailed, reason)
}

func (d *DB) setActivation(ctx context.Context, imageID, status, reason string) error {
	var q string
	switch status {
	case ActivationActive:
		q = `UPDATE images SET activation_status = 'active', activated_at = CURRENT_TIMESTAMP,
			failure_reason = CASE WHEN download_status = 'failed' THEN failure_reason END,
			updated_at = CURRENT_TIMESTAMP WHERE image_id = ?`
	case ActivationInactive:
		q = `UPDATE images SET activation_status = 'inactive', updated_at = CURRENT_TIMESTAMP WHERE image_id = ?`
	case ActivationFailed:
		q = `UPDATE images SET activation_status = 'failed', failure_reason = COALESCE(?2, failure_reason),
			updated_at = CURRENT_TIMESTAMP WHERE image_id = ?1`
	default:
		return fmt.Errorf("metadata: activation status %q of image %q: must be inactive, active or failed: %w", status, imageID, ErrInvalidArgument)
	}
	args := []any{imageID}
	if status == ActivationFailed {
		args = append(args, nullString(reason))
	}
	res, err := d.db.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("metadata: set activation status of image %q to %s: %w", imageID, status, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("metadata: set activation status of image %q to %s: %w", imageID, status, ErrNotFound)
	}
	return nil
}

// ListImages lists images, oldest first; a non-empty downloadStatus keeps
// only images in that download status.
func (d *DB) ListImages(ctx context.Context, downloadStatus string) ([]*Image, error) {
	if downloadStatus == "" {
		return d.queryImages(ctx, "list images", `SELECT `+d.imageCols()+` FROM images ORDER BY id`)
	}
	return d.queryImages(ctx, "list images in status "+downloadStatus,
		`SELECT `+d.imageCols()+` FROM images WHERE download_status = ? ORDER BY id`, downloadStatus)
}

// DeleteImage removes image imageID; its unpacked_images and snapshots rows
// go with it (ON DELETE CASCADE), except that a snapshot still referencing
// the unpacked device of another image makes it fail (RESTRICT). Deleting an
// absent image is not an error.
func (d *DB) DeleteImage(ctx context.Context, imageID string) error {
	if _, err := d.db.ExecContext(ctx, `DELETE FROM images WHERE image_id = ?`, imageID); err != nil {
		return fmt.Errorf("metadata: delete image %q: %w", imageID, err)
	}
	return nil
}

func nullString(s string) sql.NullString {
	return sql.NullString{String: s, Valid: s != ""}
}
