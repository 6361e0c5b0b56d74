package s3source_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestListPageBounded: a listing page longer than any S3 sends (its keys
// not layers, so no layer limit applies) is refused once its body passes
// MaxListPageBytes, instead of being decoded into memory whole.
func TestListPageBounded(t *testing.T) {
	srv := s3test.NewServer(t)
	pad := strings.Repeat("x", 200)
	var objs []listed
	for i := range (s3source.MaxListPageBytes + 1<<20) / len(pad) {
		objs = append(objs, listed{fmt.Sprintf("img/%s%07d.txt", pad, i), 1})
	}
	page := listing("img/", "", objs...)
	srv.Faults.Answer(1, "", func(int) []byte { return page })
	src := hostileSource(t, srv, s3source.Config{})
	got, err := src.List(context.Background(), "img/")
	if !errors.Is(err, s3source.ErrListPageTooLarge) || got != nil {
		t.Fatalf("List of a %d-byte page: %d objects, %v; want %v", len(page), len(got), err, s3source.ErrListPageTooLarge)
	}
	if k := s3source.Classify(err); k != s3source.KindInvalid {
		t.Errorf("kind %v, want invalid", k)
	}
	// A page of the usual size is read.
	srv.Faults.Reset()
	small := listing("img/", "", listed{"img/01.tar", 1})
	srv.Faults.Answer(1, "", func(int) []byte { return small })
	if got, err := src.List(context.Background(), "img/"); err != nil || len(got) != 1 {
		t.Fatalf("List of a small page: %v, %v", got, err)
	}
}

// TestListPageEntriesBounded: a page of more entries than the 1,000 S3
// sends at most is refused, so that the keys a listing remembers across
// its pages (to refuse one listed twice) stay bounded by the page cap.
func TestListPageEntriesBounded(t *testing.T) {
	srv := s3test.NewServer(t)
	objs := make([]listed, 1001)
	for i := range objs {
		objs[i] = listed{fmt.Sprintf("img/%04d.txt", i), 1}
	}
	srv.Faults.Answer(1, "", func(int) []byte { return listing("img/", "", objs...) })
	src := hostileSource(t, srv, s3source.Config{})
	got, err := src.List(context.Background(), "img/")
	if !errors.Is(err, s3source.ErrListPageTooLarge) || got != nil || !strings.Contains(err.Error(), "1001 entries") {
		t.Fatalf("List of a page of 1001 entries: %d objects, %v; want %v naming the count", len(got), err, s3source.ErrListPageTooLarge)
	}
	// A full page of 1,000 is read.
	srv.Faults.Reset()
	srv.Faults.Answer(1, "", func(int) []byte { return listing("img/", "", objs[:1000]...) })
	if _, err := src.List(context.Background(), "img/"); err != nil {
		t.Fatalf("List of a page of 1000 entries: %v", err)
	}
}

// TestListTokenBounded: a continuation token longer than any S3 gives is
// refused at the page that gives it, instead of being sent back in the
// next request's URL and kept, with every token before it, to tell a loop.
func TestListTokenBounded(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Faults.Answer(1000, "", func(i int) []byte {
		return listing("img/", fmt.Sprintf("%d%s", i, strings.Repeat("t", 64<<10)), listed{fmt.Sprintf("img/%04d.txt", i), 1})
	})
	src := hostileSource(t, srv, s3source.Config{})
	_, err := src.List(context.Background(), "img/")
	if !errors.Is(err, s3source.ErrListTokenTooLong) || s3source.Classify(err) != s3source.KindInvalid {
		t.Fatalf("List with 64 KiB tokens: %v (kind %v); want %v", err, s3source.Classify(err), s3source.ErrListTokenTooLong)
	}
	if n := srv.Requests("GET", ""); n != 1 {
		t.Errorf("%d listing requests, want 1", n)
	}
}
