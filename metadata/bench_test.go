package metadata

import (
	"context"
	"fmt"
	"testing"
)

// benchDB is a database holding n completed, unpacked and activated images.
func benchDB(b *testing.B, n int) *DB {
	b.Helper()
	d := openTestDB(b)
	for i := 0; i < n; i++ {
		img, _ := seedImage(b, d, i)
		seedUnpacked(b, d, img, i+1)
		if err := d.RegisterActivation(context.Background(), snapRecord(img, fmt.Sprint(i+1), 1)); err != nil {
			b.Fatal(err)
		}
	}
	return d
}

// BenchmarkIdempotencyChecks runs the three "is it already done?" look-ups
// of a pipeline re-run (downloaded? unpacked? activated?) together, by S3
// key, on a database of 1000 fully activated images. Seed 001 promises a
// whole idempotent re-run in under 1 second; these three must be well
// under 1 ms.
func BenchmarkIdempotencyChecks(b *testing.B) {
	ctx := context.Background()
	d := benchDB(b, 1000)
	key := "images/family/500.tar"
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		img, err := d.CheckImageDownloaded(ctx, key)
		if err != nil || img == nil {
			b.Fatalf("downloaded? %v %v", img, err)
		}
		u, err := d.CheckImageUnpackedByS3Key(ctx, key)
		if err != nil || u == nil {
			b.Fatalf("unpacked? %v %v", u, err)
		}
		s, err := d.CheckImageActivatedByS3Key(ctx, key)
		if err != nil || s == nil {
			b.Fatalf("activated? %v %v", s, err)
		}
	}
}

// BenchmarkPing is the anchor for BenchmarkIdempotencyChecks: one trivial
// round trip through database/sql and the driver on the same database.
func BenchmarkPing(b *testing.B) {
	ctx := context.Background()
	d := benchDB(b, 1000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
