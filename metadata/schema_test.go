package metadata

import (
	"context"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// TestSchemaOfRecords checks the record tables, their indexes and foreign
// keys, and that the first schema's tables are views with that schema's
// columns.
func TestSchemaOfRecords(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	objects := func(typ string) map[string]bool {
		names, err := queryAll(ctx, d.db, "objects", func(s rowScanner) (string, error) {
			var n string
			return n, s.Scan(&n)
		}, `SELECT name FROM sqlite_master WHERE type = ?`, typ)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	tables, views := objects("table"), objects("view")
	for _, tbl := range []string{"layers", "s3_objects", "chains", "s3_images", "image_layers", "image_names", "schema_migrations",
		"cd_snapshots", "thin_devices", "fsm_runs"} {
		if !tables[tbl] {
			t.Errorf("table %s missing", tbl)
		}
	}
	for _, gone := range []string{"pipeline_images", "pipeline_chains", "pipeline_blobs", "pipeline_etags"} {
		if tables[gone] {
			t.Errorf("table %s of the previous schema is still there", gone)
		}
	}
	wantViews := map[string]string{
		"images": "id image_id s3_key local_path checksum size_bytes download_status activation_status created_at downloaded_at " +
			"activated_at updated_at failure_reason",
		"unpacked_images": "id image_id device_id device_name device_path size_bytes file_count layout_verified created_at unpacked_at updated_at",
		"snapshots":       "id image_id snapshot_id snapshot_name device_path origin_device_id active created_at deactivated_at updated_at",
		"image_locks":     "image_id locked_at locked_by",
	}
	for v, cols := range wantViews {
		if !views[v] || tables[v] {
			t.Errorf("%s is not a view (view %v, table %v)", v, views[v], tables[v])
			continue
		}
		got, err := queryAll(ctx, d.db, "columns", func(s rowScanner) (string, error) {
			var n string
			return n, s.Scan(&n)
		}, `SELECT name FROM pragma_table_info(?) ORDER BY cid`, v)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, " ") != cols {
			t.Errorf("columns of view %s = %v, want %s", v, got, cols)
		}
	}
	wantIndexes := map[string]string{
		"s3_objects_digest":    "s3_objects(digest)",
		"chains_parent":        "chains(parent_chain_id)",
		"image_layers_chain":   "image_layers(chain_id)",
		"image_names_image":    "image_names(image_id)",
		"idx_cd_snapshots_key": "cd_snapshots(key)",
	}
	for name, on := range wantIndexes {
		var sqlText string
		if err := d.db.QueryRowContext(ctx, `SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?`, name).Scan(&sqlText); err != nil {
			t.Errorf("index %s: %v", name, err)
			continue
		}
		if !strings.Contains(strings.ReplaceAll(sqlText, " ", ""), strings.ReplaceAll(on, " ", "")) {
			t.Errorf("index %s is %q, want it on %s", name, sqlText, on)
		}
	}
	wantFKs := map[string]string{
		"image_layers": "image_id->s3_images.image_id CASCADE",
		"image_names":  "image_id->s3_images.image_id CASCADE",
	}
	for table, want := range wantFKs {
		got, err := queryAll(ctx, d.db, "foreign keys", func(s rowScanner) (string, error) {
			var from, parent, to, onDelete string
			err := s.Scan(&from, &parent, &to, &onDelete)
			return from + "->" + parent + "." + to + " " + onDelete, err
		}, `SELECT "from", "table", "to", on_delete FROM pragma_foreign_key_list(?) ORDER BY "from"`, table)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, ",") != want {
			t.Errorf("foreign keys of %s = %v, want %v", table, got, want)
		}
	}
}

// TestConstraintsRejectBadRows inserts, for every CHECK, foreign key and
// unique rule of the record tables, a row that breaks it and expects SQLite
// to refuse it with the matching constraint error.
func TestConstraintsRejectBadRows(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	setup := []string{
		`INSERT INTO layers (digest, path, size_bytes, stat_size, stat_mtime_ns, stat_ino, created_ns) VALUES ('sha256:a', '/a', 1, 1, 1, 1, 1)`,
		`INSERT INTO s3_objects (bucket, key, etag, size_bytes, digest, downloaded_ns) VALUES ('b', 'k.tar', '"e"', 1, 'sha256:a', 1)`,
		`INSERT INTO chains (chain_id, diff_id, unpacked_ns) VALUES ('sha256:a', 'sha256:a', 1)`,
		`INSERT INTO s3_images (image_id, source, created_ns) VALUES ('img', 's3://b/k.tar', 1)`,
		`INSERT INTO image_layers (image_id, position, key, size_bytes, chain_id) VALUES ('img', 1, 'k.tar', 1, 'sha256:a')`,
		`INSERT INTO image_names (name, image_id, registered_ns) VALUES ('k:latest', 'img', 1)`,
	}
	for _, s := range setup {
		if _, err := d.db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	bad := []struct{ name, sql, wantErr string }{
		{"layers.size_bytes", `INSERT INTO layers (digest, path, size_bytes, stat_size, stat_mtime_ns, stat_ino, created_ns) VALUES ('sha256:b', '/b', -1, 1, 1, 1, 1)`, "CHECK constraint failed"},
		{"layers.has_rootfs", `UPDATE layers SET has_rootfs = 2`, "CHECK constraint failed"},
		{"layers.entries", `UPDATE layers SET entries = -1`, "CHECK constraint failed"},
		{"layers.digest primary key", `INSERT INTO layers (digest, path, size_bytes, stat_size, stat_mtime_ns, stat_ino, created_ns) VALUES ('sha256:a', '/b', 1, 1, 1, 1, 1)`, "UNIQUE constraint failed"},
		{"layers.path not null", `INSERT INTO layers (digest, size_bytes, stat_size, stat_mtime_ns, stat_ino, created_ns) VALUES ('sha256:b', 1, 1, 1, 1, 1)`, "NOT NULL constraint failed"},
		{"s3_objects.size_bytes", `UPDATE s3_objects SET size_bytes = -1`, "CHECK constraint failed"},
		{"s3_objects primary key", `INSERT INTO s3_objects (bucket, key, etag, size_bytes, digest, downloaded_ns) VALUES ('b', 'k.tar', '"f"', 1, 'sha256:a', 2)`, "UNIQUE constraint failed"},
		{"chains.size_bytes", `UPDATE chains SET size_bytes = -1`, "CHECK constraint failed"},
		{"chains.file_count", `UPDATE chains SET file_count = -1`, "CHECK constraint failed"},
		{"s3_images.image_id unique", `INSERT INTO s3_images (image_id, source, created_ns) VALUES ('img', 's3://b/other.tar', 1)`, "UNIQUE constraint failed"},
		{"s3_images.source unique", `INSERT INTO s3_images (image_id, source, created_ns) VALUES ('img2', 's3://b/k.tar', 1)`, "UNIQUE constraint failed"},
		{"image_layers.position", `INSERT INTO image_layers (image_id, position, key, size_bytes, chain_id) VALUES ('img', 0, 'k.tar', 1, 'sha256:a')`, "CHECK constraint failed"},
		{"image_layers.size_bytes", `INSERT INTO image_layers (image_id, position, key, size_bytes, chain_id) VALUES ('img', 2, 'k.tar', -1, 'sha256:a')`, "CHECK constraint failed"},
		{"image_layers primary key", `INSERT INTO image_layers (image_id, position, key, size_bytes, chain_id) VALUES ('img', 1, 'k2.tar', 1, 'sha256:a')`, "UNIQUE constraint failed"},
		{"image_layers.image_id fk", `INSERT INTO image_layers (image_id, position, key, size_bytes, chain_id) VALUES ('ghost', 1, 'k.tar', 1, 'sha256:a')`, "FOREIGN KEY constraint failed"},
		{"image_names.image_id fk", `INSERT INTO image_names (name, image_id, registered_ns) VALUES ('g:latest', 'ghost', 1)`, "FOREIGN KEY constraint failed"},
		{"image_names.name primary key", `INSERT INTO image_names (name, image_id, registered_ns) VALUES ('k:latest', 'img', 2)`, "UNIQUE constraint failed"},
	}
	for _, b := range bad {
		_, err := d.db.ExecContext(ctx, b.sql)
		if err == nil || !strings.Contains(err.Error(), b.wantErr) {
			t.Errorf("%s: err = %v, want %q", b.name, err, b.wantErr)
		}
	}
	// Nothing of the rejected rows is left.
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM layers) + (SELECT count(*) FROM s3_objects) + (SELECT count(*) FROM chains)
		+ (SELECT count(*) FROM s3_images) + (SELECT count(*) FROM image_layers) + (SELECT count(*) FROM image_names)`).Scan(&n); err != nil || n != 6 {
		t.Errorf("rows after rejected inserts = %d, %v; want the 6 set-up rows", n, err)
	}
}

// TestCascades: deleting an image removes its layers and names; the chains,
// objects and layer files stay (other images may use them; the pipeline's
// pruning decides).
func TestCascades(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	w := seed.NewWorld(t, d)
	w.Pull("s3-a", "s3://bkt/a/", "a:latest", seed.TwoLayers("a/", "a")...)
	w.Pull("s3-b", "s3://bkt/b/", "b:latest", seed.TwoLayers("b/", "b")...)
	w.Exec(`DELETE FROM s3_images WHERE image_id = ?`, "s3-a")
	for table, want := range map[string]int{"s3_images": 1, "image_layers": 2, "image_names": 1, "chains": 3, "s3_objects": 4, "layers": 3} {
		if got := w.Count(table); got != want {
			t.Errorf("%s has %d rows after deleting s3-a, want %d", table, got, want)
		}
	}
	var n int
	w.Must(d.db.QueryRowContext(ctx, `SELECT count(*) FROM image_layers WHERE image_id = 's3-a'`).Scan(&n))
	if n != 0 {
		t.Errorf("%d layers of the deleted image left", n)
	}
	if rep, err := d.Check(ctx); err != nil || !rep.OK() {
		t.Errorf("Check after the delete = %+v, %v", rep, err)
	}
}
