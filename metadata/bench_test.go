package metadata

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// benchImages is how many pulled images the benchmarks' database holds.
const benchImages = 1000

var bench struct {
	once sync.Once
	dir  string
	db   *DB
	err  error
}

// benchDB returns the benchmarks' database of benchImages pulled and
// activated images, built once per test binary (each benchmark function
// runs several times) and removed by TestMain.
func benchDB(b *testing.B) *DB {
	b.Helper()
	bench.once.Do(func() {
		ctx := context.Background()
		if bench.dir, bench.err = os.MkdirTemp("", "metadata-bench-"); bench.err != nil {
			return
		}
		if bench.db, bench.err = Open(ctx, Options{Path: filepath.Join(bench.dir, "metadata.db")}); bench.err != nil {
			return
		}
		for i := 0; i < benchImages && bench.err == nil; i++ {
			bench.err = seed.WriteImage(ctx, bench.db, i)
		}
	})
	if bench.err != nil {
		b.Fatalf("building the benchmark database: %v", bench.err)
	}
	return bench.db
}

// removeBenchDB closes and removes the benchmarks' database, if built.
func removeBenchDB() {
	if bench.db != nil {
		bench.db.Close()
	}
	if bench.dir != "" {
		os.RemoveAll(bench.dir)
	}
}

// BenchmarkPing is the anchor for the look-ups, listings and upkeep of the
// packages that own the records (fetcher/pipeline's
// BenchmarkPulledImageState and BenchmarkPruneOrphans, inventory's
// BenchmarkListings): one trivial round trip through database/sql and the
// driver, on a database of as many images written the same way
// (seed.WriteImage).
func BenchmarkPing(b *testing.B) {
	ctx := context.Background()
	d := benchDB(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
