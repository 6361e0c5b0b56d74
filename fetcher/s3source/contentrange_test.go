package s3source_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// misplacedRanges answers every ranged GET with a Content-Range that
// starts at byte 0, whatever was asked.
type misplacedRanges struct{ next http.RoundTripper }

func (m misplacedRanges) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := m.next.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusPartialContent {
		resp.Header.Set("Content-Range", "bytes 0-9/200000")
	}
	return resp, err
}

// TestMisplacedContentRange: a ranged GET answered with bytes other than
// the ones asked for breaks S3's rules, like a 206 without Content-Range:
// the read fails as invalid at once, not as a failure worth resuming.
func TestMisplacedContentRange(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/01.tar", payload(200_000))
	src := hostileSource(t, srv, s3source.Config{HTTPClient: &http.Client{Transport: misplacedRanges{http.DefaultTransport}}})
	objs, err := src.List(context.Background(), "img/")
	if err != nil || len(objs) != 1 {
		t.Fatalf("list: %v %v", objs, err)
	}
	srv.Faults.Truncate(1, "img/01.tar", 150_000)
	r := src.NewReader(context.Background(), objs[0], 3)
	defer r.Close()
	_, err = io.Copy(io.Discard, r)
	if k := s3source.Classify(err); k != s3source.KindInvalid {
		t.Errorf("resume answered with a Content-Range of other bytes: %v (kind %v), want kind invalid", err, k)
	}
	if n := srv.Requests(http.MethodGet, "img/01.tar"); n != 2 {
		t.Errorf("%d GETs of the object, want 2 (the cut one, the misplaced answer)", n)
	}
}
