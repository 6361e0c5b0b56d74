package s3source_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// TestResolveAsksAgainAfterSlowDown: the LIST or HEAD that starts a pull
// has no state machine to retry it: a 503 SlowDown or a 500 on it is
// asked again after a pause, a few times, instead of failing the pull at
// the first. A refusal (403) is not asked again, nor a request not
// answered in time, and an error that lasts still ends the call,
// retryable.
func TestResolveAsksAgainAfterSlowDown(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/01.tar", payload(10))
	src := hostileSource(t, srv, s3source.Config{})
	ctx := context.Background()

	srv.Faults.FailNext(1, "", 503, "SlowDown")
	srv.Faults.FailNext(1, "", 500, "InternalError")
	if objs, err := src.ResolveImage(ctx, "img/"); err != nil || len(objs) != 1 {
		t.Errorf("listing after a SlowDown and a 500: %+v, %v; want the image", objs, err)
	}
	if n := srv.Requests(http.MethodGet, ""); n != 3 {
		t.Errorf("%d listing requests, want 3", n)
	}
	srv.Faults.Reset()
	srv.Faults.FailNext(2, "img/01.tar", 503, "SlowDown")
	if objs, err := src.ResolveImage(ctx, "img/01.tar"); err != nil || len(objs) != 1 {
		t.Errorf("HEAD after two SlowDowns: %+v, %v; want the layer", objs, err)
	}
	srv.Faults.Reset()
	srv.Faults.FailNext(1, "", 403, "AccessDenied")
	if _, err := src.ResolveImage(ctx, "img/"); !s3source.IsAccessDenied(err) || srv.Requests(http.MethodGet, "") != 1 {
		t.Errorf("listing refused: %v after %d requests; want access-denied after 1", err, srv.Requests(http.MethodGet, ""))
	}
	srv.Faults.Reset()
	srv.Faults.FailNext(100, "", 503, "SlowDown")
	if _, err := src.ResolveImage(ctx, "img/"); !s3source.IsRetryable(err) {
		t.Errorf("listing throttled for good: %v (kind %v), want retryable", err, s3source.Classify(err))
	}
	if n := srv.Requests(http.MethodGet, ""); n != 6 {
		t.Errorf("%d listing requests while throttled for good, want 6", n)
	}
	// A server that does not answer in time was waited for already: it is
	// not asked again.
	srv.Faults.Reset()
	srv.Faults.Delay(100, "", time.Hour)
	src = hostileSource(t, srv, s3source.Config{ResponseHeaderTimeout: conf.D(200 * time.Millisecond)})
	if _, err := src.ResolveImage(ctx, "img/"); !s3source.IsRetryable(err) || srv.Requests(http.MethodGet, "") != 1 {
		t.Errorf("listing not answered in time: %v after %d requests; want retryable after 1", err, srv.Requests(http.MethodGet, ""))
	}
}

// TestResolveRidesOutASlowDownBurst: S3 answering SlowDown to every
// request for two seconds, as it does to a fleet starting to pull one
// image at once, does not fail the pull at its LIST or HEAD: they are
// asked again for as long as a download's read (with its budget of 5
// resumes) would ask for its bytes, not given up after a second.
func TestResolveRidesOutASlowDownBurst(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/01.tar", payload(10))
	src := hostileSource(t, srv, s3source.Config{})
	for _, key := range []string{"img/", "img/01.tar"} {
		srv.Faults.Reset()
		srv.Faults.FailFor(2*time.Second, "", 503, "SlowDown")
		start := time.Now()
		if objs, err := src.ResolveImage(context.Background(), key); err != nil || len(objs) != 1 {
			t.Errorf("resolve %s through a 2s SlowDown burst: %+v, %v after %v and %d requests; want the image", key, objs, err, time.Since(start).Round(time.Millisecond), srv.TotalRequests())
		}
	}
}
