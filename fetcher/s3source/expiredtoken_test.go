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

// TestExpiredTokenIsRetried: a request signed with temporary credentials
// just before they expire reaches S3 after, which answers 400
// ExpiredToken. The SDK fetches new credentials once its own clock has
// them expired, so the read is asked again (after a pause) instead of the
// download being given up as access denied.
func TestExpiredTokenIsRetried(t *testing.T) {
	envCredentials(t)
	t.Setenv("AWS_SESSION_TOKEN", "token")
	srv := s3test.NewServer(t)
	data := payload(3000)
	srv.Put(t, "img/01.tar", data)
	src, err := s3source.New(context.Background(), s3source.Config{Bucket: srv.Bucket, Region: "us-east-1", Endpoint: srv.URL, PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	obj, err := src.Stat(context.Background(), "img/01.tar")
	if err != nil {
		t.Fatal(err)
	}
	srv.Faults.FailNext(1, "img/01.tar", http.StatusBadRequest, "ExpiredToken")
	if _, err := src.Open(context.Background(), "img/01.tar", 0); !s3source.IsRetryable(err) {
		t.Errorf("ExpiredToken: %v (kind %v), want retryable", err, s3source.Classify(err))
	}
	srv.Faults.FailNext(1, "img/01.tar", http.StatusBadRequest, "ExpiredToken")
	r := src.NewReader(context.Background(), obj, 3)
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) || r.Resumes() != 1 {
		t.Errorf("read through an ExpiredToken: %d bytes, %v (kind %v), %d resumes; want the object after 1 resume", len(got), err, s3source.Classify(err), r.Resumes())
	}
	// A token the server does not know is still refused.
	srv.Faults.FailNext(1, "img/01.tar", http.StatusBadRequest, "InvalidToken")
	if _, err := src.Open(context.Background(), "img/01.tar", 0); !s3source.IsAccessDenied(err) {
		t.Errorf("InvalidToken: %v (kind %v), want access-denied", err, s3source.Classify(err))
	}
}
