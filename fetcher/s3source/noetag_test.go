package s3source_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestNoETagAnywhereIsNotResumed: from a server that gives an object no
// ETag, neither listed nor on GET, nothing can hold a resume to the
// version the read began with. A body cut after 1000 bytes, the object
// overwritten before a resume would be asked for, ends the read with a
// retryable error (the caller reads the object again from its start)
// instead of returning v1's first bytes followed by v2's rest.
func TestNoETagAnywhereIsNotResumed(t *testing.T) {
	srv := s3test.NewServer(t)
	fake := &fakeETagServer{next: http.DefaultTransport, answerETag: func(string) string { return "" }}
	src := hostileSource(t, srv, s3source.Config{HTTPClient: &http.Client{Transport: noListedETags{fake}}})
	v1, v2 := bytes.Repeat([]byte("1"), 4000), bytes.Repeat([]byte("2"), 4000)
	obj, r, got, err := readOverwrittenMidway(t, srv, src, v1, v2)
	if !bytes.Equal(got, v1[:len(got)]) {
		t.Fatalf("read %d bytes (%d of v1, %d of v2), %v: two versions spliced", len(got), bytes.Count(got, []byte("1")), bytes.Count(got, []byte("2")), err)
	}
	if err == nil || !s3source.IsRetryable(err) || r.Resumes() != 0 {
		t.Errorf("read cut without an ETag: %v (kind %v), %d resumes; want a retryable error and no resume", err, s3source.Classify(err), r.Resumes())
	}
	if n := srv.Requests(http.MethodGet, "img/01.tar"); n != 1 {
		t.Errorf("%d GETs of the object, want 1", n)
	}
	// Read again from its start, the object comes back whole: v2, put
	// now if no resume asked for it above.
	srv.Put(t, "img/01.tar", v2)
	r = src.NewReader(context.Background(), obj, 3)
	got, err = io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, v2) {
		t.Errorf("read again: %d bytes, %v; want v2 whole", len(got), err)
	}
}
