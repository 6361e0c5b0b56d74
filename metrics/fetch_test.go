package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// series gathers every sample of m whose name starts with prefix, as
// "name{label=value,...}" -> value (a histogram gives its sample count).
func series(t *testing.T, m *Metrics, prefix string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, mf := range gatherFamilies(t, m) {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		for _, mt := range mf.GetMetric() {
			v := mt.GetCounter().GetValue()
			if h := mt.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			out[mf.GetName()+"{"+labelKey(mt)+"}"] = v
		}
	}
	return out
}

// countedS3 is a real S3 client (package s3source) with f's middleware
// installed, over the in-process S3 server holding img/1.tar.
func countedS3(t *testing.T, f *Fetch, layer string) (*s3test.Server, *s3source.Source) {
	t.Helper()
	srv := s3test.NewServer(t)
	srv.Put(t, "img/1.tar", []byte(layer))
	src, err := s3source.New(context.Background(), s3source.Config{Bucket: srv.Bucket, Region: "us-east-1", Endpoint: srv.URL, PathStyle: true, Anonymous: true,
		APIOptions: []func(*middleware.Stack) error{f.S3Middleware}})
	if err != nil {
		t.Fatal(err)
	}
	return srv, src
}

// TestS3Counters drives a real S3 client (package s3source over the
// in-process S3 server, its faults injected at the HTTP boundary) with the
// middleware installed and checks what the counters say.
func TestS3Counters(t *testing.T) {
	ctx := context.Background()
	payload := strings.Repeat("layer bytes ", 1000)
	m := New()
	f := m.Fetch()
	srv, src := countedS3(t, f, payload)
	if _, err := src.ResolveImage(ctx, "img/"); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Stat(ctx, "img/missing.tar"); err == nil {
		t.Fatal("stat of a missing key succeeded")
	}
	// One GET answered 503, then the same GET again (the pipeline's retry),
	// read whole.
	srv.Faults.Fail503(1, "img/1.tar")
	if _, err := src.Open(ctx, "img/1.tar", 0); err == nil {
		t.Fatal("the injected 503 was not an error")
	}
	body, err := src.Open(ctx, "img/1.tar", 0)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, body)
	body.Close()
	if err != nil || n != int64(len(payload)) {
		t.Fatalf("read %d bytes, %v", n, err)
	}
	// A body cut after 100 bytes, then resumed where it broke.
	srv.Faults.DropAfter(1, "img/1.tar", 100)
	body, err = src.Open(ctx, "img/1.tar", 0)
	if err != nil {
		t.Fatal(err)
	}
	got, rerr := io.Copy(io.Discard, body)
	body.Close()
	if rerr == nil {
		t.Fatalf("the cut body read %d bytes without an error", got)
	}
	body, err = src.Open(ctx, "img/1.tar", got)
	if err != nil {
		t.Fatal(err)
	}
	rest, _ := io.Copy(io.Discard, body)
	body.Close()

	f.ObservePull(2*time.Second, "", nil)
	f.ObservePull(time.Second, "too_many_entries", errors.New("rejected"))
	f.ObservePull(time.Second, "", errors.New("S3 down"))
	// A pull whose client went away (Ctrl-C) did not fail.
	f.ObservePull(time.Second, "", fmt.Errorf("pull s3://b/k: %w", context.Canceled))
	f.StepRetried("download-image", "download")

	s := series(t, m, Namespace+"_")
	want := map[string]float64{
		`flyio_snapshotter_s3_requests_total{operation=ListObjectsV2,outcome=ok}`:       1,
		`flyio_snapshotter_s3_requests_total{operation=HeadObject,outcome=not_found}`:   1,
		`flyio_snapshotter_s3_requests_total{operation=GetObject,outcome=server_error}`: 1,
		// the whole read, the cut one (ok at its headers), its resume
		`flyio_snapshotter_s3_requests_total{operation=GetObject,outcome=ok}`:            3,
		`flyio_snapshotter_s3_requests_total{operation=GetObject,outcome=network_error}`: 1,
		// the GET after the 503 and the resume after the cut
		`flyio_snapshotter_s3_retries_total{operation=GetObject}`:                         2,
		`flyio_snapshotter_s3_downloaded_bytes_total{}`:                                   float64(int64(len(payload)) + got + rest),
		`flyio_snapshotter_pull_duration_seconds{outcome=ok}`:                             1,
		`flyio_snapshotter_pull_duration_seconds{outcome=rejected}`:                       1,
		`flyio_snapshotter_pull_duration_seconds{outcome=error}`:                          1,
		`flyio_snapshotter_pull_duration_seconds{outcome=canceled}`:                       1,
		`flyio_snapshotter_layers_rejected_total{rule=too_many_entries}`:                  1,
		`flyio_snapshotter_pipeline_step_retries_total{fsm=download-image,step=download}`: 1,
	}
	for k, v := range want {
		if s[k] != v {
			t.Errorf("%s = %v, want %v", k, s[k], v)
		}
	}
	if t.Failed() {
		t.Logf("all series: %v", s)
	}
}

// TestRetryOfAPart: the resume of a ranged part (from the byte reached to
// the part's end) repeats that part's GET; a GET of another part of the
// same object, or of the whole object, does not.
func TestRetryOfAPart(t *testing.T) {
	get := func(rng string) string {
		in := &s3.GetObjectInput{Bucket: aws.String("b"), Key: aws.String("k.tar")}
		if rng != "" {
			in.Range = aws.String(rng)
		}
		return requestTarget(in)
	}
	if get("bytes=0-1048575") != get("bytes=5000-1048575") {
		t.Error("a part's resume is not the same request as the part")
	}
	if get("bytes=0-1048575") == get("bytes=1048576-2097151") || get("bytes=0-1048575") == get("") {
		t.Error("two parts, or a part and the whole object, are the same request")
	}
	if get("bytes=5000-") != get("") {
		t.Error("a one-stream resume (to the object's end) is not the same request as the whole object")
	}
}

// TestLastS3Request: the latest request's outcome is kept for /healthz; a
// 412 (the object changed under a read naming its ETag) is S3 answering,
// counted apart from client errors and not a failure; a 503 is one.
func TestLastS3Request(t *testing.T) {
	ctx := context.Background()
	m := New()
	f := m.Fetch()
	srv, src := countedS3(t, f, "layer")
	if _, ok := f.LastS3Request(); ok {
		t.Fatal("a last request before any")
	}
	for _, c := range []struct {
		fail    int
		outcome string
		failed  bool
	}{
		{412, "changed", false},
		{503, "server_error", true},
		{403, "client_error", true},
		{0, "ok", false},
	} {
		if c.fail != 0 {
			srv.Faults.FailNext(1, "img/1.tar", c.fail, "Injected")
		}
		start := time.Now()
		src.Stat(ctx, "img/1.tar")
		r, ok := f.LastS3Request()
		if !ok || r.Operation != "HeadObject" || r.Outcome != c.outcome || r.Failed() != c.failed || r.At.Before(start) {
			t.Errorf("after a HEAD answered %d: last request %+v, %v; want outcome %s, failed %v", c.fail, r, ok, c.outcome, c.failed)
		}
	}
	if n := series(t, m, Namespace+"_s3_requests_total")[`flyio_snapshotter_s3_requests_total{operation=HeadObject,outcome=changed}`]; n != 1 {
		t.Errorf("HeadObject changed = %v, want 1", n)
	}
}
