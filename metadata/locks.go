package metadata

// Typed queries for seed 000's image_locks table (migration 0002): one
// exclusive lock per image being unpacked, across goroutines and processes.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// DefaultStaleLockAge is seed 000's stale-lock threshold: a lock held longer
// than this is presumed left behind by a crashed holder.
const DefaultStaleLockAge = time.Hour

// ErrImageLocked is wrapped (through *LockHeldError) by AcquireImageLock when
// another holder has the image's lock.
var ErrImageLocked = errors.New("metadata: image is locked")

// ImageLock is one row of image_locks.
type ImageLock struct {
	ImageID  string
	LockedBy string
	LockedAt time.Time // second precision (locked_at is unix seconds)
}

// Age is how long the lock has been held at now (never negative).
func (l ImageLock) Age(now time.Time) time.Duration {
	if a := now.Sub(l.LockedAt); a > 0 {
		return a
	}
	return 0
}

// Stale reports whether the lock has been held longer than maxAge at now.
func (l ImageLock) Stale(now time.Time, maxAge time.Duration) bool {
	return l.Age(now) > maxAge
}

// LockHeldError is AcquireImageLock's error when the lock is taken: it names
// the holder and since when. errors.Is(err, ErrImageLocked) is true.
type LockHeldError struct {
	ImageLock
}

// Error names the image, the holder and since when (UTC, RFC 3339).
func (e *LockHeldError) Error() string {
	return fmt.Sprintf("metadata: image %q is locked by %q since %s", e.ImageID, e.LockedBy, e.LockedAt.UTC().Format(time.RFC3339))
}

// Unwrap makes errors.Is(err, ErrImageLocked) true.
func (e *LockHeldError) Unwrap() error { return ErrImageLocked }

// now is the clock of the lock queries (replaced by tests).
func (d *DB) now() time.Time {
	if d.clock != nil {
		return d.clock()
	}
	return time.Now()
}

// AcquireImageLock takes image imageID's exclusive lock for lockedBy (e.g.
// "unpack-fsm:<run id>"). If anyone holds it, including lockedBy itself, it
// fails with a *LockHeldError naming the holder and since when; exactly one
// of any number of concurrent callers (goroutines or processes) succeeds.
func (d *DB) AcquireImageLock(ctx context.Context, imageID, lockedBy string) error {
	if imageID == "" || lockedBy == "" {
		return fmt.Errorf("metadata: acquire lock on image %q for %q: image id and holder must be non-empty: %w", imageID, lockedBy, ErrInvalidArgument)
	}
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		var (
			by string
			at int64
		)
		err := tx.QueryRowContext(ctx, `SELECT locked_by, locked_at FROM image_locks WHERE image_id = ?`, imageID).Scan(&by, &at)
		if err == nil {
			return &LockHeldError{ImageLock{ImageID: imageID, LockedBy: by, LockedAt: time.Unix(at, 0).UTC()}}
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("metadata: acquire lock on image %q for %q: %w", imageID, lockedBy, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO image_locks (image_id, locked_at, locked_by) VALUES (?, ?, ?)`,
			imageID, d.now().Unix(), lockedBy); err != nil {
			return fmt.Errorf("metadata: acquire lock on image %q for %q: %w", imageID, lockedBy, err)
		}
		return nil
	})
}

// ReleaseImageLock drops image imageID's lock, whoever holds it. Releasing a
// lock that is not held is not an error (idempotent), so every exit path of
// a pipeline may call it.
func (d *DB) ReleaseImageLock(ctx context.Context, imageID string) error {
	if _, err := d.db.ExecContext(ctx, `DELETE FROM image_locks WHERE image_id = ?`, imageID); err != nil {
		return fmt.Errorf("metadata: release lock on image %q: %w", imageID, err)
	}
	return nil
}

// IsImageLocked reports whether anyone holds image imageID's lock.
func (d *DB) IsImageLocked(ctx context.Context, imageID string) (bool, error) {
	l, err := d.GetImageLock(ctx, imageID)
	return l != nil, err
}

// GetImageLock returns image imageID's lock, or nil (and no error) when it
// is not locked.
func (d *DB) GetImageLock(ctx context.Context, imageID string) (*ImageLock, error) {
	var (
		l  = ImageLock{ImageID: imageID}
		at int64
	)
	err := d.db.QueryRowContext(ctx, `SELECT locked_by, locked_at FROM image_locks WHERE image_id = ?`, imageID).Scan(&l.LockedBy, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: is image %q locked: %w", imageID, err)
	}
	l.LockedAt = time.Unix(at, 0).UTC()
	return &l, nil
}

func scanLock(s rowScanner) (ImageLock, error) {
	var (
		l  ImageLock
		at int64
	)
	err := s.Scan(&l.ImageID, &l.LockedBy, &at)
	l.LockedAt = time.Unix(at, 0).UTC()
	return l, err
}

func (d *DB) queryLocks(ctx context.Context, q queryer, what, query string, args ...any) ([]ImageLock, error) {
	return queryAll(ctx, q, what, scanLock, query, args...)
}

// ListImageLocks lists every held lock, newest first.
func (d *DB) ListImageLocks(ctx context.Context) ([]ImageLock, error) {
	return d.queryLocks(ctx, d.db, "list image locks",
		`SELECT image_id, locked_by, locked_at FROM image_locks ORDER BY locked_at DESC, image_id`)
}

// staleCutoff is the unix second before which a lock is older than olderThan.
func (d *DB) staleCutoff(olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("metadata: stale lock age %s is negative: %w", olderThan, ErrInvalidArgument)
	}
	return d.now().Add(-olderThan).Unix(), nil
}

// ListStaleImageLocks lists the locks held for longer than olderThan
// (DefaultStaleLockAge is seed 000's hour), oldest first.
func (d *DB) ListStaleImageLocks(ctx context.Context, olderThan time.Duration) ([]ImageLock, error) {
	cutoff, err := d.staleCutoff(olderThan)
	if err != nil {
		return nil, err
	}
	return d.queryLocks(ctx, d.db, "list stale image locks",
		`SELECT image_id, locked_by, locked_at FROM image_locks WHERE locked_at < ? ORDER BY locked_at, image_id`, cutoff)
}

// ClearStaleImageLocks deletes the locks held for longer than olderThan and
// returns them (listing and deleting in one transaction, so a lock taken
// meanwhile is never removed).
func (d *DB) ClearStaleImageLocks(ctx context.Context, olderThan time.Duration) ([]ImageLock, error) {
	cutoff, err := d.staleCutoff(olderThan)
	if err != nil {
		return nil, err
	}
	var cleared []ImageLock
	err = d.WithTx(ctx, func(tx *sql.Tx) error {
		var err error
		cleared, err = d.queryLocks(ctx, tx, "list stale image locks",
			`SELECT image_id, locked_by, locked_at FROM image_locks WHERE locked_at < ? ORDER BY locked_at, image_id`, cutoff)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM image_locks WHERE locked_at < ?`, cutoff); err != nil {
			return fmt.Errorf("metadata: clear image locks older than %s: %w", olderThan, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cleared, nil
}
