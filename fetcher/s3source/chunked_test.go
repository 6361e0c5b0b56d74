package s3source_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// noContentLength is a fake gateway in front of the server that sends
// object bodies chunked, without a Content-Length, as a gateway streaming
// from a store of its own may.
type noContentLength struct{ next http.RoundTripper }

func (n noContentLength) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := n.next.RoundTrip(r)
	if err == nil && r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "" && resp.StatusCode < 300 {
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	return resp, err
}

// TestGetWithoutContentLength: an object sent without a Content-Length
// is read whole, and resumed after a cut, instead of its answer being
// taken for an empty object and the read failing as changed.
func TestGetWithoutContentLength(t *testing.T) {
	srv := s3test.NewServer(t)
	src := hostileSource(t, srv, s3source.Config{HTTPClient: &http.Client{Transport: noContentLength{http.DefaultTransport}}})
	data := payload(300_000)
	srv.Put(t, "img/01.tar", data)
	objs, err := src.List(context.Background(), "img/")
	if err != nil || len(objs) != 1 || objs[0].Size != int64(len(data)) {
		t.Fatalf("list: %+v, %v", objs, err)
	}
	srv.Faults.Truncate(1, "img/01.tar", 100_000)
	r := readWhole(t, src, objs[0], 3, data)
	if r.Resumes() != 1 {
		t.Errorf("resumes %d, want 1", r.Resumes())
	}
}
