package metadata

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// The database testdata/release-0007.db was written by the previous
// release's own code (schema version 7): two images pulled from prefixes
// whose bottom layers have the same bytes, one pulled from a single key and
// named by its URL, and one failed download of a single object.
const (
	debianID    = "s3-947b2eb1128e60f13690c8ad"
	debianDevID = "s3-040d2bcbceee05096e997f06"
	singleID    = "s3-5f5237ee6ff24bfb43c15811"

	debianTop    = "sha256:c278d7c4a43fe4796a960b9becad531abe25fb65baf3c98b1cba90d55672302e"
	debianDevTop = "sha256:a5f50d1605b52d92e4b9216d64d2ad804755363a990987988b0093e56a2a894a"
)

// copyRelease0007 copies the fixture to a temporary directory.
func copyRelease0007(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "release-0007.db"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "metadata.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkRelease0007Records checks that d holds the fixture's pulled images
// in the records of migration 8.
func checkRelease0007Records(t *testing.T, d *DB) {
	t.Helper()
	// The pipelines' records, read in SQL (their queries are
	// fetcher/pipeline's): every image pulled, no failure.
	imgs := seed.Rows(t, d.db, `SELECT image_id, source, IFNULL(failure_reason, ''), pulled_ns IS NOT NULL FROM s3_images ORDER BY id`)
	wantImgs := []string{
		debianID + " s3://flyio-images/images/debian/  1",
		debianDevID + " s3://flyio-images/images/debian-dev/  1",
		singleID + " s3://flyio-images/images/single.tar  1",
	}
	if !reflect.DeepEqual(imgs, wantImgs) {
		t.Fatalf("images = %q, want %q (the 3 pulled images)", imgs, wantImgs)
	}
	// The first schema's views, as an operator reads them.
	views := seed.Rows(t, d.db, `SELECT i.image_id, i.download_status, i.activation_status, i.size_bytes, u.device_name,
		(SELECT count(*) FROM snapshots s WHERE s.image_id = i.image_id)
		FROM images i LEFT JOIN unpacked_images u ON u.image_id = i.image_id ORDER BY i.id`)
	wantViews := []string{
		"s3-947b2eb1128e60f13690c8ad completed active 3000 flyio-pool-snap-102 1",
		"s3-040d2bcbceee05096e997f06 completed active 4000 flyio-pool-snap-103 1",
		"s3-5f5237ee6ff24bfb43c15811 completed active 4000 flyio-pool-snap-104 1",
	}
	if !reflect.DeepEqual(views, wantViews) {
		t.Errorf("images view:\n got  %q\n want %q", views, wantViews)
	}

	const layersOf = `SELECT position, key, etag, version_id, size_bytes, chain_id FROM image_layers WHERE image_id = ? ORDER BY position`
	if got, want := seed.Rows(t, d.db, layersOf, debianID), []string{
		`1 images/debian/1.tar "e1"  1000 sha256:11`,
		`2 images/debian/2.tar "e2"  2000 ` + debianTop,
	}; !reflect.DeepEqual(got, want) {
		t.Errorf("layers of debian = %q, want %q", got, want)
	}
	if got, want := seed.Rows(t, d.db, layersOf, singleID), []string{`1 images/single.tar "e4"  4000 sha256:44`}; !reflect.DeepEqual(got, want) {
		t.Errorf("layers of single = %q, want %q", got, want)
	}

	const objectOf = `SELECT o.etag, o.digest, o.size_bytes, IFNULL(l.diff_id, '') FROM s3_objects o
		LEFT JOIN layers l ON l.digest = o.digest WHERE o.bucket = 'flyio-images' AND o.key = ?`
	for key, want := range map[string]string{
		"images/debian/1.tar":     `"e1" sha256:11 1000 sha256:11`,
		"images/debian-dev/2.tar": `"e3" sha256:33 3000 sha256:33`,
	} {
		if got := seed.Rows(t, d.db, objectOf, key); len(got) != 1 || got[0] != want {
			t.Errorf("object %s = %q, want %q", key, got, want)
		}
	}
	if got := seed.Rows(t, d.db, objectOf, "images/bad.tar"); len(got) != 0 {
		t.Errorf("the failed download of images/bad.tar was carried over: %q", got)
	}
	if got, want := seed.Rows(t, d.db, `SELECT path, size_bytes, stat_size, stat_mtime_ns, stat_ino, diff_id FROM layers WHERE digest = 'sha256:22'`),
		[]string{"/var/lib/containerd-flyio-snapshotter/images/blobs/sha256/22 2000 2000 5 7 sha256:22"}; !reflect.DeepEqual(got, want) {
		t.Errorf("layer file sha256:22 = %q, want %q (a plain tar of an earlier release has its digest as diff ID)", got, want)
	}

	if got, want := seed.Rows(t, d.db, `SELECT chain_id, parent_chain_id, diff_id, size_bytes, file_count, unpacked_ns > 0 FROM chains ORDER BY diff_id`), []string{
		"sha256:11  sha256:11 2000 10 1",
		debianTop + " sha256:11 sha256:22 4000 10 1",
		debianDevTop + " sha256:11 sha256:33 6000 10 1",
		"sha256:44  sha256:44 8000 10 1",
	}; !reflect.DeepEqual(got, want) {
		t.Errorf("chains = %q, want %q", got, want)
	}

	if got, want := seed.Rows(t, d.db, `SELECT s.snapshot_name, s.origin_device_id, t.name, s.device_path, i.s3_key, s.active
		FROM snapshots s JOIN images i ON i.image_id = s.image_id
		JOIN thin_devices t ON t.device_id = CAST(s.origin_device_id AS INTEGER) ORDER BY s.id`), []string{
		"snap-s3-947b2eb1128e60f13690c8ad 102 flyio-pool-snap-102 /dev/mapper/flyio-pool-snap-201 s3://flyio-images/images/debian/ 1",
		"snap-s3-040d2bcbceee05096e997f06 103 flyio-pool-snap-103 /dev/mapper/flyio-pool-snap-202 s3://flyio-images/images/debian-dev/ 1",
		"snap-s3-5f5237ee6ff24bfb43c15811 104 flyio-pool-snap-104 /dev/mapper/flyio-pool-snap-203 s3://flyio-images/images/single.tar 1",
	}; !reflect.DeepEqual(got, want) {
		t.Errorf("snapshots view (the 3 activations):\n got  %q\n want %q", got, want)
	}

	// What a re-pull looks up to be a no-op: each layer's chain with its
	// committed snapshot, the activation on the top chain, the names.
	for id, want := range map[string]string{
		debianID:    "[sha256:11 sha256:22] flyio-pool-snap-201 [flyio.local/e2e/debian:latest]",
		debianDevID: "[sha256:11 sha256:33] flyio-pool-snap-202 [flyio.local/e2e/debian-dev:latest]",
		singleID:    "[sha256:44] flyio-pool-snap-203 [s3://flyio-images/images/single.tar]",
	} {
		diffs := seed.Rows(t, d.db, `SELECT c.diff_id FROM image_layers il JOIN chains c ON c.chain_id = il.chain_id
			JOIN cd_snapshots s ON s.key = c.chain_id AND s.kind = 'committed' WHERE il.image_id = ? ORDER BY il.position`, id)
		dev := seed.Rows(t, d.db, `SELECT d.name FROM cd_snapshots a JOIN thin_devices d ON d.device_id = a.device_id
			JOIN cd_snapshots p ON p.id = a.parent_id
			WHERE a.key = ? AND a.kind = 'active' AND p.key = (SELECT chain_id FROM image_layers WHERE image_id = ? ORDER BY position DESC LIMIT 1)`,
			seed.ActivationKey(id), id)
		names := seed.Rows(t, d.db, `SELECT name FROM image_names WHERE image_id = ? ORDER BY registered_ns, name`, id)
		if got := fmt.Sprintf("%v %s %v", diffs, strings.Join(dev, ","), names); got != want {
			t.Errorf("pulled state of %s = %s, want %s (a re-pull is a no-op)", id, got, want)
		}
	}
}

// checkVersion7PulledImages checks that d, a database at schema version 7,
// still holds the fixture's 3 pulled images in its version-7 tables; what
// names d in failures.
func checkVersion7PulledImages(t *testing.T, d *DB, what string) {
	t.Helper()
	var n int
	if err := d.db.QueryRowContext(context.Background(), `SELECT count(*) FROM pipeline_images`).Scan(&n); err != nil || n != 3 {
		t.Errorf("%s has %d pulled images in the version-7 tables, %v; want 3", what, n, err)
	}
}

// TestUpgradeFromRelease0007 opens a database written by the previous
// release read-write: it is copied to <db>.pre-v8, migrated to the latest
// version, its ledger verifies with the current hashes, and every pulled
// image is there with its layers, objects, chains, names and activation.
func TestUpgradeFromRelease0007(t *testing.T) {
	ctx := context.Background()
	path := copyRelease0007(t)
	d, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatalf("opening the previous release's database: %v", err)
	}
	defer d.Close()
	res := d.Migrated()
	if res.From != 7 || res.To != LatestVersion() || len(res.Applied) == 0 || res.Applied[0] != 8 || res.Backup != path+".pre-v8" {
		t.Errorf("MigrateResult = %+v, want from 7 to %d with a copy at %s.pre-v8", res, LatestVersion(), path)
	}
	if err := d.VerifyLedger(ctx); err != nil {
		t.Errorf("VerifyLedger: %v", err)
	}
	checkLedgerHashes(t, d, false)
	if rep, err := d.Check(ctx); err != nil || !rep.OK() {
		t.Errorf("Check = %+v, %v", rep, err)
	}
	checkRelease0007Records(t, d)

	// The copy is the previous release's database, untouched.
	b := openReadOnlyAtVersion(t, path+".pre-v8", 7, "the pre-v8 copy")
	defer b.Close()
	checkVersion7PulledImages(t, b, "the pre-v8 copy")

	// Opening again changes nothing.
	d.Close()
	d2, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if res := d2.Migrated(); len(res.Applied) != 0 || res.Backup != "" {
		t.Errorf("second open migrated again: %+v", res)
	}
	checkRelease0007Records(t, d2)
}

// TestReadOnlyOpenOfRelease0007 opens the previous release's database
// read-only: it is accepted (its ledger records earlier hashes of reworded
// migrations) and nothing is written to it.
func TestReadOnlyOpenOfRelease0007(t *testing.T) {
	path := copyRelease0007(t)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := openReadOnlyAtVersion(t, path, 7, "the previous release's database")
	r.Close()
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("a read-only open changed the database file")
	}
	if backups, _ := filepath.Glob(path + ".pre-v*"); len(backups) != 0 {
		t.Errorf("a read-only open wrote %v", backups)
	}
}

// TestMigrationKilledInMigration8 kills (SIGKILL) a process paused inside
// migration 8's transaction on the previous release's database: the
// database stays at version 7 with its rows, and the next open migrates it
// completely.
func TestMigrationKilledInMigration8(t *testing.T) {
	ctx := context.Background()
	path := copyRelease0007(t)
	killChildPausedInMigration(t, path, 8)
	r := openReadOnlyAtVersion(t, path, 7, "the database after a kill in migration 8")
	checkVersion7PulledImages(t, r, "the database after the kill")
	r.Close()
	d, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatalf("open after the kill: %v", err)
	}
	defer d.Close()
	if res := d.Migrated(); res.From != 7 || res.To != LatestVersion() {
		t.Errorf("MigrateResult after the kill = %+v", res)
	}
	checkRelease0007Records(t, d)
}
