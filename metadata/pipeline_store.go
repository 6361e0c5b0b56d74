package metadata

// Typed queries of the S3 pipelines' own tables (migration 0007):
// pipeline_blobs, pipeline_etags, pipeline_chains and pipeline_images.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Blob is one downloaded, validated layer tarball (pipeline_blobs).
type Blob struct {
	Digest    string // "sha256:<hex>"
	Path      string
	SizeBytes int64
	HasRootfs bool
	Entries   int64
	// StatSize, StatMtimeNs and StatIno identify the file as it was when
	// its digest was last computed.
	StatSize    int64
	StatMtimeNs int64
	StatIno     uint64
	CreatedAt   time.Time
}

// StoreBlob records blob b (or refreshes the row of its digest) and, when
// etag is not empty, remembers that S3 objects with that ETag and b's size
// are b. Both in one transaction; repeating it is harmless.
func (d *DB) StoreBlob(ctx context.Context, b Blob, etag string) error {
	if b.Digest == "" || b.Path == "" || b.SizeBytes < 0 {
		return fmt.Errorf("metadata: store blob %q at %q (size %d): digest and path must be non-empty, size not negative: %w", b.Digest, b.Path, b.SizeBytes, ErrInvalidArgument)
	}
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO pipeline_blobs
			(digest, path, size_bytes, has_rootfs, entries, stat_size, stat_mtime_ns, stat_ino, created_ns)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT(digest) DO UPDATE SET path = excluded.path, size_bytes = excluded.size_bytes,
				has_rootfs = excluded.has_rootfs, entries = excluded.entries, stat_size = excluded.stat_size,
				stat_mtime_ns = excluded.stat_mtime_ns, stat_ino = excluded.stat_ino`,
			b.Digest, b.Path, b.SizeBytes, b.HasRootfs, b.Entries, b.StatSize, b.StatMtimeNs, int64(b.StatIno), time.Now().UnixNano()); err != nil {
			return fmt.Errorf("metadata: store blob %s: %w", b.Digest, err)
		}
		if etag == "" {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO pipeline_etags (etag, size_bytes, digest) VALUES (?, ?, ?)
			ON CONFLICT(etag, size_bytes) DO UPDATE SET digest = excluded.digest`, etag, b.SizeBytes, b.Digest); err != nil {
			return fmt.Errorf("metadata: remember ETag %s of blob %s: %w", etag, b.Digest, err)
		}
		return nil
	})
}

// UpdateBlobStat records that blob digest's file was hashed again and
// matched, with its new identity.
func (d *DB) UpdateBlobStat(ctx context.Context, digest string, size, mtimeNs int64, ino uint64) error {
	if _, err := d.db.ExecContext(ctx, `UPDATE pipeline_blobs SET stat_size = ?, stat_mtime_ns = ?, stat_ino = ? WHERE digest = ?`,
		size, mtimeNs, int64(ino), digest); err != nil {
		return fmt.Errorf("metadata: update stat of blob %s: %w", digest, err)
	}
	return nil
}

const blobColumns = `digest, path, size_bytes, has_rootfs, entries, stat_size, stat_mtime_ns, stat_ino, created_ns`

func scanBlob(s rowScanner) (*Blob, error) {
	var (
		b         Blob
		ino, cdat int64
	)
	if err := s.Scan(&b.Digest, &b.Path, &b.SizeBytes, &b.HasRootfs, &b.Entries, &b.StatSize, &b.StatMtimeNs, &ino, &cdat); err != nil {
		return nil, err
	}
	b.StatIno, b.CreatedAt = uint64(ino), time.Unix(0, cdat).UTC()
	return &b, nil
}

func (d *DB) oneBlob(ctx context.Context, what, query string, args ...any) (*Blob, error) {
	b, err := scanBlob(d.db.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: %s: %w", what, err)
	}
	return b, nil
}

// GetBlob returns the blob with digest, or nil (and no error) if none.
func (d *DB) GetBlob(ctx context.Context, digest string) (*Blob, error) {
	return d.oneBlob(ctx, "blob "+digest, `SELECT `+blobColumns+` FROM pipeline_blobs WHERE digest = ?`, digest)
}

// BlobByETag returns the blob S3 objects with etag and size are known to
// be, or nil (and no error) if none.
func (d *DB) BlobByETag(ctx context.Context, etag string, size int64) (*Blob, error) {
	return d.oneBlob(ctx, "blob of ETag "+etag, `SELECT b.digest, b.path, b.size_bytes, b.has_rootfs, b.entries, b.stat_size, b.stat_mtime_ns, b.stat_ino, b.created_ns FROM pipeline_etags e
		JOIN pipeline_blobs b ON b.digest = e.digest WHERE e.etag = ? AND e.size_bytes = ?`, etag, size)
}

// DeleteBlob forgets blob digest (and its ETags); absent is not an error.
func (d *DB) DeleteBlob(ctx context.Context, digest string) error {
	if _, err := d.db.ExecContext(ctx, `DELETE FROM pipeline_blobs WHERE digest = ?`, digest); err != nil {
		return fmt.Errorf("metadata: delete blob %s: %w", digest, err)
	}
	return nil
}

// ListBlobs lists every blob by digest.
func (d *DB) ListBlobs(ctx context.Context) ([]*Blob, error) {
	return queryAll(ctx, d.db, "list blobs", scanBlob, `SELECT `+blobColumns+` FROM pipeline_blobs ORDER BY digest`)
}

// Chain is one unpacked layer chain (pipeline_chains).
type Chain struct {
	ChainID       string
	ParentChainID string // "" for a first layer
	DiffID        string
	ImageID       string // the unpacked_images row holding the device
	CreatedAt     time.Time
}

// StoreUnpackedChain records chain c together with its device record (seed
// 000's update-db upsert of unpacked_images, r.ImageID = c.ImageID) in one
// transaction. It fails with ErrInvalidArgument if r.ImageID's unpacked
// record already belongs to another chain (a layer key unpacked at two
// chain positions), rather than overwriting it.
func (d *DB) StoreUnpackedChain(ctx context.Context, c Chain, r UnpackedImageRecord) error {
	if c.ChainID == "" || c.DiffID == "" || c.ImageID == "" || c.ImageID != r.ImageID {
		return fmt.Errorf("metadata: store chain %q (diff %q, image %q/%q): ids must be non-empty and the image ids equal: %w", c.ChainID, c.DiffID, c.ImageID, r.ImageID, ErrInvalidArgument)
	}
	var other string
	err := d.db.QueryRowContext(ctx, `SELECT chain_id FROM pipeline_chains WHERE image_id = ?`, c.ImageID).Scan(&other)
	if err == nil && other != c.ChainID {
		return fmt.Errorf("metadata: store chain %s: image %q already holds the unpacked record of chain %s: %w", c.ChainID, c.ImageID, other, ErrInvalidArgument)
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("metadata: store chain %s: %w", c.ChainID, err)
	}
	if err := d.StoreUnpackedImage(ctx, r); err != nil {
		return err
	}
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO pipeline_chains (chain_id, parent_chain_id, diff_id, image_id, created_ns)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT(chain_id) DO UPDATE SET image_id = excluded.image_id`,
			c.ChainID, c.ParentChainID, c.DiffID, c.ImageID, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("metadata: store chain %s: %w", c.ChainID, err)
		}
		return nil
	})
}

func scanChain(s rowScanner) (*Chain, error) {
	var (
		c  Chain
		ns int64
	)
	if err := s.Scan(&c.ChainID, &c.ParentChainID, &c.DiffID, &c.ImageID, &ns); err != nil {
		return nil, err
	}
	c.CreatedAt = time.Unix(0, ns).UTC()
	return &c, nil
}

const chainColumns = `chain_id, parent_chain_id, diff_id, image_id, created_ns`

// GetChain returns chain chainID, or nil (and no error) if it is not
// recorded.
func (d *DB) GetChain(ctx context.Context, chainID string) (*Chain, error) {
	c, err := scanChain(d.db.QueryRowContext(ctx, `SELECT `+chainColumns+` FROM pipeline_chains WHERE chain_id = ?`, chainID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: chain %s: %w", chainID, err)
	}
	return c, nil
}

// ChainOfImage returns the chain whose device record is image imageID's
// unpacked record, or nil (and no error) if none.
func (d *DB) ChainOfImage(ctx context.Context, imageID string) (*Chain, error) {
	c, err := scanChain(d.db.QueryRowContext(ctx, `SELECT `+chainColumns+` FROM pipeline_chains WHERE image_id = ?`, imageID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: chain of image %s: %w", imageID, err)
	}
	return c, nil
}

// ListChains lists every unpacked chain.
func (d *DB) ListChains(ctx context.Context) ([]*Chain, error) {
	return queryAll(ctx, d.db, "list chains", scanChain, `SELECT `+chainColumns+` FROM pipeline_chains ORDER BY created_ns, chain_id`)
}

// DeleteChain forgets chain chainID and its unpacked record, after deleting
// the seed snapshot rows whose origin is that record's device (they would
// block it: ON DELETE RESTRICT). Absent is not an error.
func (d *DB) DeleteChain(ctx context.Context, chainID string) error {
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		var imageID string
		err := tx.QueryRowContext(ctx, `SELECT image_id FROM pipeline_chains WHERE chain_id = ?`, chainID).Scan(&imageID)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("metadata: delete chain %s: %w", chainID, err)
		}
		for _, q := range []string{
			`DELETE FROM snapshots WHERE origin_device_id IN (SELECT device_id FROM unpacked_images WHERE image_id = ?)`,
			`DELETE FROM pipeline_chains WHERE image_id = ?`,
			`DELETE FROM unpacked_images WHERE image_id = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, imageID); err != nil {
				return fmt.Errorf("metadata: delete chain %s (image %s): %w", chainID, imageID, err)
			}
		}
		return nil
	})
}

// PulledImage is one pulled image by reference (pipeline_images).
type PulledImage struct {
	Ref         string
	Source      string
	ImageID     string
	Layers      string // JSON, owned by the pipeline package
	TopChainID  string
	SnapshotKey string
	UpdatedAt   time.Time
}

// StorePulledImage records (or replaces) the pulled image p.Ref.
func (d *DB) StorePulledImage(ctx context.Context, p PulledImage) error {
	if p.Ref == "" || p.Source == "" || p.ImageID == "" || p.TopChainID == "" {
		return fmt.Errorf("metadata: store pulled image %q (source %q): ref, source, image id and top chain must be non-empty: %w", p.Ref, p.Source, ErrInvalidArgument)
	}
	if _, err := d.db.ExecContext(ctx, `INSERT INTO pipeline_images (ref, source, image_id, layers, top_chain_id, snapshot_key, updated_ns)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(ref) DO UPDATE SET source = excluded.source, image_id = excluded.image_id,
		layers = excluded.layers, top_chain_id = excluded.top_chain_id, snapshot_key = excluded.snapshot_key, updated_ns = excluded.updated_ns`,
		p.Ref, p.Source, p.ImageID, p.Layers, p.TopChainID, p.SnapshotKey, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("metadata: store pulled image %q: %w", p.Ref, err)
	}
	return nil
}

const pulledColumns = `ref, source, image_id, layers, top_chain_id, snapshot_key, updated_ns`

func scanPulled(s rowScanner) (*PulledImage, error) {
	var (
		p  PulledImage
		ns int64
	)
	if err := s.Scan(&p.Ref, &p.Source, &p.ImageID, &p.Layers, &p.TopChainID, &p.SnapshotKey, &ns); err != nil {
		return nil, err
	}
	p.UpdatedAt = time.Unix(0, ns).UTC()
	return &p, nil
}

// GetPulledImage returns the pulled image ref, or nil (and no error) if
// none.
func (d *DB) GetPulledImage(ctx context.Context, ref string) (*PulledImage, error) {
	p, err := scanPulled(d.db.QueryRowContext(ctx, `SELECT `+pulledColumns+` FROM pipeline_images WHERE ref = ?`, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: pulled image %q: %w", ref, err)
	}
	return p, nil
}

// PulledImageBySource returns the most recently pulled image of source, or
// nil (and no error) if none.
func (d *DB) PulledImageBySource(ctx context.Context, source string) (*PulledImage, error) {
	p, err := scanPulled(d.db.QueryRowContext(ctx, `SELECT `+pulledColumns+` FROM pipeline_images WHERE source = ?
		ORDER BY updated_ns DESC LIMIT 1`, source))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: pulled image of %q: %w", source, err)
	}
	return p, nil
}

// DeleteSnapshotByName removes the seed snapshots row named name (an
// activation whose device is gone); absent is not an error.
func (d *DB) DeleteSnapshotByName(ctx context.Context, name string) error {
	if _, err := d.db.ExecContext(ctx, `DELETE FROM snapshots WHERE snapshot_name = ?`, name); err != nil {
		return fmt.Errorf("metadata: delete snapshot named %q: %w", name, err)
	}
	return nil
}

// SnapshotIDOwner returns the image id whose seed snapshot row has
// snapshot_id id, or "" if none.
func (d *DB) SnapshotIDOwner(ctx context.Context, id string) (string, error) {
	var img string
	err := d.db.QueryRowContext(ctx, `SELECT image_id FROM snapshots WHERE snapshot_id = ?`, id).Scan(&img)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("metadata: owner of snapshot id %q: %w", id, err)
	}
	return img, nil
}
