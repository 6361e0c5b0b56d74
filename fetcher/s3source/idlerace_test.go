package s3source_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// lateBytes is a fake transport whose first object body hands its first
// bytes over only once the idle timeout has passed, as bytes that arrive
// just as the timeout fires do, and fails every Read after that with the
// request's end, as a body whose request was canceled does.
type lateBytes struct {
	next  http.RoundTripper
	delay time.Duration
	done  atomic.Bool
}

func (l *lateBytes) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(r)
	if err == nil && r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "" && l.done.CompareAndSwap(false, true) {
		resp.Body = &lateBody{ReadCloser: resp.Body, ctx: r.Context(), delay: l.delay}
	}
	return resp, err
}

type lateBody struct {
	io.ReadCloser
	ctx   context.Context
	delay time.Duration
	reads int
}

func (b *lateBody) Read(p []byte) (int, error) {
	b.reads++
	if b.reads == 1 {
		time.Sleep(b.delay)
		return b.ReadCloser.Read(p[:min(len(p), 10)])
	}
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	return b.ReadCloser.Read(p)
}

// TestIdleTimeoutAsBytesArrive: a body whose bytes come just as the idle
// timeout fires has its request canceled all the same; the Read after
// is the timeout's failure, retryable, and the read resumes, instead of
// ending as if the caller had canceled it.
func TestIdleTimeoutAsBytesArrive(t *testing.T) {
	srv := s3test.NewServer(t)
	fake := &lateBytes{next: http.DefaultTransport, delay: 300 * time.Millisecond}
	src := hostileSource(t, srv, s3source.Config{IdleTimeout: conf.D(100 * time.Millisecond), HTTPClient: &http.Client{Transport: fake}})
	data := payload(5000)
	srv.Put(t, "img/01.tar", data)
	obj, err := src.Stat(context.Background(), "img/01.tar")
	if err != nil {
		t.Fatal(err)
	}
	r := src.NewReader(context.Background(), obj, 3)
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) || r.Resumes() != 1 {
		t.Errorf("read %d bytes, %v (kind %v), %d resumes; want the object after 1 resume", len(got), err, s3source.Classify(err), r.Resumes())
	}
}
