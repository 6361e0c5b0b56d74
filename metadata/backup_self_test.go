package metadata

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestBackupRefusesTheDatabaseItself: a backup whose destination is the
// database it copies (`db backup --force <the daemon's database>`) would
// rename the copy over the live file: the writers go on writing to the
// unlinked one, and what they commit afterwards is lost. It is refused,
// and the database keeps every commit.
func TestBackupRefusesTheDatabaseItself(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	exec := func(q string) {
		t.Helper()
		if _, err := d.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE TABLE big (b BLOB)`)
	exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) INSERT INTO big SELECT randomblob(3000) FROM n`)
	exec(`DELETE FROM big WHERE rowid % 3 <> 0`)
	exec(`CREATE TABLE t (x INTEGER)`)
	exec(`INSERT INTO t VALUES (1)`)
	err := d.Backup(ctx, d.Path())
	exec(`INSERT INTO t VALUES (2)`)
	exec(`INSERT INTO big SELECT randomblob(3000) FROM big LIMIT 100`)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	r, oerr := Open(ctx, Options{Path: d.Path(), ReadOnly: true})
	if oerr != nil {
		t.Fatalf("reopen: %v (backup: %v)", oerr, err)
	}
	defer r.Close()
	var n int
	if qerr := r.db.QueryRowContext(ctx, `SELECT count(*) FROM t`).Scan(&n); qerr != nil || n != 2 {
		t.Errorf("after a backup onto the database itself (err %v), it holds %d rows, %v; want 2", err, n, qerr)
	}
	if rep, cerr := r.Check(ctx); cerr != nil || !rep.OK() {
		t.Errorf("after a backup onto the database itself (err %v): Check = %+v, %v", err, rep, cerr)
	}
	if err == nil {
		t.Errorf("Backup onto the database itself (%s) succeeded", d.Path())
	}
	link := filepath.Join(t.TempDir(), "link.db")
	if err := os.Symlink(r.Path(), link); err != nil {
		t.Fatal(err)
	}
	for _, dest := range []string{link, r.Path() + "-wal"} {
		if err := r.Backup(ctx, dest); err == nil {
			t.Errorf("Backup onto %s, a file of the database, succeeded", dest)
		}
	}
}
