package cheap

import (
	"context"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
)

// TestSQLiteMemoryFollowsPageCache fills a connection's page cache by
// writing and reading a table of a few MiB (the rows stay in the
// write-ahead log, so every page passes through the cache) and checks
// SQLiteMemory reports the cache and its release when the database
// closes; the high-water mark keeps the peak.
func TestSQLiteMemoryFollowsPageCache(t *testing.T) {
	ctx := context.Background()
	d := metadatatest.Open(t)
	before, _ := SQLiteMemory()
	const tableBytes = 4 << 20
	if _, err := d.Statements().ExecContext(ctx, `CREATE TABLE filler(b BLOB)`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Statements().ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < ?)
		INSERT INTO filler SELECT randomblob(1000) FROM n`, tableBytes/1000); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := d.Statements().QueryRowContext(ctx, `SELECT sum(length(b)) FROM filler`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	full, peak := SQLiteMemory()
	if full-before < tableBytes/2 {
		t.Fatalf("SQLite memory went from %d to %d bytes reading a %d-byte table: the page cache is not counted", before, full, n)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	after, peak2 := SQLiteMemory()
	if full-after < tableBytes/2 {
		t.Fatalf("SQLite memory %d bytes with the table cached, %d after closing the database: the caches' release is not counted", full, after)
	}
	if peak < full || peak2 < peak {
		t.Fatalf("high-water mark %d then %d bytes, below the %d bytes held", peak, peak2, full)
	}
}
