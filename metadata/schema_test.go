package metadata

import (
	"context"
	"strings"
	"testing"
)

// TestSchemaMatchesSeed checks the tables, indexes and constraints of seed
// 000 are all present as the seed declares them.
func TestSchemaMatchesSeed(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	wantIndexes := map[string]string{
		"idx_images_s3_key":               "images(s3_key)",
		"idx_images_image_id":             "images(image_id)",
		"idx_images_download_status":      "images(download_status)",
		"idx_images_activation_status":    "images(activation_status)",
		"idx_images_downloaded_at":        "images(downloaded_at)",
		"idx_unpacked_images_image_id":    "unpacked_images(image_id)",
		"idx_unpacked_images_device_id":   "unpacked_images(device_id)",
		"idx_unpacked_images_device_name": "unpacked_images(device_name)",
		"idx_unpacked_images_unpacked_at": "unpacked_images(unpacked_at)",
		"idx_snapshots_image_id":          "snapshots(image_id)",
		"idx_snapshots_snapshot_id":       "snapshots(snapshot_id)",
		"idx_snapshots_snapshot_name":     "snapshots(snapshot_name)",
		"idx_snapshots_active":            "snapshots(active)",
		"idx_snapshots_origin_device_id":  "snapshots(origin_device_id)",
		"idx_snapshots_created_at":        "snapshots(created_at)",
		"idx_image_locks_locked_at":       "image_locks(locked_at)",
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
	wantFKs := map[string][]string{
		"unpacked_images": {"image_id->images.image_id CASCADE"},
		"snapshots":       {"image_id->images.image_id CASCADE", "origin_device_id->unpacked_images.device_id RESTRICT"},
	}
	for table, want := range wantFKs {
		rows, err := d.db.QueryContext(ctx, `SELECT "from", "table", "to", on_delete FROM pragma_foreign_key_list(?) ORDER BY "from"`, table)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for rows.Next() {
			var from, parent, to, onDelete string
			if err := rows.Scan(&from, &parent, &to, &onDelete); err != nil {
				t.Fatal(err)
			}
			got = append(got, from+"->"+parent+"."+to+" "+onDelete)
		}
		rows.Close()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("foreign keys of %s = %v, want %v", table, got, want)
		}
	}
	for _, tbl := range []string{"images", "unpacked_images", "snapshots", "image_locks", "schema_migrations"} {
		var n int
		if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, tbl).Scan(&n); err != nil || n != 1 {
			t.Errorf("table %s missing (%v)", tbl, err)
		}
	}
}

// TestConstraintsRejectBadRows inserts, for every CHECK, NOT NULL-free
// foreign key and UNIQUE rule of seed 000, a row that breaks it and expects
// SQLite to refuse it with the matching constraint error.
func TestConstraintsRejectBadRows(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	setup := []string{
		`INSERT INTO images (image_id, s3_key, local_path, size_bytes) VALUES ('img', 'k.tar', '/p', 1)`,
		`INSERT INTO unpacked_images (image_id, device_id, device_name, device_path, size_bytes, file_count, layout_verified) VALUES ('img', '1', 'thin-1', '/dev/mapper/thin-1', 1, 1, 1)`,
	}
	for _, s := range setup {
		if _, err := d.db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	bad := []struct {
		name, sql, wantErr string
	}{
		{"images.download_status", `INSERT INTO images (image_id, s3_key, local_path, size_bytes, download_status) VALUES ('i2', 'k2', '/p', 1, 'done')`, "CHECK constraint failed"},
		{"images.activation_status", `INSERT INTO images (image_id, s3_key, local_path, size_bytes, activation_status) VALUES ('i2', 'k2', '/p', 1, 'running')`, "CHECK constraint failed"},
		{"images.size_bytes", `INSERT INTO images (image_id, s3_key, local_path, size_bytes) VALUES ('i2', 'k2', '/p', -1)`, "CHECK constraint failed"},
		{"images.image_id unique", `INSERT INTO images (image_id, s3_key, local_path, size_bytes) VALUES ('img', 'k2', '/p', 1)`, "UNIQUE constraint failed"},
		{"images.s3_key unique", `INSERT INTO images (image_id, s3_key, local_path, size_bytes) VALUES ('i2', 'k.tar', '/p', 1)`, "UNIQUE constraint failed"},
		{"images.local_path not null", `INSERT INTO images (image_id, s3_key, size_bytes) VALUES ('i2', 'k2', 1)`, "NOT NULL constraint failed"},
		{"unpacked.size_bytes", `INSERT INTO unpacked_images (image_id, device_id, device_name, device_path, size_bytes, file_count) VALUES ('img', '2', 'thin-2', '/x', -1, 0)`, "CHECK constraint failed"},
		{"unpacked.file_count", `INSERT INTO unpacked_images (image_id, device_id, device_name, device_path, size_bytes, file_count) VALUES ('img', '2', 'thin-2', '/x', 0, -1)`, "CHECK constraint failed"},
		{"unpacked.layout_verified", `UPDATE unpacked_images SET layout_verified = 2`, "CHECK constraint failed"},
		{"unpacked.image_id fk", `INSERT INTO unpacked_images (image_id, device_id, device_name, device_path, size_bytes, file_count) VALUES ('ghost', '2', 'thin-2', '/x', 0, 0)`, "FOREIGN KEY constraint failed"},
		{"unpacked.device_name unique", `UPDATE unpacked_images SET device_name = device_name || ''`, ""}, // no-op update is fine
		{"snapshots.active", `INSERT INTO snapshots (image_id, snapshot_id, snapshot_name, device_path, origin_device_id, active) VALUES ('img', 's', 'n', '/x', '1', 2)`, "CHECK constraint failed"},
		{"snapshots.image_id fk", `INSERT INTO snapshots (image_id, snapshot_id, snapshot_name, device_path, origin_device_id) VALUES ('ghost', 's', 'n', '/x', '1')`, "FOREIGN KEY constraint failed"},
		{"snapshots.origin_device_id fk", `INSERT INTO snapshots (image_id, snapshot_id, snapshot_name, device_path, origin_device_id) VALUES ('img', 's', 'n', '/x', '404')`, "FOREIGN KEY constraint failed"},
		{"image_locks.image_id primary key", `INSERT INTO image_locks (image_id, locked_at, locked_by) VALUES ('img', 1, 'a'), ('img', 2, 'b')`, "UNIQUE constraint failed"},
	}
	for _, b := range bad {
		_, err := d.db.ExecContext(ctx, b.sql)
		if b.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", b.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), b.wantErr) {
			t.Errorf("%s: err = %v, want %q", b.name, err, b.wantErr)
		}
	}
	// Nothing of the rejected rows is left.
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM images) + (SELECT count(*) FROM unpacked_images) + (SELECT count(*) FROM snapshots) + (SELECT count(*) FROM image_locks)`).Scan(&n); err != nil || n != 2 {
		t.Errorf("rows after rejected inserts = %d, %v; want the 2 set-up rows", n, err)
	}
}

// TestCascades: deleting an image removes its unpacked record and its
// snapshots; a device still referenced by a snapshot cannot be deleted
// (RESTRICT), even through another image's cascade.
func TestCascades(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	a, _ := seedImage(t, d, 1)
	seedUnpacked(t, d, a, 1)
	if err := d.RegisterActivation(ctx, snapRecord(a, "1", 1)); err != nil {
		t.Fatal(err)
	}
	// RESTRICT: the device has a snapshot.
	if err := d.DeleteUnpackedImage(ctx, a); err == nil || !strings.Contains(err.Error(), "FOREIGN KEY constraint failed") {
		t.Fatalf("DeleteUnpackedImage with a snapshot on the device: err = %v, want FOREIGN KEY constraint failed", err)
	}
	// b's snapshot uses a's device: deleting a must be refused (it would
	// cascade to a's device while b's snapshot still references it).
	b, _ := seedImage(t, d, 2)
	if err := d.RegisterActivation(ctx, snapRecord(b, "1", 1)); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteImage(ctx, a); err == nil {
		t.Fatalf("DeleteImage(a) succeeded while b's snapshot references a's device")
	}
	if _, err := d.GetUnpackedImageByID(ctx, a); err != nil {
		t.Fatalf("a's device was removed by a refused delete: %v", err)
	}
	// Once b (and its snapshot) is gone, deleting a cascades to its
	// unpacked record and its own snapshot.
	if err := d.DeleteImage(ctx, b); err != nil {
		t.Fatal(err)
	}
	if sn, _ := d.GetSnapshotsByImageID(ctx, b); len(sn) != 0 {
		t.Errorf("b's snapshots survived its delete: %d", len(sn))
	}
	if err := d.DeleteImage(ctx, a); err != nil {
		t.Fatalf("DeleteImage(a): %v", err)
	}
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM unpacked_images) + (SELECT count(*) FROM snapshots)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("rows left after cascading deletes = %d, %v", n, err)
	}
}
