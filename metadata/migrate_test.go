package metadata

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

func TestEmbeddedMigrations(t *testing.T) {
	ms := Migrations()
	if len(ms) < 3 || ms[0].Name != "initial" || ms[1].Name != "image_locks" || ms[2].Name != "migration_hashes" {
		t.Fatalf("embedded migrations = %v", ms)
	}
	// 0003 back-fills the hashes of 1 and 2 with literals: each must be the
	// embedded file's hash or the hash of its text before its comments
	// were reworded.
	for _, m := range ms[:2] {
		if !strings.Contains(ms[2].SQL, m.SHA256) && !strings.Contains(ms[2].SQL, reworded[m.Version]) {
			t.Errorf("0003_migration_hashes.sql back-fills version %d with neither its hash %s nor its earlier hash %q", m.Version, m.SHA256, reworded[m.Version])
		}
	}
	if LatestVersion() != len(ms) {
		t.Errorf("LatestVersion = %d, want %d", LatestVersion(), len(ms))
	}
}

func TestLedgerRecordsHashes(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	rows, err := d.Ledger(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != LatestVersion() {
		t.Fatalf("ledger has %d rows, want %d", len(rows), LatestVersion())
	}
	checkLedgerHashes(t, d, false)
	if rep, err := d.Check(ctx); err != nil || !rep.OK() {
		t.Errorf("Check on a fresh database = %+v, %v", rep, err)
	}
	if d.Migrated().Backup != "" {
		t.Errorf("a brand-new database was backed up to %s", d.Migrated().Backup)
	}
	// The next read-write open records the current hash of every
	// migration.
	d2, err := Open(ctx, Options{Path: d.Path()})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if res := d2.Migrated(); len(res.Applied) != 0 || res.Backup != "" {
		t.Errorf("reopening a current database migrated: %+v", res)
	}
	checkLedgerHashes(t, d2, false)
}

// checkLedgerHashes checks the ledger has a row per embedded migration,
// each with an applied time and the migration's hash, or, when
// allowEarlier, the hash of its text before its comments were reworded.
func checkLedgerHashes(t *testing.T, d *DB, allowEarlier bool) {
	t.Helper()
	rows, err := d.Ledger(context.Background())
	if err != nil || len(rows) != LatestVersion() {
		t.Fatalf("ledger = %d rows, %v; want %d", len(rows), err, LatestVersion())
	}
	for i, r := range rows {
		ok := r.SHA256 == embedded()[i].SHA256 || allowEarlier && rewordedFrom(r.Version, r.SHA256)
		if r.Version != i+1 || !ok || r.AppliedAt == "" {
			t.Errorf("ledger row %d = %+v, want version %d hash %s", i, r, i+1, embedded()[i].SHA256)
		}
	}
}

// openNewAndExec creates a database in a fresh directory and runs stmt
// (with args) on it directly, to put it in a state Open never leaves. It
// returns the open database, which the caller closes, and its path.
func openNewAndExec(t *testing.T, stmt string, args ...any) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.db")
	d, err := Open(context.Background(), Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.ExecContext(context.Background(), stmt, args...); err != nil {
		t.Fatal(err)
	}
	return d, path
}

// TestLedgerRefusesTamperedHash edits a recorded hash; every open (read-write
// and read-only) is refused with an error naming the version, and Check
// reports it.
func TestLedgerRefusesTamperedHash(t *testing.T) {
	ctx := context.Background()
	d, path := openNewAndExec(t, `UPDATE schema_migrations SET sql_sha256 = 'deadbeef' WHERE version = 2`)
	rep, err := d.Check(ctx)
	if err != nil || rep.OK() || !strings.Contains(strings.Join(rep.Problems, "\n"), "migration 2 (image_locks)") {
		t.Errorf("Check after tampering = %+v, %v", rep, err)
	}
	d.Close()
	for _, ro := range []bool{false, true} {
		_, err := Open(ctx, Options{Path: path, ReadOnly: ro})
		if !errors.Is(err, ErrLedgerMismatch) || !strings.Contains(err.Error(), "migration 2 (image_locks)") || !strings.Contains(err.Error(), "deadbeef") {
			t.Errorf("Open(read-only=%v) of a tampered ledger: err = %v, want ErrLedgerMismatch naming migration 2", ro, err)
		}
	}
}

func TestLedgerRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	next := LatestVersion() + 1
	d, path := openNewAndExec(t, `INSERT INTO schema_migrations (version, description, sql_sha256) VALUES (?, 'future', 'x')`, next)
	d.Close()
	if _, err := Open(ctx, Options{Path: path}); !errors.Is(err, ErrSchemaTooNew) || !strings.Contains(err.Error(), strconv.Itoa(next)) {
		t.Errorf("read-write Open of a newer schema: err = %v, want ErrSchemaTooNew naming %d", err, next)
	} else if want := fmt.Sprintf("restore %s.pre-v%d", path, next); !strings.Contains(err.Error(), want) {
		t.Errorf("refusal of a newer schema does not name the way back (%q): %v", want, err)
	}
	r, err := Open(ctx, Options{Path: path, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open of a newer schema: %v", err)
	}
	r.Close()
}

// buildV1 makes a database with only migration 1 and one row in each of its
// tables.
func buildV1(t *testing.T, path string) {
	t.Helper()
	ctx := context.Background()
	d, err := Open(ctx, Options{Path: path, MigrateTo: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if v, _ := d.SchemaVersion(ctx); v != 1 {
		t.Fatalf("test hook built version %d, want 1", v)
	}
	for _, s := range []string{
		`INSERT INTO images (image_id, s3_key, local_path, checksum, size_bytes, download_status, downloaded_at) VALUES ('img-1', 'images/1.tar', '/d/1.tar', 'abc', 42, 'completed', CURRENT_TIMESTAMP)`,
		`INSERT INTO unpacked_images (image_id, device_id, device_name, device_path, size_bytes, file_count, layout_verified) VALUES ('img-1', '7', 'thin-7', '/dev/mapper/thin-7', 100, 3, 1)`,
		`INSERT INTO snapshots (image_id, snapshot_id, snapshot_name, device_path, origin_device_id) VALUES ('img-1', '7-snap', 'snapshot-img-1', '/dev/mapper/snapshot-img-1', '7')`,
	} {
		if _, err := d.db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE name = 'image_locks'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a version-1 database has image_locks (%d, %v)", n, err)
	}
}

// checkV1Rows checks, with plain SQL, the rows buildV1 wrote in a database
// still at the version-1 schema (a pre-migration copy).
func checkV1Rows(t *testing.T, d *DB) {
	t.Helper()
	var got string
	err := d.db.QueryRowContext(context.Background(), `SELECT i.image_id || '|' || i.size_bytes || '|' || i.checksum || '|' ||
		u.device_name || '|' || s.snapshot_name FROM images i JOIN unpacked_images u ON u.image_id = i.image_id
		JOIN snapshots s ON s.image_id = i.image_id WHERE i.s3_key = 'images/1.tar'`).Scan(&got)
	if want := "img-1|42|abc|thin-7|snapshot-img-1"; err != nil || got != want {
		t.Errorf("version-1 rows = %q, %v; want %q", got, err, want)
	}
}

// TestUpgradeFromV1 opens a version-1 database with the full binary: it is
// copied to <db>.pre-v2 first (rows included), migrated to the latest
// version with hashes back-filled, and works. Rows of the first schema
// described no image pulled by the pipelines, so migration 8 does not carry
// them over; the copy keeps them.
func TestUpgradeFromV1(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	buildV1(t, path)
	d, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	res := d.Migrated()
	if res.From != 1 || res.To != LatestVersion() || len(res.Applied) != LatestVersion()-1 || res.Backup != path+".pre-v2" {
		t.Errorf("MigrateResult = %+v", res)
	}
	if err := d.VerifyLedger(ctx); err != nil {
		t.Errorf("VerifyLedger after upgrade: %v", err)
	}
	if rep, err := d.Check(ctx); err != nil || !rep.OK() {
		t.Errorf("Check after upgrade = %+v, %v", rep, err)
	}
	checkLedgerHashes(t, d, false)
	// The record tables and their views work on the upgraded database.
	if err := seed.RecordPulledImage(ctx, d, "img-2", "s3://bkt/images/2.tar", []seed.ImageLayer{{Key: "images/2.tar", SizeBytes: 1, ChainID: "sha256:c"}}, "two"); err != nil {
		t.Errorf("record on the upgraded database: %v", err)
	}
	if v := seed.Rows(t, d.db, `SELECT i.image_id, n.name FROM images i JOIN image_names n ON n.image_id = i.image_id`); fmt.Sprint(v) != "[img-2 two]" {
		t.Errorf("the images view on the upgraded database = %q, want image img-2 named two", v)
	}
	// The copy is the version-1 database, rows included.
	b := openReadOnlyAtVersion(t, path+".pre-v2", 1, "the pre-v2 copy")
	defer b.Close()
	checkV1Rows(t, b)
	if leftovers, _ := filepath.Glob(path + ".pre-v*.tmp-*"); len(leftovers) != 0 {
		t.Errorf("temporary backup files left: %v", leftovers)
	}
}

// TestConcurrentMigration opens one new database from 6 goroutines at once
// (each its own pool, as separate processes): every open succeeds and each
// migration is applied exactly once.
func TestConcurrentMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	const n = 6
	results := make([]MigrateResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := Open(ctx, Options{Path: path})
			if err != nil {
				errs[i] = err
				return
			}
			results[i] = d.Migrated()
			errs[i] = d.Close()
		}()
	}
	wg.Wait()
	var applied []int
	for i := range results {
		if errs[i] != nil {
			t.Errorf("open %d: %v", i, errs[i])
		}
		applied = append(applied, results[i].Applied...)
	}
	sort.Ints(applied)
	if fmt.Sprint(applied) != fmt.Sprint(allVersions()) {
		t.Errorf("migrations applied across all opens = %v, want each of %v exactly once", applied, allVersions())
	}
}

// openReadOnlyAtVersion opens the database at path read-only and checks
// that its schema is at version want; what names the database in failures.
// The caller closes it.
func openReadOnlyAtVersion(t *testing.T, path string, want int, what string) *DB {
	t.Helper()
	ctx := context.Background()
	r, err := Open(ctx, Options{Path: path, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of %s: %v", what, err)
	}
	if v, err := r.SchemaVersion(ctx); err != nil || v != want {
		t.Errorf("%s is at version %d, %v; want %d", what, v, err, want)
	}
	return r
}

// allVersions lists the version of every embedded migration, in order.
func allVersions() []int {
	var v []int
	for _, m := range embedded() {
		v = append(v, m.Version)
	}
	return v
}

// TestMigrationKilled kills (SIGKILL) a process paused inside migration 3's
// transaction of a version-1 database with rows; the next open succeeds,
// copies the version-2 database (rows intact) and finishes migrating.
func TestMigrationKilled(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "m.db")
	buildV1(t, path)
	killChildPausedInMigration(t, path, 3)
	// Migration 2 committed, 3 did not.
	r := openReadOnlyAtVersion(t, path, 2, "the database after a kill in migration 3")
	r.Close()
	d, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatalf("open after the kill: %v", err)
	}
	defer d.Close()
	if res := d.Migrated(); res.From != 2 || res.To != LatestVersion() || len(res.Applied) == 0 || res.Applied[0] != 3 || res.Backup != path+".pre-v3" {
		t.Errorf("MigrateResult after the kill = %+v", res)
	}
	b := openReadOnlyAtVersion(t, path+".pre-v3", 2, "the pre-v3 copy made after the kill")
	defer b.Close()
	checkV1Rows(t, b)
	if rep, err := d.Check(ctx); err != nil || !rep.OK() {
		t.Errorf("Check after recovery = %+v, %v", rep, err)
	}
}

// TestTwoProcessesMigrate: process A pauses inside migration 2 holding the
// write lock while process B opens the same database; B waits, then both
// succeed and each migration is applied by exactly one of them.
func TestTwoProcessesMigrate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.db")
	buildV1(t, path)
	release := filepath.Join(dir, "release")
	a, aout := startChild(t, "migrate-pause", "METADATA_TEST_DB="+path, "PAUSE_AT=2", "RELEASE_FILE="+release)
	waitLine(t, aout, "PAUSED")
	b, bout := startChild(t, "migrate", "METADATA_TEST_DB="+path)
	waitLine(t, bout, "OPENING")
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	aApplied := strings.TrimPrefix(waitLine(t, aout, "APPLIED"), "APPLIED ")
	bApplied := strings.TrimPrefix(waitLine(t, bout, "APPLIED"), "APPLIED ")
	if err := a.Wait(); err != nil {
		t.Fatalf("process A: %v", err)
	}
	if err := b.Wait(); err != nil {
		t.Fatalf("process B: %v", err)
	}
	var all []int
	for _, s := range strings.Split(aApplied+","+bApplied, ",") {
		if s != "" {
			v, _ := strconv.Atoi(s)
			all = append(all, v)
		}
	}
	sort.Ints(all)
	if fmt.Sprint(all) != fmt.Sprint(allVersions()[1:]) {
		t.Errorf("A applied %q, B applied %q: want versions 2..%d once each", aApplied, bApplied, LatestVersion())
	}
	if !strings.HasPrefix(aApplied, "2") {
		t.Errorf("A (holding the lock in migration 2) applied %q", aApplied)
	}
}

// TestReaderWhileWriterWrites runs a writer process and a read-only reader
// process on one database at once: the reader never sees an error or a
// half-written step, sees the data change, and ends with the writer's count.
func TestReaderWhileWriterWrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.db")
	d, err := Open(context.Background(), Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	env := []string{"METADATA_TEST_DB=" + path, "READER_SAW=" + filepath.Join(dir, "saw"),
		"WRITER_DONE=" + filepath.Join(dir, "done"), "MIN_WRITES=200"}
	reader, rout := startChild(t, "reader", env...)
	writer, wout := startChild(t, "writer", env...)
	wrote := waitLine(t, wout, "WROTE")
	readLine := waitLine(t, rout, "DISTINCT")
	if err := writer.Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	if err := reader.Wait(); err != nil {
		t.Fatalf("reader failed while the writer wrote: %v", err)
	}
	var distinct, final, n int
	fmt.Sscanf(readLine, "DISTINCT %d FINAL %d", &distinct, &final)
	fmt.Sscanf(wrote, "WROTE %d", &n)
	if distinct < 3 {
		t.Errorf("reader saw %d distinct image counts, want >= 3 (did it read while the writer wrote?)", distinct)
	}
	if final != n {
		t.Errorf("reader's final count %d, writer wrote %d", final, n)
	}
}

// TestBackupWhileWriting copies the database while another pool writes; the
// copy is a consistent database that passes Check.
func TestBackupWhileWriting(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w := openTestDB(t)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 400; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := seed.WriteImage(ctx, w, i); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	r, err := Open(ctx, Options{Path: w.Path(), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := 0; i < 5; i++ {
		dest := filepath.Join(dir, fmt.Sprintf("copy-%d.db", i))
		if err := r.Backup(ctx, dest); err != nil {
			t.Fatalf("backup %d: %v", i, err)
		}
		c, err := Open(ctx, Options{Path: dest, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := c.Check(ctx)
		if err != nil || !rep.OK() {
			t.Errorf("copy %d: %+v, %v", i, rep, err)
		}
		var imgs, chains int
		if err := c.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM images),
			(SELECT count(*) FROM chains c JOIN cd_snapshots s ON s.key = c.chain_id AND s.kind = 'committed')`).Scan(&imgs, &chains); err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		// A chain is committed before the image using it is recorded, in
		// separate transactions: a consistent copy has a device for every
		// image, and at most one chain no image uses yet.
		if chains < imgs || chains > imgs+1 {
			t.Errorf("copy %d: %d images, %d chains", i, imgs, chains)
		}
		if bad := seed.Rows(t, c.db, halfWrittenImages); len(bad) != 0 {
			t.Errorf("copy %d: images neither unpacked nor active, or without their device, layer or name: %q", i, bad)
		}
		c.Close()
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("writer: %v", err)
	}
}

// TestCheckFindsForeignKeyViolation writes an orphan row with foreign keys
// off (as a buggy tool would); Check reports it.
func TestCheckFindsForeignKeyViolation(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	c, err := d.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, `PRAGMA foreign_keys = OFF`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, `INSERT INTO image_names (name, image_id, registered_ns) VALUES ('ghost:latest', 'ghost', 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, `PRAGMA foreign_keys = ON`); err != nil {
		t.Fatal(err)
	}
	c.Close()
	rep, err := d.Check(ctx)
	if err != nil || rep.OK() || !strings.Contains(strings.Join(rep.Problems, "\n"), "image_names rowid 1 references a missing row of s3_images") {
		t.Errorf("Check = %+v, %v; want the orphan image_names row reported", rep, err)
	}
}

// TestMigrationQuotesETags: ETags a version-12 database recorded unquoted
// (a server that lists them so) are quoted by migration 13, as the S3
// reader gives them now, so an unchanged object still matches its record;
// quoted, weak and empty ones stay as they are.
func TestMigrationQuotesETags(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "meta.db")
	d, err := Open(ctx, Options{Path: path, MigrateTo: 12})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		`INSERT INTO s3_objects (bucket, key, etag, size_bytes, digest, downloaded_ns) VALUES
			('b', 'plain', 'abc', 1, 'sha256:1', 1), ('b', 'quoted', '"def"', 1, 'sha256:2', 1),
			('b', 'weak', 'W/"ghi"', 1, 'sha256:3', 1), ('b', 'none', '', 1, 'sha256:4', 1)`,
		`INSERT INTO s3_images (image_id, source, created_ns) VALUES ('img', 's3://b/', 1)`,
		`INSERT INTO image_layers (image_id, position, key, etag, size_bytes, chain_id) VALUES
			('img', 1, 'plain', 'abc', 1, 'c1'), ('img', 2, 'quoted', '"def"', 1, 'c2')`,
	} {
		if _, err := d.db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	d.Close()
	d, err = Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var objects, layers string
	if err := d.db.QueryRowContext(ctx, `SELECT group_concat(key || '=' || etag, ' ') FROM (SELECT key, etag FROM s3_objects ORDER BY key)`).Scan(&objects); err != nil {
		t.Fatal(err)
	}
	if err := d.db.QueryRowContext(ctx, `SELECT group_concat(key || '=' || etag, ' ') FROM (SELECT key, etag FROM image_layers ORDER BY position)`).Scan(&layers); err != nil {
		t.Fatal(err)
	}
	if want := `none= plain="abc" quoted="def" weak=W/"ghi"`; objects != want {
		t.Errorf("s3_objects after migration 13: %s; want %s", objects, want)
	}
	if want := `plain="abc" quoted="def"`; layers != want {
		t.Errorf("image_layers after migration 13: %s; want %s", layers, want)
	}
}
