package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/inventory"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
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
	rawSQL(t, path, `INSERT INTO image_names (name, image_id, registered_ns) VALUES ('ghost:1', 'ghost', 1)`)
	code, out, errOut = runCommand(t, nil, "db", "check", "--db", path)
	if code != 1 || !strings.Contains(out, "foreign_key_check: image_names rowid 1 references a missing row of s3_images") || !strings.Contains(errOut, "1 problem(s) found") {
		t.Errorf("db check (orphan row) = %d, %q, %q", code, out, errOut)
	}
	rawSQL(t, path, `DELETE FROM image_names`)

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
	// A database at the schema before migration 8 reshaped the records,
	// holding a pulled image, as an operator's host would have before an
	// upgrade of the binary.
	prev := "7"
	if code, out, errOut := runCommand(t, nil, "db", "migrate", "--to", prev, "--db", path); code != 0 || !strings.Contains(out, "migrated from version 0 to "+prev) {
		t.Fatalf("db migrate --to %s = %d, %q, %q", prev, code, out, errOut)
	}
	diff := "sha256:" + strings.Repeat("d", 64)
	chain := "sha256:" + strings.Repeat("c", 64)
	rawSQL(t, path,
		`INSERT INTO pipeline_blobs (digest, path, size_bytes, stat_size, stat_mtime_ns, stat_ino, created_ns)
			VALUES ('`+diff+`', '/dl/blobs/sha256/`+strings.Repeat("d", 64)+`', 1024, 1024, 1, 1, 1700000000000000000)`,
		`INSERT INTO pipeline_images (ref, source, image_id, layers, top_chain_id, snapshot_key, updated_ns)
			VALUES ('registry.example/app:1', 's3://bkt/app.tar', 'img-app',
				'[{"key":"app.tar","size":1024,"etag":"\"e1\"","diff_id":"`+diff+`","chain_id":"`+chain+`"}]',
				'`+chain+`', 'snap-img-app', 1700000000000000000)`)
	latest := strconv.Itoa(metadata.LatestVersion())
	code, out, errOut := runCommand(t, nil, "db", "migrate", "--db", path)
	copyPath := path + ".pre-v8" // named after the first migration applied
	if code != 0 || !strings.Contains(out, "migrated from version "+prev+" to "+latest) || !strings.Contains(out, copyPath) {
		t.Fatalf("db migrate (%s -> %s) = %d, %q, %q", prev, latest, code, out, errOut)
	}
	// The pulled image is carried over with its name and layer.
	imgs := lsJSON[inventory.Image](t, "images", "--db", path, "--format", "json")
	if len(imgs) != 1 || imgs[0].ImageID != "img-app" || imgs[0].S3Key != "s3://bkt/app.tar" || imgs[0].Layers != 1 ||
		imgs[0].SizeBytes != 1024 || !reflect.DeepEqual(imgs[0].Names, []string{"registry.example/app:1"}) {
		t.Errorf("ls images after the upgrade = %+v", imgs)
	}
	// The copy keeps the previous schema's rows as they were.
	if n := countRows(t, copyPath, `SELECT count(*) FROM pipeline_images WHERE image_id = 'img-app'`); n != 1 {
		t.Errorf("the pre-v8 copy holds %d pipeline_images rows of img-app, want 1", n)
	}
	if code, out, _ := runCommand(t, nil, "db", "check", "--db", path); code != 0 {
		t.Errorf("db check after the upgrade = %d, %q", code, out)
	}
	if code, _, errOut := runCommand(t, nil, "db", "migrate", "--to", "999", "--db", path); code != 2 || !strings.Contains(errOut, "--to 999") {
		t.Errorf("db migrate --to 999 = %d, %q", code, errOut)
	}
}

// countRows runs the count query q on path through the plain driver.
func countRows(t *testing.T, path, q string) int {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("%s on %s: %v", q, path, err)
	}
	return n
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
	var imgs []inventory.Image
	if code != 0 || json.Unmarshal([]byte(out), &imgs) != nil || len(imgs) != 3 {
		t.Errorf("ls images of the copy = %d, %q", code, out)
	}
	if code, _, _ = runCommand(t, nil, "db", "backup", "--db", path); code != 2 {
		t.Errorf("db backup without DEST = %d, want 2", code)
	}
}

// TestDBUnlockStaleIsGone: image locks are the live runs, released when a
// run ends, so there is nothing to unlock by age; the subcommand is refused
// as unknown and changes nothing.
func TestDBUnlockStaleIsGone(t *testing.T) {
	path := populatedDB(t)
	for _, args := range [][]string{{"db", "unlock-stale", "--db", path}, {"db", "unlock-stale", "--db", path, "--older-than", "1m"}, {"db", "unlock-stale", "--help"}} {
		code, out, errOut := runCommand(t, nil, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, `unknown db subcommand "unlock-stale" (want migrate, check or backup)`) {
			t.Errorf("%v = %d, %q, %q; want 2 and an unknown-subcommand error", args, code, out, errOut)
		}
	}
	if locks := lsJSON[inventory.Lock](t, "locks", "--db", path, "--format", "json"); len(locks) != 2 {
		t.Errorf("after the refused unlock-stale, ls locks = %+v; want the 2 running runs", locks)
	}
	// A config still setting the age it took is refused, naming the key.
	cfg := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(cfg, []byte("[pipeline]\nstale_lock_age = \"1m\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"ls", "locks"}, {"db", "check"}} {
		code, out, errOut := runCommand(t, nil, append(args, "--config", cfg, "--db", path)...)
		if code != 1 || out != "" || !strings.Contains(errOut, cfg+`:2:1: unknown key "pipeline.stale_lock_age"`) {
			t.Errorf("%v with stale_lock_age in the config = %d, %q, %q; want 1 naming the key", args, code, out, errOut)
		}
	}
	code, out, _ := runCommand(t, nil, "db", "--help")
	if code != 0 || strings.Contains(out, "unlock-stale") || !strings.Contains(out, "backup DEST") {
		t.Errorf("db --help = %d, %q; want the subcommands without unlock-stale", code, out)
	}
}

func TestDBHelpAndUsage(t *testing.T) {
	for _, args := range [][]string{
		{"db", "--help"}, {"db", "migrate", "--help"}, {"db", "check", "--help"},
		{"db", "backup", "--help"}, {"ls", "--help"},
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

// Fixture digests: layer contents (diff IDs) and the chains they make.
var (
	diffA   = "sha256:" + strings.Repeat("a", 64)
	diffB   = "sha256:" + strings.Repeat("b", 64)
	diffC   = "sha256:" + strings.Repeat("c", 64)
	chainA  = "sha256:" + strings.Repeat("1", 64) // diffA at the bottom
	chainAB = "sha256:" + strings.Repeat("2", 64) // diffB on chainA
	chainC  = "sha256:" + strings.Repeat("3", 64) // diffC at the bottom; no image uses it
	chainX  = "sha256:" + strings.Repeat("4", 64) // recorded, but its snapshot is gone
)

// Fixture thin ids.
const (
	devChainA     = 10
	devChainAB    = 11
	devChainC     = 12
	devActivation = 20
)

// devName is the dm name the fixture gives thin id id.
func devName(id uint32) string { return fmt.Sprintf("flyio-pool-snap-%d", id) }

// populate writes, through package metadata, what the pipelines and the
// snapshotter leave after these pulls:
//   - img-active: s3://bkt/images/active/ (layers A and B, chains chainA and
//     chainAB), activated, named registry.example/active:1 and its source;
//   - img-unpacked: s3://bkt/images/unpacked.tar (layer A under another key,
//     so chain chainA is shared), not activated, named
//     registry.example/unpacked:1;
//   - img-failed: s3://bkt/images/failed.tar, whose only pull failed;
//
// chain chainC unpacked but used by no image, chain chainX recorded without
// its snapshot; and four runs: two running (the locks: an unpack on chainC
// started 2h before now, an activation of img-unpacked started 10m before
// now), one pending, one complete.
func populate(t *testing.T, path string, now time.Time) {
	t.Helper()
	ctx := context.Background()
	d, err := metadata.Open(ctx, metadata.Options{Path: path})
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
	for _, o := range []struct {
		key, diff string
		size      int64
	}{{"images/active/1.tar", diffA, 1000}, {"images/active/2.tar", diffB, 2000}, {"images/unpacked.tar", diffA, 1000}, {"images/orphan.tar", diffC, 3000}} {
		must(pipeline.RecordsOf(d).StoreDownload(ctx, pipeline.Object{Bucket: "bkt", Key: o.key, ETag: `"` + o.key + `"`, SizeBytes: o.size, Digest: o.diff},
			pipeline.LayerFile{Digest: o.diff, Path: "/dl/blobs/sha256/" + strings.TrimPrefix(o.diff, "sha256:"), SizeBytes: o.size}))
	}
	must(commitChain(ctx, d, pipeline.Chain{ChainID: chainA, DiffID: diffA, SizeBytes: 4000, FileCount: 40}, devChainA))
	must(commitChain(ctx, d, pipeline.Chain{ChainID: chainAB, ParentChainID: chainA, DiffID: diffB, SizeBytes: 8000, FileCount: 80}, devChainAB))
	must(commitChain(ctx, d, pipeline.Chain{ChainID: chainC, DiffID: diffC, SizeBytes: 500, FileCount: 5}, devChainC))
	must(pipeline.RecordsOf(d).StoreChain(ctx, pipeline.Chain{ChainID: chainX, DiffID: diffC}))

	must(pipeline.RecordsOf(d).RecordPulledImage(ctx, "img-active", "s3://bkt/images/active/", []pipeline.ImageLayer{
		{Key: "images/active/1.tar", ETag: `"images/active/1.tar"`, SizeBytes: 1000, ChainID: chainA},
		{Key: "images/active/2.tar", ETag: `"images/active/2.tar"`, SizeBytes: 2000, ChainID: chainAB},
	}, "registry.example/active:1"))
	must(pipeline.RecordsOf(d).AddImageName(ctx, "s3://bkt/images/active/", "img-active", false))
	must(activate(ctx, d, "img-active", chainAB, devActivation))
	must(pipeline.RecordsOf(d).RecordPulledImage(ctx, "img-unpacked", "s3://bkt/images/unpacked.tar", []pipeline.ImageLayer{
		{Key: "images/unpacked.tar", ETag: `"images/unpacked.tar"`, SizeBytes: 1000, ChainID: chainA},
	}, "registry.example/unpacked:1"))
	must(pipeline.RecordsOf(d).MarkImageFailed(ctx, "img-failed", "s3://bkt/images/failed.tar", `validate s3://bkt/images/failed.tar: entry "../x": climbs above the root`))

	for _, r := range []struct {
		id, fsm, idem string
		state         fsm.State
		age           time.Duration
	}{
		{"run-old", "unpack-image", chainC, fsm.StateRunning, 2 * time.Hour},
		{"run-new", "activate-image", "img-unpacked", fsm.StateRunning, 10 * time.Minute},
		{"run-queued", "download-image", diffC, fsm.StatePending, time.Minute},
		{"run-done", "activate-image", "img-active", fsm.StatePending, 3 * time.Hour},
	} {
		at := now.Add(-r.age)
		_, created, err := fsm.NewSQLiteStore(d).CreateRun(ctx, fsm.RunRecord{ID: r.id, FSM: r.fsm, IdempotencyID: r.idem, Request: []byte(`{}`),
			Transition: "start", State: fsm.StatePending, CreatedAt: at, UpdatedAt: at})
		must(err)
		if !created {
			t.Fatalf("run %s not created", r.id)
		}
		if r.state == fsm.StateRunning {
			must(fsm.NewSQLiteStore(d).Checkpoint(ctx, fsm.Checkpoint{RunID: r.id, State: fsm.StateRunning, Transition: "start", At: at}))
		}
	}
	must(fsm.NewSQLiteStore(d).Checkpoint(ctx, fsm.Checkpoint{RunID: "run-done", State: fsm.StateComplete, Transition: "register", At: now.Add(-3 * time.Hour)}))
}

// populatedDB creates a database in a fresh directory, populated as
// populate describes at the present time, and returns its path.
func populatedDB(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.db")
	populate(t, path, time.Now())
	return path
}

// commitChain writes what an unpack leaves for chain c: thin device devID
// and the committed snapshot keyed by the chain ID on its parent chain's
// snapshot (one transaction), then the chain's row.
func commitChain(ctx context.Context, d *metadata.DB, c pipeline.Chain, devID uint32) error {
	if err := d.WithTx(ctx, func(tx *sql.Tx) error {
		q := snapshotter.RecordsTx(tx)
		var parent int64
		if c.ParentChainID != "" {
			p, ok, err := q.Snapshot(ctx, c.ParentChainID)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("parent chain %s has no snapshot", c.ParentChainID)
			}
			parent = p.ID
		}
		if err := q.InsertThinDevice(ctx, snapshotter.ThinDevice{ID: devID, Name: devName(devID), OriginID: 0, Role: snapshotter.ThinRoleSnapshot,
			State: snapshotter.ThinStateInactive, SizeBytes: 1 << 30, FSType: "ext4", CreatedNs: 1, UpdatedNs: 1}); err != nil {
			return err
		}
		_, err := q.InsertSnapshot(ctx, snapshotter.CDSnapshot{Key: c.ChainID, Kind: snapshotter.SnapKindCommitted,
			ParentID: parent, DeviceID: devID, CreatedNs: 1, UpdatedNs: 1})
		return err
	}); err != nil {
		return fmt.Errorf("commit chain %s: %w", c.ChainID, err)
	}
	return pipeline.RecordsOf(d).StoreChain(ctx, c)
}

// activate writes image imageID's activation: the active snapshot keyed
// pipeline.ActivationKey(imageID) on the committed snapshot of chain
// parent, on thin device devID.
func activate(ctx context.Context, d *metadata.DB, imageID, parent string, devID uint32) error {
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		q := snapshotter.RecordsTx(tx)
		p, ok, err := q.Snapshot(ctx, parent)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("activate %s: chain %s has no snapshot", imageID, parent)
		}
		if err := q.InsertThinDevice(ctx, snapshotter.ThinDevice{ID: devID, Name: devName(devID), OriginID: p.DeviceID, Role: snapshotter.ThinRoleSnapshot,
			State: snapshotter.ThinStateActive, SizeBytes: 1 << 30, FSType: "ext4", CreatedNs: 1, UpdatedNs: 1}); err != nil {
			return err
		}
		now := time.Now().UnixNano()
		_, err = q.InsertSnapshot(ctx, snapshotter.CDSnapshot{Key: pipeline.ActivationKey(imageID), Kind: snapshotter.SnapKindActive,
			ParentID: p.ID, DeviceID: devID, CreatedNs: now, UpdatedNs: now})
		return err
	})
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

// holdDaemonLock takes the lock file at path as a running daemon holds
// it (an exclusive flock, its pid inside) until the test ends.
func holdDaemonLock(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(strconv.Itoa(os.Getpid()) + "\n"); err != nil {
		t.Fatal(err)
	}
}

// TestDBMigrateRefusesARunningDaemonsDatabase: db migrate runs with the
// daemon stopped; while a daemon holds the database (the lock of the root
// the database lies in, or the database's own lock beside it when it lies
// outside its root) the migration is refused, naming the holder, and the
// schema stays where the running daemon expects it.
func TestDBMigrateRefusesARunningDaemonsDatabase(t *testing.T) {
	for _, c := range []struct{ name, lock string }{
		{"in its root", plugin.LockFileName},
		{"outside its root", "m.db.lock"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "m.db")
			if code, out, errOut := runCommand(t, nil, "db", "migrate", "--to", "7", "--db", path); code != 0 {
				t.Fatalf("db migrate --to 7 = %d, %q, %q", code, out, errOut)
			}
			holdDaemonLock(t, filepath.Join(dir, c.lock))
			code, out, errOut := runCommand(t, nil, "db", "migrate", "--db", path)
			want := "held by pid " + strconv.Itoa(os.Getpid())
			if code != 1 || out != "" || !strings.Contains(errOut, want) || !strings.Contains(errOut, "stop the daemon") {
				t.Errorf("db migrate under a running daemon = %d, %q, %q; want 1 naming %q and to stop the daemon", code, out, errOut, want)
			}
			d, err := metadata.Open(context.Background(), metadata.Options{Path: path, ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if v, err := d.SchemaVersion(context.Background()); err != nil || v != 7 {
				t.Errorf("schema version after the refused migration = %d, %v; want 7", v, err)
			}
		})
	}
}

// TestDBBackupForceOntoADirectory: --force replaces a file, not a
// directory; the refusal says what DEST is instead of advising the
// --force already given, and leaves the directory and no temporary file.
func TestDBBackupForceOntoADirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.db")
	populate(t, path, time.Now())
	dest := filepath.Join(dir, "backups")
	if err := os.MkdirAll(filepath.Join(dest, "kept"), 0o700); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCommand(t, nil, "db", "backup", "--db", path, "--force", dest)
	if code != 1 || out != "" || strings.Contains(errOut, "use --force") || !strings.Contains(errOut, "is a directory") {
		t.Errorf("db backup --force onto a directory = %d, %q, %q; want 1 saying DEST is a directory", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(dest, "kept")); err != nil {
		t.Errorf("the directory's content: %v", err)
	}
	if left, _ := filepath.Glob(dest + ".*"); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}
