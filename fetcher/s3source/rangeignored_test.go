package s3source_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// rangesDropped is a fake proxy in front of the server that drops every
// request's Range header, as a gateway that does not pass ranges on
// does: each GET is answered 200 with the whole object. It counts the
// bytes of object bodies the client reads.
type rangesDropped struct {
	next http.RoundTripper
	read *atomic.Int64
}

func (d rangesDropped) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Del("Range")
	resp, err := d.next.RoundTrip(r)
	if err == nil && r.Method == http.MethodGet && resp.StatusCode == http.StatusOK {
		resp.Body = countedBody{resp.Body, d.read}
	}
	return resp, err
}

type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countedBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestRangesIgnored: from a server that answers every ranged GET with the
// whole object, a read of many parts still comes back whole, having read
// about the object once, not the object's first k parts again to reach
// part k (the square of its parts); the source reads such objects as one
// stream from then on.
func TestRangesIgnored(t *testing.T) {
	srv := s3test.NewServer(t)
	var read atomic.Int64
	src := hostileSource(t, srv, s3source.Config{PartSize: conf.Size(part), ConnectionsPerObject: 4,
		HTTPClient: &http.Client{Transport: rangesDropped{http.DefaultTransport, &read}}})
	data := payload(16 * part)
	obj := putAndStat(t, srv, src, "whole.tar", data)
	if !src.Ranged(obj) {
		t.Fatal("the object is not read as ranged parts: the test could not fail")
	}
	r := src.NewReader(context.Background(), obj, 5)
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, err %v; want the %d-byte object", len(got), err, len(data))
	}
	if n := read.Load(); n > 2*int64(len(data)) {
		t.Errorf("read %d bytes of bodies (%.1f times the object) for one %d-byte object", n, float64(n)/float64(len(data)), len(data))
	}
	if src.Ranged(obj) {
		t.Error("the source still reads the object as ranged parts from a server that ignores ranges")
	}
}
