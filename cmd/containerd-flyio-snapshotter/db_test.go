package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// rawSQL runs statements on path through the plain go-sqlite3 driver (as a
// careless tool would, foreign keys off), bypassing package metadata.
func rawSQL(t *testing.T, path string, stmts ...string) {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func TestDBMigrateAndCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "m.db")
	code, out, errOut := runCommand(t, nil, "db", "migrate", "--create", "--db", path)
	if code != 0 || !strings.Contains(out, "migrated from version 0 to "+strconv.Itoa(metadata.LatestVersion())) {
		t.Fatalf("db migrate (new) = %d, %q, %q", code, out, errOut)
	}
	code, out, _ = runCommand(t, nil, "db", "migrate", "--db", path)
	if code != 0 || !strings.Contains(out, "nothing to do") {
		t.Errorf("db migrate (again) = %d, %q", code, out)
	}
	code, out, errOut = runCommand(t, nil, "db", "check", "--db", path)
	if code != 0 || !strings.HasPrefix(out, "ok: ") {
		t.Errorf("db check (healthy) = %d, %q, %q", code, out, errOut)
	}

	// An orphan row: foreign_key_check finds it.
	rawSQL(t, path, `INSERT INTO unpacked_images (image_id, device_id, device_name, device_path, size_bytes, file_count) VALUES ('ghost', '1', 'thin-1', '/x', 0, 0)`)
	code, out, errOut = runCommand(t, nil, "db", "check", "--db", path)
	if code != 1 || !strings.Contains(out, "foreign_key_check: unpacked_images rowid 1") || !strings.Contains(errOut, "1 problem(s) found") {
		t.Errorf("db check (orphan row) = %d, %q, %q", code, out, errOut)
	}
	rawSQL(t, path, `DELETE FROM unpacked_images`)

	// A tampered ledger: check names the version; ls refuses to read.
	rawSQL(t, path, `UPDATE schema_migrations SET sql_sha256 = 'x' WHERE version = 1`)
	code, out, _ = runCommand(t, nil, "db", "check", "--db", path)
	if code != 1 || !strings.Contains(out, "migration 1 (initial)") {
		t.Errorf("db check (tampered) = %d, %q", code, out)
	}
	code, _, errOut = runCommand(t, nil, "ls", "images", "--db", path)
	if code != 1 || !strings.Contains(errOut, "migration 1 (initial)") {
		t.Errorf("ls on a tampered ledger = %d, %q", code, errOut)
	}
	code, _, errOut = runCommand(t, nil, "db", "migrate", "--db", path)
	if code != 1 || !strings.Contains(errOut, "migration 1 (initial)") {
		t.Errorf("db migrate on a tampered ledger = %d, %q", code, errOut)
	}
}

func TestDBMigrateWritesCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	// A database at an older schema, holding a row, as an operator's host
	// would have after an upgrade of the binary.
	if code, out, errOut := runCommand(t, nil, "db", "migrate", "--to", "5", "--db", path); code != 0 || !strings.Contains(out, "migrated from version 0 to 5") {
		t.Fatalf("db migrate --to 5 = %d, %q, %q", code, out, errOut)
	}
	rawSQL(t, path, `INSERT INTO images (image_id, s3_key, local_path, size_bytes) VALUES ('img', 'k.tar', '/p', 1)`)
	latest := strconv.Itoa(metadata.LatestVersion())
	code, out, errOut := runCommand(t, nil, "db", "migrate", "--db", path)
	if code != 0 || !strings.Contains(out, "migrated from version 5 to "+latest) || !strings.Contains(out, path+".pre-v6") {
		t.Fatalf("db migrate (5 -> %s) = %d, %q, %q", latest, code, out, errOut)
	}
	code, out, _ = runCommand(t, nil, "ls", "images", "--db", path+".pre-v6", "--format", "json")
	var imgs []metadata.ImageView
	if code != 0 || json.Unmarshal([]byte(out), &imgs) != nil || len(imgs) != 1 || imgs[0].ImageID != "img" {
		t.Errorf("ls images of the pre-v6 copy = %d, %q", code, out)
	}
	if code, _, errOut := runCommand(t, nil, "db", "migrate", "--to", "999", "--db", path); code != 2 || !strings.Contains(errOut, "--to 999") {
		t.Errorf("db migrate --to 999 = %d, %q", code, errOut)
	}
}

func TestDBBackup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.db")
	populate(t, path, time.Now())
	dest := filepath.Join(dir, "copy.db")
	code, out, errOut := runCommand(t, nil, "db", "backup", "--db", path, dest)
	if code != 0 || !strings.Contains(out, "backed up "+path+" to "+dest) {
		t.Fatalf("db backup = %d, %q, %q", code, out, errOut)
	}
	code, _, errOut = runCommand(t, nil, "db", "backup", "--db", path, dest)
	if code != 1 || !strings.Contains(errOut, "exists (use --force") {
		t.Errorf("db backup over an existing file = %d, %q", code, errOut)
	}
	if code, _, errOut = runCommand(t, nil, "db", "backup", "--db", path, "--force", dest); code != 0 {
		t.Errorf("db backup --force = %d, %q", code, errOut)
	}
	if code, out, _ = runCommand(t, nil, "db", "check", "--db", dest); code != 0 {
		t.Errorf("db check of the copy = %d, %q", code, out)
	}
	code, out, _ = runCommand(t, nil, "ls", "images", "--db", dest, "--format", "json")
	var imgs []metadata.ImageView
	if code != 0 || json.Unmarshal([]byte(out), &imgs) != nil || len(imgs) != 5 {
		t.Errorf("ls images of the copy = %d, %q", code, out)
	}
	if code, _, _ = runCommand(t, nil, "db", "backup", "--db", path); code != 2 {
		t.Errorf("db backup without DEST = %d, want 2", code)
	}
}

func TestDBUnlockStale(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	populate(t, path, time.Now())
	// populate leaves locks aged 2h (img-stale) and 10m (img-fresh).
	code, out, errOut := runCommand(t, nil, "db", "unlock-stale", "--db", path, "--dry-run")
	if code != 0 || !strings.Contains(out, "img-stale") || strings.Contains(out, "img-fresh") || !strings.Contains(out, "would remove 1 image lock(s) older than 1h0m0s") {
		t.Fatalf("unlock-stale --dry-run = %d, %q, %q", code, out, errOut)
	}
	code, out, _ = runCommand(t, nil, "ls", "locks", "--db", path, "--format", "json")
	var locks []metadata.LockView
	if code != 0 || json.Unmarshal([]byte(out), &locks) != nil || len(locks) != 2 {
		t.Fatalf("dry run removed locks: %d, %q", code, out)
	}
	code, out, _ = runCommand(t, nil, "db", "unlock-stale", "--db", path)
	if code != 0 || !strings.Contains(out, "removed 1 image lock(s)") || !strings.Contains(out, "unpack-fsm:crashed") {
		t.Errorf("unlock-stale = %d, %q", code, out)
	}
	code, out, _ = runCommand(t, nil, "db", "unlock-stale", "--db", path, "--older-than", "5m")
	if code != 0 || !strings.Contains(out, "img-fresh") || !strings.Contains(out, "removed 1 image lock(s) older than 5m0s") {
		t.Errorf("unlock-stale --older-than 5m = %d, %q", code, out)
	}
	code, out, _ = runCommand(t, nil, "db", "unlock-stale", "--db", path)
	if code != 0 || !strings.Contains(out, "no image lock older than") {
		t.Errorf("unlock-stale with nothing stale = %d, %q", code, out)
	}
	if code, _, _ = runCommand(t, nil, "db", "unlock-stale", "--db", path, "--older-than", "-1m"); code != 2 {
		t.Errorf("negative --older-than = %d, want 2", code)
	}
	// The config's pipeline.stale_lock_age is the default age.
	cfg := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(cfg, []byte("[pipeline]\nstale_lock_age = \"1m\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCommand(t, nil, "db", "unlock-stale", "--config", cfg, "--db", path)
	if code != 0 || !strings.Contains(out, "older than 1m0s") {
		t.Errorf("unlock-stale with config stale_lock_age = %d, %q, %q", code, out, errOut)
	}
}

func TestDBHelpAndUsage(t *testing.T) {
	for _, args := range [][]string{
		{"db", "--help"}, {"db", "migrate", "--help"}, {"db", "check", "--help"},
		{"db", "backup", "--help"}, {"db", "unlock-stale", "--help"}, {"ls", "--help"},
	} {
		code, out, _ := runCommand(t, nil, args...)
		if code != 0 || !strings.HasPrefix(out, "Usage: containerd-flyio-snapshotter "+args[0]) {
			t.Errorf("%v = %d, %q", args, code, out)
		}
		if args[len(args)-2] != "db" || args[0] == "ls" {
			if !strings.Contains(out, "-config") || !strings.Contains(out, "-db") {
				t.Errorf("%v does not document --config and --db: %q", args, out)
			}
		}
	}
	if code, _, errOut := runCommand(t, nil, "db", "vacuum"); code != 2 || !strings.Contains(errOut, `unknown db subcommand "vacuum"`) {
		t.Errorf("db vacuum = %d, %q", code, errOut)
	}
	if code, _, _ := runCommand(t, nil, "db"); code != 2 {
		t.Errorf("db without subcommand = %d, want 2", code)
	}
	missing := filepath.Join(t.TempDir(), "none.db")
	if code, _, errOut := runCommand(t, nil, "db", "check", "--db", missing); code != 1 || !strings.Contains(errOut, "no database file") {
		t.Errorf("db check of a missing file = %d, %q", code, errOut)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("db check created %s", missing)
	}
}

// populate writes, through package metadata, one image in each derived
// state and two locks (2h and 10m old at now).
func populate(t *testing.T, path string, now time.Time) {
	t.Helper()
	ctx := context.Background()
	at := now
	d, err := metadata.Open(ctx, metadata.Options{Path: path, Clock: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(d.MarkImageFailed(ctx, metadata.ImageFailure{ImageID: "img-failed", S3Key: "images/failed.tar", Reason: `entry "../x": climbs above the root`}))
	must(d.StoreImageMetadata(ctx, "img-downloaded", "images/downloaded.tar", "/d/1.tar", "s1", 100))
	must(d.StoreImageMetadata(ctx, "img-unpacked", "images/unpacked.tar", "/d/2.tar", "s2", 200))
	must(d.StoreUnpackedImage(ctx, metadata.UnpackedImageRecord{ImageID: "img-unpacked", DeviceID: "2", DeviceName: "thin-2", DevicePath: "/dev/mapper/thin-2", SizeBytes: 2000, FileCount: 20}))
	must(d.StoreImageMetadata(ctx, "img-active", "images/active.tar", "/d/3.tar", "s3", 300))
	must(d.StoreUnpackedImage(ctx, metadata.UnpackedImageRecord{ImageID: "img-active", DeviceID: "3", DeviceName: "thin-3", DevicePath: "/dev/mapper/thin-3", SizeBytes: 3000, FileCount: 30}))
	must(d.RegisterActivation(ctx, metadata.SnapshotRecord{ImageID: "img-active", SnapshotID: "3-snap", SnapshotName: "snapshot-img-active", DevicePath: "/dev/mapper/snapshot-img-active", OriginDeviceID: "3"}))
	must(d.RegisterActivation(ctx, metadata.SnapshotRecord{ImageID: "img-active", SnapshotID: "3-snap-b", SnapshotName: "snapshot-img-active-b", DevicePath: "/dev/mapper/snapshot-img-active-b", OriginDeviceID: "3"}))
	must(d.DeactivateSnapshot(ctx, "3-snap-b"))
	must(d.StoreImageMetadata(ctx, "img-pending", "images/pending.tar", "/d/4.tar", "", 0))
	rawSQL(t, path, `UPDATE images SET download_status = 'downloading' WHERE image_id = 'img-pending'`)
	at = now.Add(-2 * time.Hour)
	must(d.AcquireImageLock(ctx, "img-stale", "unpack-fsm:crashed"))
	at = now.Add(-10 * time.Minute)
	must(d.AcquireImageLock(ctx, "img-fresh", "unpack-fsm:running"))
}

// TestDBMigrateCreate checks that db migrate makes no directory unless
// --create says so: a mistyped path is an error that leaves nothing behind.
func TestDBMigrateCreate(t *testing.T) {
	top := filepath.Join(t.TempDir(), "no")
	path := filepath.Join(top, "such", "dir", "x.db")
	code, out, errOut := runCommand(t, nil, "db", "migrate", "--db", path)
	if code != 1 || out != "" || !strings.Contains(errOut, "directory "+filepath.Dir(path)+" does not exist (pass --create to make it)") {
		t.Errorf("db migrate into a missing directory = %d, %q, %q", code, out, errOut)
	}
	if _, err := os.Stat(top); !os.IsNotExist(err) {
		t.Errorf("db migrate without --create made %s: %v", top, err)
	}
	code, out, errOut = runCommand(t, nil, "db", "migrate", "--create", "--db", path)
	if code != 0 || !strings.Contains(out, path+": migrated from version 0") {
		t.Errorf("db migrate --create = %d, %q, %q", code, out, errOut)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("--create made %s: %v, %v; want a 0700 directory", filepath.Dir(path), fi, err)
	}
}
