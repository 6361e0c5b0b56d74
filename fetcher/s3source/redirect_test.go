package s3source_test

import (
	"context"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestWrongRegionFailsAtOnce: S3 answers 301 PermanentRedirect (with a
// body on a listing, without one on a HEAD) to a request for a bucket in
// another region than the one configured, or sent to another endpoint.
// The same request gets the same answer every time, so the pull's
// listing fails at once, as a misconfiguration, instead of being asked
// again as a server fault.
func TestWrongRegionFailsAtOnce(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/01.tar", payload(100))
	src, err := s3source.New(context.Background(), s3source.Config{Bucket: srv.Bucket, Region: "us-east-1", Endpoint: srv.URL, PathStyle: true, Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, image := range []string{"img", "img/01.tar"} {
		srv.Faults.Reset()
		srv.Faults.FailNext(10, "", 301, "PermanentRedirect")
		_, err := src.ResolveImage(context.Background(), image)
		if k := s3source.Classify(err); k != s3source.KindInvalid {
			t.Errorf("resolve %s answered 301: %v (kind %v), want invalid", image, err, k)
		}
		if n := srv.TotalRequests(); n != 1 {
			t.Errorf("resolve %s answered 301: %d requests, want 1", image, n)
		}
	}
}
