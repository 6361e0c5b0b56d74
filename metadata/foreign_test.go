package metadata

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenRefusesADatabaseWithoutLedger: every database this package
// makes records migration 1 in the ledger in the transaction that creates
// its first tables, so a database with tables and no ledger is another
// program's (a mistyped --db or metadata.path). Neither a read-write open
// (the daemon's start, db migrate) nor a read-only one takes it: the first
// would write the whole schema into it.
func TestOpenRefusesADatabaseWithoutLedger(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "other.db")
	raw, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine')`); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	tables := func() int {
		t.Helper()
		raw, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		var n int
		if err := raw.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, ro := range []bool{true, false} {
		d, err := Open(ctx, Options{Path: path, ReadOnly: ro})
		if err == nil {
			d.Close()
			t.Errorf("Open (read-only %v) of another program's database succeeded", ro)
		} else if !errors.Is(err, ErrLedgerMismatch) {
			t.Errorf("Open (read-only %v): %v, want ErrLedgerMismatch", ro, err)
		}
		if n := tables(); n != 1 {
			t.Fatalf("after Open (read-only %v), the database has %d tables, had 1", ro, n)
		}
	}
	if _, err := os.Stat(path + ".pre-v1"); err == nil {
		t.Errorf("a copy %s.pre-v1 was made", path)
	}
}
