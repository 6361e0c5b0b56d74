package metadata

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// openTestDB opens a fresh read-write database in a temporary directory.
func openTestDB(t testing.TB) *DB {
	t.Helper()
	d, err := Open(context.Background(), Options{Path: filepath.Join(t.TempDir(), "metadata.db")})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestPragmasOnEveryConnection holds several pooled connections at once and
// checks each one carries every connection pragma the package promises.
func TestPragmasOnEveryConnection(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	want := map[string]string{
		"journal_mode": "wal",
		"foreign_keys": "1",
		"synchronous":  "2", // FULL, DefaultSynchronous
		"cache_size":   "-10000",
		"busy_timeout": "5000",
		"temp_store":   "2", // MEMORY
		"mmap_size":    "268435456",
	}
	var conns []*sql.Conn
	for i := 0; i < maxOpenConns; i++ {
		c, err := d.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		for p, v := range want {
			var got string
			if err := c.QueryRowContext(ctx, "PRAGMA "+p).Scan(&got); err != nil {
				t.Fatalf("conn %d: PRAGMA %s: %v", i, p, err)
			}
			if got != v {
				t.Errorf("conn %d: PRAGMA %s = %s, want %s", i, p, got, v)
			}
		}
	}
	for _, c := range conns {
		c.Close()
	}
	if st := d.db.Stats(); st.MaxOpenConnections != maxOpenConns {
		t.Errorf("MaxOpenConnections = %d, want %d", st.MaxOpenConnections, maxOpenConns)
	}
}

// TestSynchronousOption checks that Options.Synchronous reaches every
// connection, and that a value Open does not know is refused with an error
// naming it and the accepted values, before any file is made.
func TestSynchronousOption(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		sync Synchronous
		want string
	}{{SynchronousFull, "2"}, {SynchronousNormal, "1"}, {"", "2"}} {
		d, err := Open(ctx, Options{Path: filepath.Join(t.TempDir(), "m.db"), Synchronous: tc.sync})
		if err != nil {
			t.Fatalf("Open with synchronous %q: %v", tc.sync, err)
		}
		var got string
		if err := d.db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&got); err != nil {
			t.Fatal(err)
		}
		d.Close()
		if got != tc.want {
			t.Errorf("synchronous %q: PRAGMA synchronous = %s, want %s", tc.sync, got, tc.want)
		}
	}
	dir := filepath.Join(t.TempDir(), "db")
	_, err := Open(ctx, Options{Path: filepath.Join(dir, "m.db"), Synchronous: "extra"})
	if err == nil {
		t.Fatal("Open accepted synchronous \"extra\"")
	}
	for _, w := range []string{`"extra"`, `"full"`, `"normal"`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %s", err, w)
		}
	}
	if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("refused open left %s behind (stat: %v)", dir, serr)
	}
}

func TestReadOnlyOpen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	if _, err := Open(ctx, Options{Path: path, ReadOnly: true}); !errors.Is(err, ErrNoDatabase) {
		t.Fatalf("read-only open of a missing file: err = %v, want ErrNoDatabase", err)
	}
	w, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := Open(ctx, Options{Path: path, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.WithTx(ctx, func(*sql.Tx) error { return nil }); !errors.Is(err, ErrReadOnly) {
		t.Errorf("WithTx on read-only DB: err = %v, want ErrReadOnly", err)
	}
	if _, err := r.db.ExecContext(ctx, `CREATE TABLE x (a)`); err == nil {
		t.Errorf("read-only connection accepted a CREATE TABLE")
	}
	v, err := r.SchemaVersion(ctx)
	if err != nil || v != LatestVersion() {
		t.Errorf("SchemaVersion = %d, %v; want %d", v, err, LatestVersion())
	}
}

// TestWithTxImmediate checks that concurrent WithTx calls serialize without
// SQLITE_BUSY and that a failing fn rolls back.
func TestWithTxImmediate(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	if _, err := d.db.ExecContext(ctx, `CREATE TABLE counter (n INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.ExecContext(ctx, `INSERT INTO counter VALUES (0)`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- d.WithTx(ctx, func(tx *sql.Tx) error {
				var n int
				if err := tx.QueryRowContext(ctx, `SELECT n FROM counter`).Scan(&n); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, `UPDATE counter SET n = ?`, n+1)
				return err
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("WithTx: %v", err)
		}
	}
	boom := errors.New("boom")
	if err := d.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = -1`); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("WithTx error = %v, want boom", err)
	}
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT n FROM counter`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 20 {
		t.Errorf("counter = %d after 20 increments and one rolled-back update, want 20", n)
	}
}

// TestPathNeedsEscaping opens databases whose paths hold URI specials.
func TestPathNeedsEscaping(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"a b.db", "q?mode=memory.db", "hash#frag.db", "pct%41.db"} {
		path := filepath.Join(t.TempDir(), "dir with space", name)
		d, err := Open(ctx, Options{Path: path})
		if err != nil {
			t.Fatalf("Open(%q): %v", path, err)
		}
		if err := seed.StoreDownload(ctx, d, "b", "k", "", 0, "sha256:1"); err != nil {
			t.Fatal(err)
		}
		d.Close()
		if _, err := os.Stat(path); err != nil {
			t.Errorf("database not at %q: %v", path, err)
		}
		r, err := Open(ctx, Options{Path: path, ReadOnly: true})
		if err != nil {
			t.Fatalf("read-only Open(%q): %v", path, err)
		}
		if o := seed.Rows(t, r.db, `SELECT digest FROM s3_objects WHERE bucket = 'b' AND key = 'k'`); len(o) != 1 {
			t.Errorf("%q: row not read back: %q", path, o)
		}
		r.Close()
	}
}
