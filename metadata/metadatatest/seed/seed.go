// Package seed writes, in plain SQL, the rows the pipelines, the
// state-machine runner and the snapshotter leave in a metadata database,
// for the tests of the packages that read or prune them. Those tables'
// queries belong to packages that import metadata, and metadata's own
// tests cannot import them (nor anything that imports metadata), so this
// package imports neither: it writes through any handle with WithTx, as
// *metadata.DB has.
package seed

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"
)

// DB is what the helpers write through: *metadata.DB.
type DB interface {
	WithTx(ctx context.Context, fn func(tx *sql.Tx) error) error
}

// Querier runs queries: metadata.Querier, *sql.DB or *sql.Tx.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// exec runs one statement in its own transaction.
func exec(ctx context.Context, db DB, q string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := db.WithTx(ctx, func(tx *sql.Tx) error {
		var err error
		res, err = tx.ExecContext(ctx, q, args...)
		return err
	})
	return res, err
}

// insertSnapshot writes thin device devID in state and the snapshot keyed
// key of kind on it, whose parent is the snapshot keyed parent ("" for
// none), created at createdNs: every snapshot in the one keyspace "",
// each on its own thin device, as the snapshotter records them.
func insertSnapshot(ctx context.Context, tx *sql.Tx, key, kind, parent string, devID uint32, state string, createdNs int64) error {
	var parentID any
	if parent != "" {
		var id int64
		if err := tx.QueryRowContext(ctx, `SELECT id FROM cd_snapshots WHERE namespace = '' AND key = ?`, parent).Scan(&id); err != nil {
			return fmt.Errorf("parent snapshot %s: %w", parent, err)
		}
		parentID = id
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO thin_devices
		(device_id, name, role, state, size_bytes, fs_type, created_ns, updated_ns)
		VALUES (?, ?, 'snapshot', ?, ?, 'ext4', 1, 1)`, devID, deviceName(devID), state, int64(1<<30)); err != nil {
		return fmt.Errorf("thin device %d: %w", devID, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO cd_snapshots
		(namespace, key, kind, parent_id, device_id, labels, created_ns, updated_ns, size_bytes, inodes)
		VALUES ('', ?, ?, ?, ?, '{}', ?, ?, 0, 0)`, key, kind, parentID, devID, createdNs, createdNs); err != nil {
		return fmt.Errorf("snapshot %s: %w", key, err)
	}
	return nil
}

// chain is a chains row as the helpers write it.
type chain struct {
	ChainID, ParentChainID, DiffID string
	SizeBytes, FileCount           int64
}

// ImageLayer is an image_layers row as the helpers write it.
type ImageLayer struct {
	Key, ETag string
	SizeBytes int64
	ChainID   string
}

// ActivationKey is the key of image imageID's activation, as migration 8
// defines it and the pipeline derives it.
func ActivationKey(imageID string) string { return "snap-" + imageID }

// StoreDownload writes layer file digest (at LayerPath(digest), size
// bytes) and the object bucket/key downloaded as it, in one transaction,
// as the download machine records them.
func StoreDownload(ctx context.Context, db DB, bucket, key, etag string, size int64, digest string) error {
	return db.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO layers
			(digest, path, size_bytes, has_rootfs, entries, stat_size, stat_mtime_ns, stat_ino, created_ns, diff_id)
			VALUES (?, ?, ?, 0, 0, ?, 5, 7, ?, ?) ON CONFLICT(digest) DO NOTHING`,
			digest, LayerPath(digest), size, size, time.Now().UnixNano(), digest); err != nil {
			return fmt.Errorf("layer %s: %w", digest, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO s3_objects (bucket, key, etag, version_id, size_bytes, digest, downloaded_ns)
			VALUES (?, ?, ?, '', ?, ?, ?)
			ON CONFLICT(bucket, key) DO UPDATE SET etag = excluded.etag, size_bytes = excluded.size_bytes, digest = excluded.digest`,
			bucket, key, etag, size, digest, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("object s3://%s/%s: %w", bucket, key, err)
		}
		return nil
	})
}

// RecordPulledImage writes, in one transaction, that image imageID was
// pulled from source as layers (bottom first), with name (when not empty)
// as one of its names.
func RecordPulledImage(ctx context.Context, db DB, imageID, source string, layers []ImageLayer, name string) error {
	return db.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO s3_images (image_id, source, created_ns, pulled_ns) VALUES (?, ?, ?, ?)
			ON CONFLICT(image_id) DO UPDATE SET failure_reason = NULL, pulled_ns = excluded.pulled_ns`,
			imageID, source, time.Now().UnixNano(), time.Now().UnixNano()); err != nil {
			return fmt.Errorf("image %s: %w", imageID, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM image_layers WHERE image_id = ?`, imageID); err != nil {
			return fmt.Errorf("layers of image %s: %w", imageID, err)
		}
		for i, l := range layers {
			if _, err := tx.ExecContext(ctx, `INSERT INTO image_layers (image_id, position, key, etag, version_id, size_bytes, chain_id)
				VALUES (?, ?, ?, ?, '', ?, ?)`, imageID, i+1, l.Key, l.ETag, l.SizeBytes, l.ChainID); err != nil {
				return fmt.Errorf("layer %d of image %s: %w", i+1, imageID, err)
			}
		}
		if name != "" {
			if _, err := tx.ExecContext(ctx, `INSERT INTO image_names (name, image_id, registered_ns) VALUES (?, ?, ?)`,
				name, imageID, time.Now().UnixNano()); err != nil {
				return fmt.Errorf("name %q of image %s: %w", name, imageID, err)
			}
		}
		return nil
	})
}

// commitChain writes what an unpack leaves for chain c: thin device devID,
// the committed snapshot keyed by c.ChainID on its parent chain's snapshot
// (one transaction), then the chain's row.
func commitChain(ctx context.Context, db DB, c chain, devID uint32) error {
	if err := db.WithTx(ctx, func(tx *sql.Tx) error {
		return insertSnapshot(ctx, tx, c.ChainID, "committed", c.ParentChainID, devID, "inactive", 1)
	}); err != nil {
		return fmt.Errorf("commit chain %s: %w", c.ChainID, err)
	}
	if _, err := exec(ctx, db, `INSERT INTO chains (chain_id, parent_chain_id, diff_id, size_bytes, file_count, unpacked_ns)
		VALUES (?, ?, ?, ?, ?, ?)`, c.ChainID, c.ParentChainID, c.DiffID, c.SizeBytes, c.FileCount, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("chain %s: %w", c.ChainID, err)
	}
	return nil
}

// activate writes image imageID's activation: an active snapshot keyed
// ActivationKey(imageID) on the committed snapshot of parentChain, on thin
// device devID.
func activate(ctx context.Context, db DB, imageID, parentChain string, devID uint32) error {
	return db.WithTx(ctx, func(tx *sql.Tx) error {
		if err := insertSnapshot(ctx, tx, ActivationKey(imageID), "active", parentChain, devID, "active", 2_000_000_000); err != nil {
			return fmt.Errorf("activate %s: %w", imageID, err)
		}
		return nil
	})
}

// RemoveSnapshot deletes the snapshot record keyed key, as containerd's
// garbage collector does through the snapshotter.
func RemoveSnapshot(ctx context.Context, db DB, key string) error {
	res, err := exec(ctx, db, `DELETE FROM cd_snapshots WHERE namespace = '' AND key = ?`, key)
	if err != nil {
		return fmt.Errorf("remove snapshot %s: %w", key, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("remove snapshot %s: %d rows (%v)", key, n, err)
	}
	return nil
}

// Layer is one layer object of a test image.
type Layer struct {
	Key   string // in the image's bucket
	ETag  string
	Size  int64
	Diff  string // the layer's diff ID
	Chain string // its chain ID
}

// LayerPath is where the helpers say layer digest's file is.
func LayerPath(digest string) string { return "/blobs/" + strings.TrimPrefix(digest, "sha256:") }

// bucketOf returns the bucket of an s3:// source.
func bucketOf(source string) string {
	b, _, _ := strings.Cut(strings.TrimPrefix(source, "s3://"), "/")
	return b
}

// World writes test images on one database, handing out thin ids (1, 2,
// ... in the order it makes devices).
type World struct {
	t   testing.TB
	ctx context.Context
	db  DB
	dev uint32 // last thin id handed out
}

// NewWorld returns a World writing on db, failing t on any error.
func NewWorld(t testing.TB, db DB) *World {
	return &World{t: t, ctx: context.Background(), db: db}
}

// Must fails the test on err.
func (w *World) Must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *World) nextDev() uint32 {
	w.dev++
	return w.dev
}

// chain commits chain c unless it is recorded already (a chain is shared
// by the images whose layers start alike).
func (w *World) chain(c chain) {
	w.t.Helper()
	if !w.Has("chains", "chain_id = ?", c.ChainID) {
		w.Must(commitChain(w.ctx, w.db, c, w.nextDev()))
	}
}

// PullNoActivation writes everything a pull of imageID from source leaves
// except the activation: downloads, chains and the pulled-image record
// under name.
func (w *World) PullNoActivation(imageID, source, name string, layers ...Layer) {
	w.t.Helper()
	var recs []ImageLayer
	parent := ""
	for _, l := range layers {
		w.Must(StoreDownload(w.ctx, w.db, bucketOf(source), l.Key, l.ETag, l.Size, l.Diff))
		w.chain(chain{ChainID: l.Chain, ParentChainID: parent, DiffID: l.Diff, SizeBytes: 2 * l.Size, FileCount: 3})
		recs = append(recs, ImageLayer{Key: l.Key, ETag: l.ETag, SizeBytes: l.Size, ChainID: l.Chain})
		parent = l.Chain
	}
	w.Must(RecordPulledImage(w.ctx, w.db, imageID, source, recs, name))
}

// Pull writes everything a pull of imageID from source leaves, activation
// included; it returns the activation's thin id.
func (w *World) Pull(imageID, source, name string, layers ...Layer) uint32 {
	w.t.Helper()
	w.PullNoActivation(imageID, source, name, layers...)
	id := w.nextDev()
	w.Must(activate(w.ctx, w.db, imageID, layers[len(layers)-1].Chain, id))
	return id
}

// RemoveSnapshot deletes the snapshot keyed key (RemoveSnapshot).
func (w *World) RemoveSnapshot(key string) {
	w.t.Helper()
	w.Must(RemoveSnapshot(w.ctx, w.db, key))
}

// Exec runs statement q with args.
func (w *World) Exec(q string, args ...any) {
	w.t.Helper()
	if _, err := exec(w.ctx, w.db, q, args...); err != nil {
		w.t.Fatalf("%s: %v", q, err)
	}
}

// Has reports whether table has a row where cond holds (SQL, with args).
func (w *World) Has(table, cond string, args ...any) bool {
	w.t.Helper()
	return w.Count(table+` WHERE `+cond, args...) > 0
}

// Count returns the number of rows of from (a table, with a WHERE clause
// if wanted, whose parameters are args).
func (w *World) Count(from string, args ...any) int {
	w.t.Helper()
	var n int
	w.Must(w.db.WithTx(w.ctx, func(tx *sql.Tx) error {
		return tx.QueryRowContext(w.ctx, `SELECT COUNT(*) FROM `+from, args...).Scan(&n)
	}))
	return n
}

// AddName writes name as a name of image imageID.
func (w *World) AddName(name, imageID string) {
	w.t.Helper()
	w.Exec(`INSERT INTO image_names (name, image_id, registered_ns) VALUES (?, ?, ?)`, name, imageID, time.Now().UnixNano())
}

// MarkImageFailed writes that a pull of image imageID from source failed
// with reason, creating the image's row if it has none.
func MarkImageFailed(ctx context.Context, db DB, imageID, source, reason string) error {
	if _, err := exec(ctx, db, `INSERT INTO s3_images (image_id, source, failure_reason, created_ns) VALUES (?, ?, ?, ?)
		ON CONFLICT(image_id) DO UPDATE SET failure_reason = excluded.failure_reason`, imageID, source, reason, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("mark image %s failed: %w", imageID, err)
	}
	return nil
}

// deviceName is the dm name the helpers give thin id id.
func deviceName(id uint32) string { return fmt.Sprintf("pool-snap-%d", id) }

// TwoLayers is a two-layer image's layers under prefix, whose bottom
// layer's content is shared with every other image built from it.
func TwoLayers(prefix, top string) []Layer {
	return []Layer{
		{Key: prefix + "1.tar", ETag: `"e1"`, Size: 1000, Diff: "sha256:d1", Chain: "sha256:d1"},
		{Key: prefix + "2.tar", ETag: `"e-` + top + `"`, Size: 2000, Diff: "sha256:d-" + top, Chain: "sha256:c-" + top},
	}
}

// WriteImage writes, as the pipelines do (one transaction per step), what
// pulling and activating single-layer image i leaves: the download, the
// chain with its committed snapshot (thin id 2i+1), the pulled-image record
// named by its URL, and the activation (thin id 2i+2).
func WriteImage(ctx context.Context, db DB, i int) error {
	id, key, diff := fmt.Sprintf("s3-w%d", i), fmt.Sprintf("w/%d.tar", i), fmt.Sprintf("sha256:w%d", i)
	url := "s3://bkt/" + key
	if err := StoreDownload(ctx, db, "bkt", key, `"e"`, int64(i), diff); err != nil {
		return err
	}
	if err := commitChain(ctx, db, chain{ChainID: diff, DiffID: diff, SizeBytes: 1, FileCount: 1}, uint32(2*i+1)); err != nil {
		return err
	}
	if err := RecordPulledImage(ctx, db, id, url, []ImageLayer{{Key: key, ETag: `"e"`, SizeBytes: int64(i), ChainID: diff}}, url); err != nil {
		return err
	}
	return activate(ctx, db, id, diff, uint32(2*i+2))
}

// Run is an fsm_runs row as the helpers write it.
type Run struct {
	ID, FSM, IdempotencyID, Parent string
	RunAfter                       []string
	Request                        string // JSON; "{}" when empty
	State                          string // pending, running, complete, aborted or failed
	Created                        time.Time
	Started                        time.Time // zero: never started
}

// InsertRun writes r as a new row.
func InsertRun(ctx context.Context, db DB, r Run) error {
	if r.Request == "" {
		r.Request = "{}"
	}
	var started any
	if !r.Started.IsZero() {
		started = r.Started.UnixNano()
	}
	_, err := exec(ctx, db, `INSERT INTO fsm_runs
		(run_id, fsm, idempotency_id, parent_id, run_after, request, transition, state, created_at, updated_at, started_at)
		VALUES (?, ?, ?, ?, ?, ?, 'start', ?, ?, ?, ?)`,
		r.ID, r.FSM, r.IdempotencyID, r.Parent, strings.Join(r.RunAfter, " "), r.Request, r.State,
		r.Created.UnixNano(), r.Created.UnixNano(), started)
	if err != nil {
		return fmt.Errorf("insert run %s: %w", r.ID, err)
	}
	return nil
}

// FinishRun moves run id to the terminal state at time at.
func FinishRun(ctx context.Context, db DB, id, state string, at time.Time) error {
	if _, err := exec(ctx, db, `UPDATE fsm_runs SET state = ?, updated_at = ?, finished_at = ? WHERE run_id = ?`,
		state, at.UnixNano(), at.UnixNano(), id); err != nil {
		return fmt.Errorf("finish run %s: %w", id, err)
	}
	return nil
}

// Listed writes what the listings' tests read: s3-a pulled (two layers)
// and activated with two names and a running run on it, s3-b pulled
// (sharing s3-a's bottom layer) and not activated, s3-c whose only pull
// failed; and a pending run. It returns the World and the running run's
// start time.
func Listed(t testing.TB, db DB) (*World, time.Time) {
	t.Helper()
	w := NewWorld(t, db)
	w.Pull("s3-a", "s3://bkt/a/", "a:latest", TwoLayers("a/", "a")...) // thin ids 1 (d1), 2 (c-a), 3 (activation)
	w.AddName("a:v1", "s3-a")
	w.PullNoActivation("s3-b", "s3://bkt/b/", "b:latest", TwoLayers("b/", "b")...) // thin id 4 (c-b)
	w.Must(MarkImageFailed(w.ctx, db, "s3-c", "s3://bkt/c.tar", `validate s3://bkt/c.tar: entry "../x" climbs above the root`))
	t0 := time.Unix(1_800_000_000, 0).UTC()
	for _, r := range []Run{
		{ID: "r-a", FSM: "activate-image", IdempotencyID: "s3-a", State: "running", Started: t0},
		{ID: "r-p", FSM: "download-image", IdempotencyID: "sha256:zz", State: "pending"},
	} {
		r.Created = t0.Add(-time.Second)
		w.Must(InsertRun(w.ctx, db, r))
	}
	return w, t0
}

// Rows runs query on q and returns its rows, each as its columns' values
// separated by spaces (TEXT as it is, NULL as <nil>), for tests that check
// what a package recorded without its queries.
func Rows(t testing.TB, q Querier, query string, args ...any) []string {
	t.Helper()
	rows, err := q.QueryContext(context.Background(), query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		fields := make([]string, len(vals))
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			fields[i] = fmt.Sprint(v)
		}
		out = append(out, strings.Join(fields, " "))
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return out
}
