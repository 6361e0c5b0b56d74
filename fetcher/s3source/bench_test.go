package s3source_test

import (
	"context"
	"crypto/sha256"
	"io"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// BenchmarkRangedVsSingle reads one 64 MiB object, hashing it as the
// download pipeline does, through one stream (one connection per object)
// and as ranged parts (the default part size and connections), both in
// every iteration on the same server, and reports their times and the
// ratio single/ranged ("speedup"). The links: a distant S3 (first byte
// after 30ms, 64 MiB/s per connection, as S3 caps each connection), with
// the default part size and with 16 MiB parts, the latency alone, and the
// bare loopback (what the parts cost when the link is not the limit).
func BenchmarkRangedVsSingle(b *testing.B) {
	const size = 64 << 20
	for _, link := range []struct {
		name     string
		latency  time.Duration
		rate     int64
		partSize int64
	}{
		{"30ms-64MiBps-per-conn", 30 * time.Millisecond, 64 << 20, s3source.DefaultPartSize},
		// The other size of AWS's guidance, at twice the memory.
		{"30ms-64MiBps-per-conn-16MiB-parts", 30 * time.Millisecond, 64 << 20, 16 << 20},
		{"30ms-uncapped", 30 * time.Millisecond, 0, s3source.DefaultPartSize},
		{"loopback", 0, 0, s3source.DefaultPartSize},
	} {
		b.Run(link.name, func(b *testing.B) {
			srv := s3test.NewServer(b)
			data := payload(size)
			srv.Put(b, "bench.tar", data)
			want := sha256.Sum256(data)
			single := partedSource(b, srv, link.partSize, 1)
			ranged := partedSource(b, srv, link.partSize, s3source.DefaultConnectionsPerObject)
			obj, err := single.Stat(context.Background(), "bench.tar")
			if err != nil {
				b.Fatal(err)
			}
			srv.Faults.Shape(link.latency, link.rate)
			read := func(src *s3source.Source) time.Duration {
				t0 := time.Now()
				r := src.NewReader(context.Background(), obj, 0)
				h := sha256.New()
				_, err := io.Copy(h, r)
				r.Close()
				took := time.Since(t0)
				if err != nil || [32]byte(h.Sum(nil)) != want {
					b.Fatalf("read: %v, or the bytes differ from the object", err)
				}
				return took
			}
			var ts, tr time.Duration
			b.SetBytes(2 * size)
			b.ResetTimer()
			for range b.N {
				ts += read(single)
				tr += read(ranged)
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
			b.ReportMetric(ms(ts), "single-ms/op")
			b.ReportMetric(ms(tr), "ranged-ms/op")
			b.ReportMetric(float64(ts)/float64(tr), "speedup")
		})
	}
}
