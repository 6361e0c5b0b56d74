package metadata

// Typed queries for seed 000's unpacked_images table (migration 0001).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// UnpackedImage is one row of unpacked_images: an image extracted into a
// device-mapper thin device.
type UnpackedImage struct {
	ID             int64
	ImageID        string
	DeviceID       string // thin device id, as text (seed 000)
	DeviceName     string
	DevicePath     string
	SizeBytes      int64
	FileCount      int64
	LayoutVerified bool
	CreatedAt      time.Time
	UnpackedAt     time.Time
	UpdatedAt      time.Time
}

// UnpackedImageRecord is what the Unpack pipeline's update-db step stores.
type UnpackedImageRecord struct {
	ImageID    string
	DeviceID   string
	DeviceName string
	DevicePath string
	SizeBytes  int64
	FileCount  int64
}

const unpackedColumns = `id, image_id, device_id, device_name, device_path, size_bytes, file_count,
	layout_verified, created_at, unpacked_at, updated_at`

func scanUnpacked(s rowScanner) (*UnpackedImage, error) {
	var u UnpackedImage
	if err := s.Scan(&u.ID, &u.ImageID, &u.DeviceID, &u.DeviceName, &u.DevicePath, &u.SizeBytes, &u.FileCount,
		&u.LayoutVerified, &u.CreatedAt, &u.UnpackedAt, &u.UpdatedAt); err != nil {
		return nil, err
	}
	return &u, nil
}

func (d *DB) oneUnpacked(ctx context.Context, what string, notFound error, query string, args ...any) (*UnpackedImage, error) {
	u, err := scanUnpacked(d.db.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		if notFound == nil {
			return nil, nil
		}
		return nil, fmt.Errorf("metadata: %s: %w", what, notFound)
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: %s: %w", what, err)
	}
	return u, nil
}

// CheckImageUnpacked returns the unpacked record of image imageID, or nil
// (and no error) when it has none. Callers check LayoutVerified (seed 000).
func (d *DB) CheckImageUnpacked(ctx context.Context, imageID string) (*UnpackedImage, error) {
	return d.oneUnpacked(ctx, fmt.Sprintf("is image %q unpacked", imageID), nil,
		`SELECT `+unpackedColumns+` FROM unpacked_images WHERE image_id = ?`, imageID)
}

// StoreUnpackedImage records a verified unpack (seed 000's update-db
// transaction): it inserts the record with layout_verified = 1, or, when the
// image already has one, replaces its device, sizes and counts, sets
// layout_verified and stamps unpacked_at. Calling it again with the same
// values is harmless. The image must exist (foreign key) and the device id
// and name must not belong to another image (UNIQUE).
func (d *DB) StoreUnpackedImage(ctx context.Context, r UnpackedImageRecord) error {
	if r.ImageID == "" || r.DeviceID == "" || r.DeviceName == "" {
		return fmt.Errorf("metadata: store unpacked image %q (device %q, name %q): image id, device id and device name must be non-empty: %w", r.ImageID, r.DeviceID, r.DeviceName, ErrInvalidArgument)
	}
	if r.SizeBytes < 0 || r.FileCount < 0 {
		return fmt.Errorf("metadata: store unpacked image %q: size %d and file count %d must not be negative: %w", r.ImageID, r.SizeBytes, r.FileCount, ErrInvalidArgument)
	}
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO unpacked_images (image_id, device_id, device_name, device_path, size_bytes, file_count, layout_verified, unpacked_at)
			VALUES (?, ?, ?, ?, ?, ?, 1, CURRENT_TIMESTAMP)
			ON CONFLICT(image_id) DO UPDATE SET
				device_id = excluded.device_id,
				device_name = excluded.device_name,
				device_path = excluded.device_path,
				size_bytes = excluded.size_bytes,
				file_count = excluded.file_count,
				layout_verified = 1,
				unpacked_at = CURRENT_TIMESTAMP,
				updated_at = CURRENT_TIMESTAMP`,
			r.ImageID, r.DeviceID, r.DeviceName, r.DevicePath, r.SizeBytes, r.FileCount)
		if err != nil {
			return fmt.Errorf("metadata: store unpacked image %q (device %s %s): %w", r.ImageID, r.DeviceID, r.DeviceName, err)
		}
		return nil
	})
}

// GetUnpackedImageByID returns the unpacked record of image imageID, or an
// error wrapping ErrNotFound.
func (d *DB) GetUnpackedImageByID(ctx context.Context, imageID string) (*UnpackedImage, error) {
	return d.oneUnpacked(ctx, fmt.Sprintf("unpacked image %q", imageID), ErrNotFound,
		`SELECT `+unpackedColumns+` FROM unpacked_images WHERE image_id = ?`, imageID)
}

// GetUnpackedImageByDeviceID returns the unpacked record whose device id is
// deviceID, or an error wrapping ErrNotFound.
func (d *DB) GetUnpackedImageByDeviceID(ctx context.Context, deviceID string) (*UnpackedImage, error) {
	return d.oneUnpacked(ctx, fmt.Sprintf("unpacked image with device id %q", deviceID), ErrNotFound,
		`SELECT `+unpackedColumns+` FROM unpacked_images WHERE device_id = ?`, deviceID)
}

// DeleteUnpackedImage removes the unpacked record of image imageID (cleanup
// after a failed unpack). It fails while a snapshot row still references the
// device (ON DELETE RESTRICT). Deleting an absent record is not an error.
func (d *DB) DeleteUnpackedImage(ctx context.Context, imageID string) error {
	if _, err := d.db.ExecContext(ctx, `DELETE FROM unpacked_images WHERE image_id = ?`, imageID); err != nil {
		return fmt.Errorf("metadata: delete unpacked image %q: %w", imageID, err)
	}
	return nil
}

// ListUnpackedImages lists every unpacked record, oldest first.
func (d *DB) ListUnpackedImages(ctx context.Context) ([]*UnpackedImage, error) {
	return queryAll(ctx, d.db, "list unpacked images", scanUnpacked, `SELECT `+unpackedColumns+` FROM unpacked_images ORDER BY id`)
}
