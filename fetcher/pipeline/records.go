package pipeline

// Typed queries of the S3 pipelines' records (migrations 8 to 10 of
// package metadata): layers, s3_objects, chains, s3_images, image_layers
// and image_names. See docs/architecture.md for what each word means and
// who writes what.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// errNameTaken is wrapped by the refusal to give an image a name another
// image has: a name moves only when asked to (replace).
var errNameTaken = errors.New("pipeline: name taken by another image")

type rowScanner interface{ Scan(dest ...any) error }

// Records runs the pipelines' typed queries on a database: single
// statements, and a transaction wherever rows of several tables change
// together.
type Records struct {
	db *metadata.DB
}

// RecordsOf returns the pipelines' queries on db.
func RecordsOf(db *metadata.DB) Records { return Records{db: db} }

// ActivationKey is the key of image imageID's activation (its active
// snapshot): derived from the image id, never stored, with the prefix
// metadata's views find the activations by.
func ActivationKey(imageID string) string { return metadata.ActivationPrefix + imageID }

// LayerFile is a layer's tarball as downloaded and validated (table
// layers).
type LayerFile struct {
	Digest string // "sha256:<hex>" of the file's bytes as stored (plain or compressed): where the file is kept
	// DiffID is "sha256:<hex>" of the layer's uncompressed tar: its
	// identity, which names its chains. For a plain tar it is Digest; ""
	// given to StoreDownload means that.
	DiffID    string
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

// Object is an S3 object we downloaded, and the layer its bytes were
// (table s3_objects).
type Object struct {
	Bucket, Key  string
	ETag         string
	VersionID    string
	SizeBytes    int64
	Digest       string // of the layer file the object's bytes are
	DiffID       string // that layer file's diff ID; "" once the file is forgotten
	DownloadedAt time.Time
}

// StoreDownload records, in one transaction, layer file f and that object o
// was downloaded as f's content. Repeating it is harmless; a later download
// of the same key replaces the object's row.
func (r Records) StoreDownload(ctx context.Context, o Object, f LayerFile) error {
	if o.Bucket == "" || o.Key == "" || o.Digest == "" || o.Digest != f.Digest || f.Path == "" || f.SizeBytes < 0 {
		return fmt.Errorf("pipeline: store download of s3://%s/%s as %q at %q: bucket, key, digest and path must be set and the digests equal: %w",
			o.Bucket, o.Key, o.Digest, f.Path, errdefs.ErrInvalidArgument)
	}
	if f.DiffID == "" {
		f.DiffID = f.Digest
	}
	now := time.Now().UnixNano()
	return r.db.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO layers
			(digest, path, size_bytes, has_rootfs, entries, stat_size, stat_mtime_ns, stat_ino, created_ns, diff_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT(digest) DO UPDATE SET path = excluded.path, size_bytes = excluded.size_bytes,
				has_rootfs = excluded.has_rootfs, entries = excluded.entries, stat_size = excluded.stat_size,
				stat_mtime_ns = excluded.stat_mtime_ns, stat_ino = excluded.stat_ino, diff_id = excluded.diff_id`,
			f.Digest, f.Path, f.SizeBytes, f.HasRootfs, f.Entries, f.StatSize, f.StatMtimeNs, int64(f.StatIno), now, f.DiffID); err != nil {
			return fmt.Errorf("pipeline: store layer %s: %w", f.Digest, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO s3_objects (bucket, key, etag, version_id, size_bytes, digest, downloaded_ns)
			VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT(bucket, key) DO UPDATE SET etag = excluded.etag, version_id = excluded.version_id,
				size_bytes = excluded.size_bytes, digest = excluded.digest, downloaded_ns = excluded.downloaded_ns`,
			o.Bucket, o.Key, o.ETag, o.VersionID, o.SizeBytes, o.Digest, now); err != nil {
			return fmt.Errorf("pipeline: store object s3://%s/%s: %w", o.Bucket, o.Key, err)
		}
		return nil
	})
}

// ObjectRecord returns what was recorded of the download of bucket/key, or
// nil (and no error) if it never was.
func (r Records) ObjectRecord(ctx context.Context, bucket, key string) (*Object, error) {
	var (
		o  Object
		ns int64
	)
	err := r.db.Statements().QueryRowContext(ctx, `SELECT o.bucket, o.key, o.etag, o.version_id, o.size_bytes, o.digest, COALESCE(l.diff_id, ''), o.downloaded_ns
		FROM s3_objects o LEFT JOIN layers l ON l.digest = o.digest WHERE o.bucket = ? AND o.key = ?`, bucket, key).
		Scan(&o.Bucket, &o.Key, &o.ETag, &o.VersionID, &o.SizeBytes, &o.Digest, &o.DiffID, &ns)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: object s3://%s/%s: %w", bucket, key, err)
	}
	o.DownloadedAt = time.Unix(0, ns).UTC()
	return &o, nil
}

// DiffIDsListedAs returns the diff IDs of the layers recorded for the
// objects of bucket listed with etag and size bytes, under any key. It is
// a hint only: an ETag is whatever the server says, and two objects with
// the same one need not hold the same bytes.
func (r Records) DiffIDsListedAs(ctx context.Context, bucket, etag string, size int64) ([]string, error) {
	return queryAll(ctx, r.db.Statements(), "diff ids of objects listed as "+etag, func(s rowScanner) (string, error) {
		var d string
		return d, s.Scan(&d)
	}, `SELECT DISTINCT l.diff_id FROM s3_objects o JOIN layers l ON l.digest = o.digest
		WHERE o.bucket = ? AND o.etag = ? AND o.size_bytes = ? AND l.diff_id != '' ORDER BY l.diff_id`, bucket, etag, size)
}

const layerColumns = `digest, path, size_bytes, has_rootfs, entries, stat_size, stat_mtime_ns, stat_ino, created_ns, diff_id`

// queryAll is metadata.QueryAll on rows read through rowScanner, with its
// errors wrapped with what (the operation, for the message).
func queryAll[T any](ctx context.Context, q metadata.Querier, what string, scan func(rowScanner) (T, error), query string, args ...any) ([]T, error) {
	out, err := metadata.QueryAll(ctx, q, func(s *sql.Rows) (T, error) { return scan(s) }, query, args...)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %s: %w", what, err)
	}
	return out, nil
}

func scanLayerFile(s rowScanner) (*LayerFile, error) {
	var (
		f         LayerFile
		ino, cdat int64
	)
	if err := s.Scan(&f.Digest, &f.Path, &f.SizeBytes, &f.HasRootfs, &f.Entries, &f.StatSize, &f.StatMtimeNs, &ino, &cdat, &f.DiffID); err != nil {
		return nil, err
	}
	f.StatIno, f.CreatedAt = uint64(ino), time.Unix(0, cdat).UTC()
	return &f, nil
}

// LayerFile returns the layer file of digest, or nil (and no error) if none
// is recorded.
func (r Records) LayerFile(ctx context.Context, digest string) (*LayerFile, error) {
	f, err := scanLayerFile(r.db.Statements().QueryRowContext(ctx, `SELECT `+layerColumns+` FROM layers WHERE digest = ?`, digest))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: layer %s: %w", digest, err)
	}
	return f, nil
}

// ListLayerFiles lists every layer file by digest.
func (r Records) ListLayerFiles(ctx context.Context) ([]*LayerFile, error) {
	return queryAll(ctx, r.db.Statements(), "list layers", scanLayerFile, `SELECT `+layerColumns+` FROM layers ORDER BY digest`)
}

// updateLayerStat records that layer digest's file was hashed again and
// matched, with its new identity.
func (r Records) updateLayerStat(ctx context.Context, digest string, size, mtimeNs int64, ino uint64) error {
	if _, err := r.db.Statements().ExecContext(ctx, `UPDATE layers SET stat_size = ?, stat_mtime_ns = ?, stat_ino = ? WHERE digest = ?`,
		size, mtimeNs, int64(ino), digest); err != nil {
		return fmt.Errorf("pipeline: update stat of layer %s: %w", digest, err)
	}
	return nil
}

// forgetLayer forgets layer digest's file and every object recorded as that
// content (its bytes were rejected): one transaction; absent is not an
// error.
func (r Records) forgetLayer(ctx context.Context, digest string) error {
	return r.db.WithTx(ctx, func(tx *sql.Tx) error {
		for _, q := range []string{`DELETE FROM s3_objects WHERE digest = ?`, `DELETE FROM layers WHERE digest = ?`} {
			if _, err := tx.ExecContext(ctx, q, digest); err != nil {
				return fmt.Errorf("pipeline: forget layer %s: %w", digest, err)
			}
		}
		return nil
	})
}

// Chain is one unpacked chain (table chains): its device is the committed
// snapshot whose key is ChainID.
type Chain struct {
	ChainID       string
	ParentChainID string // "" for a first layer
	DiffID        string
	SizeBytes     int64 // bytes extracted
	FileCount     int64
	UnpackedAt    time.Time
}

// StoreChain records chain c (or refreshes its sizes).
func (r Records) StoreChain(ctx context.Context, c Chain) error {
	if c.ChainID == "" || c.DiffID == "" || c.SizeBytes < 0 || c.FileCount < 0 {
		return fmt.Errorf("pipeline: store chain %q (diff %q): ids must be set, sizes not negative: %w", c.ChainID, c.DiffID, errdefs.ErrInvalidArgument)
	}
	if _, err := r.db.Statements().ExecContext(ctx, `INSERT INTO chains (chain_id, parent_chain_id, diff_id, size_bytes, file_count, unpacked_ns)
		VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(chain_id) DO UPDATE SET size_bytes = excluded.size_bytes, file_count = excluded.file_count`,
		c.ChainID, c.ParentChainID, c.DiffID, c.SizeBytes, c.FileCount, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("pipeline: store chain %s: %w", c.ChainID, err)
	}
	return nil
}

const chainColumns = `chain_id, parent_chain_id, diff_id, size_bytes, file_count, unpacked_ns`

func scanChain(s rowScanner) (*Chain, error) {
	var (
		c  Chain
		ns int64
	)
	if err := s.Scan(&c.ChainID, &c.ParentChainID, &c.DiffID, &c.SizeBytes, &c.FileCount, &ns); err != nil {
		return nil, err
	}
	c.UnpackedAt = time.Unix(0, ns).UTC()
	return &c, nil
}

// GetChain returns chain chainID, or nil (and no error) if it is not
// recorded.
func (r Records) GetChain(ctx context.Context, chainID string) (*Chain, error) {
	c, err := scanChain(r.db.Statements().QueryRowContext(ctx, `SELECT `+chainColumns+` FROM chains WHERE chain_id = ?`, chainID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: chain %s: %w", chainID, err)
	}
	return c, nil
}

// deleteChain forgets chain chainID; absent is not an error.
func (r Records) deleteChain(ctx context.Context, chainID string) error {
	if _, err := r.db.Statements().ExecContext(ctx, `DELETE FROM chains WHERE chain_id = ?`, chainID); err != nil {
		return fmt.Errorf("pipeline: delete chain %s: %w", chainID, err)
	}
	return nil
}

// Image is one image pulled from S3 (table s3_images).
type Image struct {
	ImageID       string
	Source        string // s3://bucket/key or s3://bucket/prefix/
	FailureReason string // why the last pull failed; "" after a success
	CreatedAt     time.Time
	PulledAt      time.Time // zero before the first successful pull
}

// ImageLayer is one layer of an image as last pulled (table image_layers).
type ImageLayer struct {
	Position  int    // 1 for the bottom layer
	Key       string // in the image's bucket
	ETag      string
	VersionID string
	SizeBytes int64
	ChainID   string
}

// MarkImageFailed records that a pull of image imageID (from source) failed
// with reason, creating the image's row if it has none. A successful pull
// clears it.
func (r Records) MarkImageFailed(ctx context.Context, imageID, source, reason string) error {
	if imageID == "" || source == "" || reason == "" {
		return fmt.Errorf("pipeline: mark image %q (source %q) failed: id, source and reason must be set: %w", imageID, source, errdefs.ErrInvalidArgument)
	}
	// An image never pulled is kept with its failure after its last try
	// (retention reads used_ns, else created_ns): the try is recorded as
	// its use. A pulled image's use stays its last pull or activation.
	if _, err := r.db.Statements().ExecContext(ctx, `INSERT INTO s3_images (image_id, source, failure_reason, created_ns) VALUES (?, ?, ?, ?)
		ON CONFLICT(image_id) DO UPDATE SET failure_reason = excluded.failure_reason,
			used_ns = CASE WHEN s3_images.pulled_ns IS NULL THEN excluded.created_ns ELSE s3_images.used_ns END`,
		imageID, source, reason, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("pipeline: mark image %s failed: %w", imageID, err)
	}
	return nil
}

// RecordPulledImage records, in one transaction, that image imageID was
// pulled from source as layers (bottom first; they replace what was
// recorded), clears its failure, and records name (when not empty) as one of
// its names (refused, with nothing recorded, when it names another image:
// errNameTaken).
func (r Records) RecordPulledImage(ctx context.Context, imageID, source string, layers []ImageLayer, name string) error {
	if imageID == "" || source == "" || len(layers) == 0 {
		return fmt.Errorf("pipeline: record pulled image %q (source %q, %d layers): id, source and layers must be set: %w",
			imageID, source, len(layers), errdefs.ErrInvalidArgument)
	}
	now := time.Now().UnixNano()
	return r.db.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO s3_images (image_id, source, created_ns, pulled_ns) VALUES (?, ?, ?, ?)
			ON CONFLICT(image_id) DO UPDATE SET failure_reason = NULL, pulled_ns = excluded.pulled_ns`,
			imageID, source, now, now); err != nil {
			return fmt.Errorf("pipeline: record pulled image %s: %w", imageID, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM image_layers WHERE image_id = ?`, imageID); err != nil {
			return fmt.Errorf("pipeline: record layers of image %s: %w", imageID, err)
		}
		for i, l := range layers {
			if _, err := tx.ExecContext(ctx, `INSERT INTO image_layers (image_id, position, key, etag, version_id, size_bytes, chain_id)
				VALUES (?, ?, ?, ?, ?, ?, ?)`, imageID, i+1, l.Key, l.ETag, l.VersionID, l.SizeBytes, l.ChainID); err != nil {
				return fmt.Errorf("pipeline: record layer %d of image %s: %w", i+1, imageID, err)
			}
		}
		if name != "" {
			return addName(ctx, tx, name, imageID, false, now)
		}
		return nil
	})
}

// addName records name as a name of imageID. A name another image has is
// refused, naming that image and its source, unless replace, which moves
// it.
func addName(ctx context.Context, tx *sql.Tx, name, imageID string, replace bool, now int64) error {
	if !replace {
		var holder, source string
		err := tx.QueryRowContext(ctx, `SELECT n.image_id, i.source FROM image_names n JOIN s3_images i ON i.image_id = n.image_id
			WHERE n.name = ? AND n.image_id <> ?`, name, imageID).Scan(&holder, &source)
		if err == nil {
			return fmt.Errorf("pipeline: name %q is the name of image %s (%s): %w", name, holder, source, errNameTaken)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("pipeline: record name %q of image %s: %w", name, imageID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO image_names (name, image_id, registered_ns) VALUES (?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET image_id = excluded.image_id, registered_ns = excluded.registered_ns
		WHERE image_names.image_id <> excluded.image_id`,
		name, imageID, now); err != nil {
		return fmt.Errorf("pipeline: record name %q of image %s: %w", name, imageID, err)
	}
	return nil
}

// clearImageFailure forgets why the last pull of image imageID failed (a
// later pull found it in place).
func (r Records) clearImageFailure(ctx context.Context, imageID string) error {
	if _, err := r.db.Statements().ExecContext(ctx, `UPDATE s3_images SET failure_reason = NULL WHERE image_id = ? AND failure_reason IS NOT NULL`, imageID); err != nil {
		return fmt.Errorf("pipeline: clear the failure of image %s: %w", imageID, err)
	}
	return nil
}

// AddImageName records name as a name of image imageID. A name another
// image has is refused (errNameTaken, naming that image) unless replace,
// which moves it to imageID.
func (r Records) AddImageName(ctx context.Context, name, imageID string, replace bool) error {
	return r.db.WithTx(ctx, func(tx *sql.Tx) error { return addName(ctx, tx, name, imageID, replace, time.Now().UnixNano()) })
}

// dropImageName forgets name as a name of image imageID; a name of
// another image, or no such name, is left as it is.
func (r Records) dropImageName(ctx context.Context, name, imageID string) error {
	if _, err := r.db.Statements().ExecContext(ctx, `DELETE FROM image_names WHERE name = ? AND image_id = ?`, name, imageID); err != nil {
		return fmt.Errorf("pipeline: forget name %q of image %s: %w", name, imageID, err)
	}
	return nil
}

// imageNames lists the names of image imageID, oldest first.
func (r Records) imageNames(ctx context.Context, imageID string) ([]string, error) {
	return queryAll(ctx, r.db.Statements(), "names of image "+imageID, func(s rowScanner) (string, error) {
		var n string
		return n, s.Scan(&n)
	}, `SELECT name FROM image_names WHERE image_id = ? ORDER BY registered_ns, name`, imageID)
}

// ImageIDByName returns the image name names, or "" if none.
func (r Records) ImageIDByName(ctx context.Context, name string) (string, error) {
	var id string
	err := r.db.Statements().QueryRowContext(ctx, `SELECT image_id FROM image_names WHERE name = ?`, name).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pipeline: image named %q: %w", name, err)
	}
	return id, nil
}

// ImageIDByRef returns the image ref names: one of its names, or else its
// source (s3://bucket/key, a prefix with or without its final '/'); "" if
// none.
func (r Records) ImageIDByRef(ctx context.Context, ref string) (string, error) {
	id, err := r.ImageIDByName(ctx, ref)
	if err != nil || id != "" {
		return id, err
	}
	err = r.db.Statements().QueryRowContext(ctx, `SELECT image_id FROM s3_images WHERE source = ? OR source = ? || '/'`, ref, ref).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pipeline: image of source %q: %w", ref, err)
	}
	return id, nil
}

func scanImage(s rowScanner) (*Image, error) {
	var (
		im     Image
		reason sql.NullString
		cns    int64
		pns    sql.NullInt64
	)
	if err := s.Scan(&im.ImageID, &im.Source, &reason, &cns, &pns); err != nil {
		return nil, err
	}
	im.FailureReason, im.CreatedAt = reason.String, time.Unix(0, cns).UTC()
	if pns.Valid {
		im.PulledAt = time.Unix(0, pns.Int64).UTC()
	}
	return &im, nil
}

const imageColumns = `image_id, source, failure_reason, created_ns, pulled_ns`

// GetImage returns image imageID, or nil (and no error) if none.
func (r Records) GetImage(ctx context.Context, imageID string) (*Image, error) {
	im, err := scanImage(r.db.Statements().QueryRowContext(ctx, `SELECT `+imageColumns+` FROM s3_images WHERE image_id = ?`, imageID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: image %s: %w", imageID, err)
	}
	return im, nil
}

// listImages lists every image, oldest first.
func (r Records) listImages(ctx context.Context) ([]*Image, error) {
	return queryAll(ctx, r.db.Statements(), "list images", scanImage, `SELECT `+imageColumns+` FROM s3_images ORDER BY id`)
}

func imageLayers(ctx context.Context, q metadata.Querier, imageID string) ([]ImageLayer, error) {
	return queryAll(ctx, q, "layers of image "+imageID, scanImageLayer,
		`SELECT `+imageLayerColumns+` FROM image_layers WHERE image_id = ? ORDER BY position`, imageID)
}

const imageLayerColumns = `position, key, etag, version_id, size_bytes, chain_id`

func scanImageLayer(s rowScanner) (ImageLayer, error) {
	var l ImageLayer
	return l, s.Scan(&l.Position, &l.Key, &l.ETag, &l.VersionID, &l.SizeBytes, &l.ChainID)
}

// imageLayers lists the layers image imageID was last pulled as, bottom
// first (none before its first successful pull).
func (r Records) imageLayers(ctx context.Context, imageID string) ([]ImageLayer, error) {
	return imageLayers(ctx, r.db.Statements(), imageID)
}

// DeleteImage forgets image imageID with its layers and names; absent is
// not an error.
func (r Records) DeleteImage(ctx context.Context, imageID string) error {
	if _, err := r.db.Statements().ExecContext(ctx, `DELETE FROM s3_images WHERE image_id = ?`, imageID); err != nil {
		return fmt.Errorf("pipeline: delete image %s: %w", imageID, err)
	}
	return nil
}

// pulledState is what an idempotent re-pull needs to know of an image, read
// in one transaction by pulledImageState.
type pulledState struct {
	Image  Image
	Layers []ImageLayer
	// DiffIDs are the layers' diff IDs, bottom first.
	DiffIDs []string
	// ActivationDevice is the dm name of the activation's device.
	ActivationDevice string
	// Names are the image's recorded names.
	Names []string
}

// pulledImageState reads, in one read transaction, image imageID with its
// layers and names, and whether everything a pulled image needs is in place
// (a failure of a later pull, S3 unreachable for instance, leaves what an
// earlier one made usable; it is reported in the state's Image):
// each layer's chain recorded with its committed snapshot, and the
// activation an active snapshot on the top chain. It returns (nil, nil) when
// the image was never pulled or anything is missing: the caller then runs
// the pipelines, which heal what is wrong.
func (r Records) pulledImageState(ctx context.Context, imageID string) (*pulledState, error) {
	var st *pulledState
	// Four queries whatever the number of layers: a re-pull's answer
	// waits on them, and under emulation each round trip to SQLite costs
	// about a millisecond.
	err := r.db.ReadSnapshot(ctx, func(tx metadata.Querier) error {
		im, err := scanImage(tx.QueryRowContext(ctx, `SELECT `+imageColumns+` FROM s3_images WHERE image_id = ?`, imageID))
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if im.PulledAt.IsZero() {
			return nil
		}
		// Each layer with the diff ID of its chain, NULL unless the chain
		// is recorded with its committed snapshot: keyed by the chain ID,
		// or one containerd's unpacker committed (chainKey).
		s := &pulledState{Image: *im}
		complete := true
		if s.Layers, err = queryAll(ctx, tx, "layers of image "+imageID, func(r rowScanner) (ImageLayer, error) {
			var diff sql.NullString
			l, err := scanImageLayer(withExtra(r, &diff))
			complete = complete && diff.Valid
			s.DiffIDs = append(s.DiffIDs, diff.String)
			return l, err
		}, `SELECT `+imageLayerColumns+`, (SELECT c.diff_id FROM chains c WHERE c.chain_id = image_layers.chain_id AND (
				EXISTS (SELECT 1 FROM cd_snapshots cs WHERE cs.key = c.chain_id AND cs.kind = 'committed')
				OR EXISTS (SELECT 1 FROM cd_snapshots cs WHERE json_extract(cs.labels, '$."containerd.io/snapshot.ref"') = c.chain_id
					AND cs.kind = 'committed' AND substr(cs.key, -length(c.chain_id) - 1) = '/' || c.chain_id)))
			FROM image_layers WHERE image_id = ? ORDER BY position`, imageID); err != nil {
			return err
		}
		if !complete || len(s.Layers) == 0 {
			return nil
		}
		var kind, parent, parentRef string
		err = tx.QueryRowContext(ctx, `SELECT a.kind, IFNULL(p.key, ''), IFNULL(json_extract(p.labels, '$."containerd.io/snapshot.ref"'), ''), d.name FROM cd_snapshots a
			JOIN thin_devices d ON d.device_id = a.device_id
			LEFT JOIN cd_snapshots p ON p.id = a.parent_id WHERE a.key = ?`, ActivationKey(imageID)).Scan(&kind, &parent, &parentRef, &s.ActivationDevice)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("activation: %w", err)
		}
		// The activation sits on the top chain's snapshot: the chain ID,
		// or containerd's "<namespace>/<n>/<chain ID>" (chainKey).
		top := s.Layers[len(s.Layers)-1].ChainID
		if kind != "active" || parent != top && (parentRef != top || !strings.HasSuffix(parent, "/"+top)) {
			return nil
		}
		if s.Names, err = queryAll(ctx, tx, "names", func(r rowScanner) (string, error) {
			var n string
			return n, r.Scan(&n)
		}, `SELECT name FROM image_names WHERE image_id = ? ORDER BY registered_ns, name`, imageID); err != nil {
			return err
		}
		st = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pipeline: pulled state of image %s: %w", imageID, err)
	}
	return st, nil
}

// withExtra is s scanning extra after the destinations its caller gives:
// a row's own scan function reads its table's columns, and the query adds
// columns joined from elsewhere.
func withExtra(s rowScanner, extra ...any) rowScanner { return extraScanner{s, extra} }

type extraScanner struct {
	s     rowScanner
	extra []any
}

func (e extraScanner) Scan(dest ...any) error { return e.s.Scan(append(dest, e.extra...)...) }

// TouchImage records that image imageID was used now (a pull, also one
// answered from the records, or an activation). Absent is not an error.
func (r Records) TouchImage(ctx context.Context, imageID string) error {
	// Never back: after the wall clock jumped back, a use must not make
	// the image look used earlier than it was (collection would take it
	// for one of the least recently used).
	if _, err := r.db.Statements().ExecContext(ctx, `UPDATE s3_images SET used_ns = MAX(COALESCE(used_ns, 0), ?) WHERE image_id = ?`, time.Now().UnixNano(), imageID); err != nil {
		return fmt.Errorf("pipeline: touch image %s: %w", imageID, err)
	}
	return nil
}
