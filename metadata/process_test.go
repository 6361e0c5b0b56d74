package metadata

// Child processes for the multi-process tests: the test binary re-executes
// itself with METADATA_TEST_CHILD naming a role; TestMain runs that role
// instead of the tests.

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

const childEnv = "METADATA_TEST_CHILD"

func TestMain(m *testing.M) {
	// Migration notices are info logs; keep test and benchmark output clean.
	_ = log.SetLevel("warn")
	if role := os.Getenv(childEnv); role != "" {
		if err := runChild(role); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	removeBenchDB()
	os.Exit(code)
}

func runChild(role string) error {
	ctx := context.Background()
	path := os.Getenv("METADATA_TEST_DB")
	switch role {
	case "migrate-pause":
		// Pause inside migration PAUSE_AT's transaction (after its SQL ran,
		// before its ledger row) until killed, or until RELEASE_FILE exists.
		at, _ := strconv.Atoi(os.Getenv("PAUSE_AT"))
		release := os.Getenv("RELEASE_FILE")
		migrationHook = func(v int) {
			if v != at {
				return
			}
			fmt.Println("PAUSED")
			for release == "" || !exists(release) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		return migrateAndPrintApplied(ctx, path)
	case "backup-pause", "migrate-backup-pause":
		// Pause in a backup (to BACKUP_DEST, or the copy before migrating)
		// once its temporary file is written, until killed or until
		// RELEASE_FILE exists.
		release := os.Getenv("RELEASE_FILE")
		backupHook = func(tmp string) {
			fmt.Printf("PAUSED %s\n", tmp)
			for release == "" || !exists(release) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if role == "migrate-backup-pause" {
			return migrateAndPrintApplied(ctx, path)
		}
		d, err := Open(ctx, Options{Path: path, ReadOnly: true})
		if err != nil {
			return err
		}
		defer d.Close()
		if err := d.Backup(ctx, os.Getenv("BACKUP_DEST")); err != nil {
			return err
		}
		fmt.Println("BACKED UP")
		return nil
	case "migrate":
		fmt.Println("OPENING")
		return migrateAndPrintApplied(ctx, path)
	case "writer":
		return childWriter(ctx, path)
	case "reader":
		return childReader(ctx, path)
	}
	return fmt.Errorf("unknown role %q", role)
}

// migrateAndPrintApplied opens the database at path read-write, which
// migrates it, waiting up to a minute for another process's migration, and
// prints the versions this open applied on a line "APPLIED v,v,...".
func migrateAndPrintApplied(ctx context.Context, path string) error {
	d, err := Open(ctx, Options{Path: path, BusyTimeout: time.Minute})
	if err != nil {
		return err
	}
	fmt.Printf("APPLIED %s\n", joinInts(d.Migrated().Applied))
	return d.Close()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// childWriter writes pulled and activated images, each under a running
// run (a lock) completed afterwards (every kind of write the daemon makes),
// until the reader says it has seen the data change several times
// (READER_SAW file) and at least MIN_WRITES images are written, then
// creates WRITER_DONE and prints the image count.
func childWriter(ctx context.Context, path string) error {
	d, err := Open(ctx, Options{Path: path})
	if err != nil {
		return err
	}
	defer d.Close()
	minWrites, _ := strconv.Atoi(os.Getenv("MIN_WRITES"))
	saw, done := os.Getenv("READER_SAW"), os.Getenv("WRITER_DONE")
	n := 0
	for ; n < 5000 && (n < minWrites || !exists(saw)); n++ {
		now := time.Now()
		run := seed.Run{ID: fmt.Sprintf("run-%d", n), FSM: "pull-image", IdempotencyID: fmt.Sprintf("s3-w%d", n), State: "running", Created: now}
		if err := seed.InsertRun(ctx, d, run); err != nil {
			return err
		}
		if err := seed.WriteImage(ctx, d, n); err != nil {
			return err
		}
		if err := seed.FinishRun(ctx, d, run.ID, "complete", time.Now()); err != nil {
			return err
		}
	}
	if err := os.WriteFile(done, nil, 0o600); err != nil {
		return err
	}
	fmt.Printf("WROTE %d\n", n)
	return nil
}

// halfWrittenImages lists, as "image_id download_status activation_status",
// the images of the images view that are neither unpacked nor active, or
// lack their device, their one layer or their one name: what a reader
// would see of a pipeline step half written, each step writing all it
// writes in one transaction.
const halfWrittenImages = `SELECT i.image_id, i.download_status, i.activation_status FROM images i
	LEFT JOIN unpacked_images u ON u.image_id = i.image_id
	WHERE i.download_status = 'failed' OR i.activation_status = 'failed'
	   OR (i.activation_status <> 'active' AND i.download_status <> 'completed')
	   OR u.device_name IS NULL
	   OR (SELECT count(*) FROM image_layers il WHERE il.image_id = i.image_id) <> 1
	   OR (SELECT count(*) FROM image_names n WHERE n.image_id = i.image_id) <> 1`

// childReader opens the database read-only and reads every view in a loop
// until WRITER_DONE exists, then once more; any error ends it with status 1.
// It creates READER_SAW once it has seen three different image counts, and
// prints the number of distinct counts and the final count.
func childReader(ctx context.Context, path string) error {
	d, err := Open(ctx, Options{Path: path, ReadOnly: true})
	if err != nil {
		return err
	}
	defer d.Close()
	saw, done := os.Getenv("READER_SAW"), os.Getenv("WRITER_DONE")
	seen := map[int]bool{}
	last := 0
	for final := false; ; {
		final = exists(done)
		var imgs int
		for _, v := range []string{"images", "unpacked_images", "snapshots", "image_locks"} {
			var n int
			if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM `+v).Scan(&n); err != nil {
				return fmt.Errorf("view %s: %w", v, err)
			}
			if v == "images" {
				imgs = n
			}
		}
		// A read transaction on the read-only handle, as the pipelines'
		// look-ups run one, while the writer commits.
		if err := d.ReadSnapshot(ctx, func(q Querier) error {
			var n int
			return q.QueryRowContext(ctx, `SELECT COUNT(*) FROM image_layers WHERE image_id = 's3-w0'`).Scan(&n)
		}); err != nil {
			return err
		}
		bad, err := QueryAll(ctx, d.db, func(r *sql.Rows) (string, error) {
			var id, download, activation string
			err := r.Scan(&id, &download, &activation)
			return id + " " + download + " " + activation, err
		}, halfWrittenImages)
		if err != nil {
			return fmt.Errorf("half-written images: %w", err)
		}
		if len(bad) != 0 {
			return fmt.Errorf("images %q: a reader saw a half-written pipeline step", bad)
		}
		last = imgs
		seen[last] = true
		if len(seen) >= 3 && !exists(saw) {
			if err := os.WriteFile(saw, nil, 0o600); err != nil {
				return err
			}
		}
		if final {
			break
		}
	}
	fmt.Printf("DISTINCT %d FINAL %d\n", len(seen), last)
	return nil
}

// startChild starts the test binary in role with env, returning the command
// and a line reader on its stdout.
func startChild(t *testing.T, role string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), env...)
	cmd.Stderr = &prefixWriter{t: t, prefix: role + ": "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, bufio.NewScanner(out)
}

// killChildPausedInMigration runs a child that migrates the database at
// path and pauses inside migration pauseAt's transaction, then kills it with
// SIGKILL: the database is left as a crash in that migration leaves it.
func killChildPausedInMigration(t *testing.T, path string, pauseAt int) {
	t.Helper()
	cmd, out := startChild(t, "migrate-pause", "METADATA_TEST_DB="+path, "PAUSE_AT="+strconv.Itoa(pauseAt))
	waitLine(t, out, "PAUSED")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v", err)
	}
}

// waitLine reads lines until one starts with prefix and returns it.
func waitLine(t *testing.T, sc *bufio.Scanner, prefix string) string {
	t.Helper()
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			return sc.Text()
		}
	}
	t.Fatalf("child ended without printing %q (%v)", prefix, sc.Err())
	return ""
}

type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if !strings.Contains(l, "level=info") {
			w.t.Log(w.prefix + l)
		}
	}
	return len(p), nil
}

var _ io.Writer = (*prefixWriter)(nil)
