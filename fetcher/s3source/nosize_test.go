package s3source_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// headWithoutLength is a fake gateway that answers HEAD without a
// Content-Length.
type headWithoutLength struct{ next http.RoundTripper }

func (h headWithoutLength) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := h.next.RoundTrip(r)
	if err == nil && r.Method == http.MethodHead {
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	return resp, err
}

// TestObjectWithoutSize: a listing entry without a size, or a HEAD
// answered without a Content-Length, says nothing of how long the object
// is. It is refused naming the key, instead of being taken for an empty
// object that the download then reads none of and the validation refuses
// as a truncated tarball.
func TestObjectWithoutSize(t *testing.T) {
	srv := s3test.NewServer(t)
	page := strings.Replace(string(listing("img/", "", listed{"img/01.tar", 1})), "<Size>1</Size>", "", 1)
	srv.Faults.Answer(1, "", func(int) []byte { return []byte(page) })
	src := hostileSource(t, srv, s3source.Config{})
	objs, err := src.ResolveImage(context.Background(), "img/")
	if !errors.Is(err, s3source.ErrNoSize) || objs != nil || !strings.Contains(err.Error(), "img/01.tar") || s3source.Classify(err) != s3source.KindInvalid {
		t.Errorf("listing without a size: %+v, %v (kind %v); want %v naming the key", objs, err, s3source.Classify(err), s3source.ErrNoSize)
	}

	srv.Put(t, "img/01.tar", payload(1000))
	src = hostileSource(t, srv, s3source.Config{HTTPClient: &http.Client{Transport: headWithoutLength{http.DefaultTransport}}})
	objs, err = src.ResolveImage(context.Background(), "img/01.tar")
	if !errors.Is(err, s3source.ErrNoSize) || objs != nil || s3source.Classify(err) != s3source.KindInvalid {
		t.Errorf("HEAD without a Content-Length: %+v, %v (kind %v); want %v", objs, err, s3source.Classify(err), s3source.ErrNoSize)
	}
}
