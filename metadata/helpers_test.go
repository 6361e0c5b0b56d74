package metadata

// Helpers that write what the pipelines and the snapshotter leave in the
// database on real SQLite files. The tables' queries belong to the
// packages that import this one (fetcher/pipeline, snapshotter,
// fetcher/fsm), so the helpers write and read their rows in SQL, the way
// those packages record them.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The snapshotter's tables belong to package snapshotter, which imports
// this one, so the helpers write their rows in SQL, the way it records
// them: every snapshot in the one keyspace "", each on its own thin device.

// insertSnapshot writes thin device devID in state and the snapshot keyed
// key of kind on it, whose parent is the snapshot keyed parent ("" for
// none), created at createdNs.
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

// testChain is a chains row as the tests write it.
type testChain struct {
	ChainID, ParentChainID, DiffID string
	SizeBytes, FileCount           int64
}

// testImageLayer is an image_layers row as the tests write it.
type testImageLayer struct {
	Key, ETag string
	SizeBytes int64
	ChainID   string
}

// activationKey is the key of image imageID's activation, as the pipeline
// derives it.
func activationKey(imageID string) string { return ActivationPrefix + imageID }

// storeDownload writes layer file digest (at layerPath(digest), size bytes)
// and the object bucket/key downloaded as it, in one transaction, as the
// download machine records them.
func storeDownload(ctx context.Context, db *DB, bucket, key, etag string, size int64, digest string) error {
	return db.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO layers
			(digest, path, size_bytes, has_rootfs, entries, stat_size, stat_mtime_ns, stat_ino, created_ns, diff_id)
			VALUES (?, ?, ?, 0, 0, ?, 5, 7, ?, ?) ON CONFLICT(digest) DO NOTHING`,
			digest, layerPath(digest), size, size, time.Now().UnixNano(), digest); err != nil {
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

// recordPulledImage writes, in one transaction, that image imageID was
// pulled from source as layers (bottom first), with name (when not empty)
// as one of its names.
func recordPulledImage(ctx context.Context, db *DB, imageID, source string, layers []testImageLayer, name string) error {
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
func commitChain(ctx context.Context, db *DB, c testChain, devID uint32) error {
	if err := db.WithTx(ctx, func(tx *sql.Tx) error {
		return insertSnapshot(ctx, tx, c.ChainID, "committed", c.ParentChainID, devID, "inactive", 1)
	}); err != nil {
		return fmt.Errorf("commit chain %s: %w", c.ChainID, err)
	}
	if _, err := db.db.ExecContext(ctx, `INSERT INTO chains (chain_id, parent_chain_id, diff_id, size_bytes, file_count, unpacked_ns)
		VALUES (?, ?, ?, ?, ?, ?)`, c.ChainID, c.ParentChainID, c.DiffID, c.SizeBytes, c.FileCount, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("chain %s: %w", c.ChainID, err)
	}
	return nil
}

// activate writes image imageID's activation: an active snapshot keyed
// activationKey(imageID) on the committed snapshot of parentChain, on thin
// device devID.
func activate(ctx context.Context, db *DB, imageID, parentChain string, devID uint32) error {
	return db.WithTx(ctx, func(tx *sql.Tx) error {
		if err := insertSnapshot(ctx, tx, activationKey(imageID), "active", parentChain, devID, "active", 2_000_000_000); err != nil {
			return fmt.Errorf("activate %s: %w", imageID, err)
		}
		return nil
	})
}

// removeSnapshotKey deletes the snapshot record keyed key, as containerd's
// garbage collector does through the snapshotter.
func removeSnapshotKey(ctx context.Context, db *DB, key string) error {
	res, err := db.db.ExecContext(ctx, `DELETE FROM cd_snapshots WHERE namespace = '' AND key = ?`, key)
	if err != nil {
		return fmt.Errorf("remove snapshot %s: %w", key, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("remove snapshot %s: %d rows (%v)", key, n, err)
	}
	return nil
}

// testLayer is one layer object of a test image.
type testLayer struct {
	Key   string // in the image's bucket
	ETag  string
	Size  int64
	Diff  string // the layer's diff ID
	Chain string // its chain ID
}

// layerPath is where the helpers say layer digest's file is.
func layerPath(digest string) string { return "/blobs/" + strings.TrimPrefix(digest, "sha256:") }

// bucketOf returns the bucket of an s3:// source.
func bucketOf(source string) string {
	b, _, _ := strings.Cut(strings.TrimPrefix(source, "s3://"), "/")
	return b
}

// world writes test images on one database, handing out thin ids.
type world struct {
	t   testing.TB
	ctx context.Context
	db  *DB
	dev uint32 // last thin id handed out
}

func newWorld(t testing.TB) *world {
	t.Helper()
	return &world{t: t, ctx: context.Background(), db: openTestDB(t)}
}

func (w *world) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) nextDev() uint32 {
	w.dev++
	return w.dev
}

// download records that bucket/l.Key was downloaded as layer l.Diff.
func (w *world) download(bucket string, l testLayer) {
	w.t.Helper()
	w.must(storeDownload(w.ctx, w.db, bucket, l.Key, l.ETag, l.Size, l.Diff))
}

// chain commits chain c unless it is recorded already (a chain is shared
// by the images whose layers start alike).
func (w *world) chain(c testChain) {
	w.t.Helper()
	if !w.has("chains", "chain_id = ?", c.ChainID) {
		w.must(commitChain(w.ctx, w.db, c, w.nextDev()))
	}
}

// pullNoActivation writes everything a pull of imageID from source leaves
// except the activation: downloads, chains and the pulled-image record
// under name.
func (w *world) pullNoActivation(imageID, source, name string, layers ...testLayer) {
	w.t.Helper()
	var recs []testImageLayer
	parent := ""
	for _, l := range layers {
		w.download(bucketOf(source), l)
		w.chain(testChain{ChainID: l.Chain, ParentChainID: parent, DiffID: l.Diff, SizeBytes: 2 * l.Size, FileCount: 3})
		recs = append(recs, testImageLayer{Key: l.Key, ETag: l.ETag, SizeBytes: l.Size, ChainID: l.Chain})
		parent = l.Chain
	}
	w.must(recordPulledImage(w.ctx, w.db, imageID, source, recs, name))
}

// pull writes everything a pull of imageID from source leaves, activation
// included; it returns the activation's thin id.
func (w *world) pull(imageID, source, name string, layers ...testLayer) uint32 {
	w.t.Helper()
	w.pullNoActivation(imageID, source, name, layers...)
	id := w.nextDev()
	w.must(activate(w.ctx, w.db, imageID, layers[len(layers)-1].Chain, id))
	return id
}

func (w *world) removeSnapshot(key string) {
	w.t.Helper()
	w.must(removeSnapshotKey(w.ctx, w.db, key))
}

func (w *world) exec(q string, args ...any) {
	w.t.Helper()
	if _, err := w.db.db.ExecContext(w.ctx, q, args...); err != nil {
		w.t.Fatalf("%s: %v", q, err)
	}
}

// has reports whether table has a row where cond holds (SQL, with args).
func (w *world) has(table, cond string, args ...any) bool {
	w.t.Helper()
	var n int
	w.must(w.db.db.QueryRowContext(w.ctx, `SELECT COUNT(*) FROM `+table+` WHERE `+cond, args...).Scan(&n))
	return n > 0
}

// addName writes name as a name of image imageID.
func (w *world) addName(name, imageID string) {
	w.t.Helper()
	w.exec(`INSERT INTO image_names (name, image_id, registered_ns) VALUES (?, ?, ?)`, name, imageID, time.Now().UnixNano())
}

// markImageFailed writes that a pull of image imageID from source failed
// with reason, creating the image's row if it has none.
func markImageFailed(ctx context.Context, d *DB, imageID, source, reason string) error {
	if _, err := d.db.ExecContext(ctx, `INSERT INTO s3_images (image_id, source, failure_reason, created_ns) VALUES (?, ?, ?, ?)
		ON CONFLICT(image_id) DO UPDATE SET failure_reason = excluded.failure_reason`, imageID, source, reason, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("mark image %s failed: %w", imageID, err)
	}
	return nil
}

func (w *world) count(table string) int {
	w.t.Helper()
	var n int
	w.must(w.db.db.QueryRowContext(w.ctx, `SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

// deviceName is the dm name the helpers give thin id id.
func deviceName(id uint32) string { return fmt.Sprintf("pool-snap-%d", id) }

// twoLayers is a two-layer image's layers under prefix, whose bottom
// layer's content is shared with every other image built from it.
func twoLayers(prefix, top string) []testLayer {
	return []testLayer{
		{Key: prefix + "1.tar", ETag: `"e1"`, Size: 1000, Diff: "sha256:d1", Chain: "sha256:d1"},
		{Key: prefix + "2.tar", ETag: `"e-` + top + `"`, Size: 2000, Diff: "sha256:d-" + top, Chain: "sha256:c-" + top},
	}
}

// writeImage writes, as the pipelines do (one transaction per step), what
// pulling and activating single-layer image i leaves: the download, the
// chain with its committed snapshot (thin id 2i+1), the pulled-image record
// named by its URL, and the activation (thin id 2i+2).
func writeImage(ctx context.Context, db *DB, i int) error {
	id, key, diff := fmt.Sprintf("s3-w%d", i), fmt.Sprintf("w/%d.tar", i), fmt.Sprintf("sha256:w%d", i)
	url := "s3://bkt/" + key
	if err := storeDownload(ctx, db, "bkt", key, `"e"`, int64(i), diff); err != nil {
		return err
	}
	if err := commitChain(ctx, db, testChain{ChainID: diff, DiffID: diff, SizeBytes: 1, FileCount: 1}, uint32(2*i+1)); err != nil {
		return err
	}
	if err := recordPulledImage(ctx, db, id, url, []testImageLayer{{Key: key, ETag: `"e"`, SizeBytes: int64(i), ChainID: diff}}, url); err != nil {
		return err
	}
	return activate(ctx, db, id, diff, uint32(2*i+2))
}

// testRun is an fsm_runs row as the tests of this package write it: the
// table's queries belong to the runner (fetcher/fsm), which imports this
// package, so the rows the upkeep here reads are written in SQL.
type testRun struct {
	ID, FSM, IdempotencyID, Parent string
	RunAfter                       []string
	Request                        string // JSON; "{}" when empty
	State                          string // pending, running, complete, aborted or failed
	Created                        time.Time
	Started                        time.Time // zero: never started
}

// insertRun writes r as a new row.
func insertRun(ctx context.Context, d *DB, r testRun) error {
	if r.Request == "" {
		r.Request = "{}"
	}
	var started any
	if !r.Started.IsZero() {
		started = r.Started.UnixNano()
	}
	_, err := d.db.ExecContext(ctx, `INSERT INTO fsm_runs
		(run_id, fsm, idempotency_id, parent_id, run_after, request, transition, state, created_at, updated_at, started_at)
		VALUES (?, ?, ?, ?, ?, ?, 'start', ?, ?, ?, ?)`,
		r.ID, r.FSM, r.IdempotencyID, r.Parent, strings.Join(r.RunAfter, " "), r.Request, r.State,
		r.Created.UnixNano(), r.Created.UnixNano(), started)
	return err
}

// finishRun moves run id to the terminal state at time at.
func finishRun(ctx context.Context, d *DB, id, state string, at time.Time) error {
	_, err := d.db.ExecContext(ctx, `UPDATE fsm_runs SET state = ?, updated_at = ?, finished_at = ? WHERE run_id = ?`,
		state, at.UnixNano(), at.UnixNano(), id)
	return err
}

// rowsOf runs query on d and returns its rows, each as its columns'
// values separated by spaces (TEXT as it is, NULL as <nil>), for tests
// that check what a package above this one recorded without its queries.
func rowsOf(t testing.TB, d *DB, query string, args ...any) []string {
	t.Helper()
	rows, err := d.db.QueryContext(context.Background(), query, args...)
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
