package s3source_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// hostileSource is a source on srv, anonymous and path-style, with cfg's
// other settings (short deadlines, as a test can afford to wait for, a
// fake in front of the server). The SDK adds a CA bundle named in the
// environment only to a client of its own making and refuses the caller's
// with one, so a cfg with an HTTP client of the test's own is made with
// AWS_CA_BUNDLE cleared.
func hostileSource(t testing.TB, srv *s3test.Server, cfg s3source.Config) *s3source.Source {
	t.Helper()
	if cfg.HTTPClient != nil {
		t.Setenv("AWS_CA_BUNDLE", "")
	}
	cfg.Bucket, cfg.Region, cfg.Endpoint, cfg.PathStyle, cfg.Anonymous = srv.Bucket, "us-east-1", srv.URL, true, true
	src, err := s3source.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

type listed struct {
	key  string
	size int64
}

// listing is a ListObjectsV2 answer of objs under prefix, truncated with
// token when token is not empty.
func listing(prefix, token string, objs ...listed) []byte {
	var b bytes.Buffer
	esc := func(s string) string {
		var e bytes.Buffer
		xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>%s</Name><Prefix>%s</Prefix><Delimiter>/</Delimiter><MaxKeys>1000</MaxKeys><KeyCount>%d</KeyCount><IsTruncated>%t</IsTruncated>`,
		s3test.DefaultBucket, esc(prefix), len(objs), token != "")
	if token != "" {
		fmt.Fprintf(&b, `<NextContinuationToken>%s</NextContinuationToken>`, esc(token))
	}
	for _, o := range objs {
		fmt.Fprintf(&b, `<Contents><Key>%s</Key><Size>%d</Size><ETag>"e"</ETag><LastModified>2024-01-01T00:00:00.000Z</LastModified><StorageClass>STANDARD</StorageClass></Contents>`, esc(o.key), o.size)
	}
	b.WriteString(`</ListBucketResult>`)
	return b.Bytes()
}

// within fails the test if fn takes longer than d, and returns its error.
func within[T any](t *testing.T, d time.Duration, fn func() (T, error)) (T, error) {
	t.Helper()
	t0 := time.Now()
	v, err := fn()
	if took := time.Since(t0); took > d {
		t.Errorf("took %v, deadline %v", took, d)
	}
	return v, err
}

// TestListRepeatingToken: a server that answers "truncated" with the
// continuation token it already gave is left after the second page.
func TestListRepeatingToken(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Faults.Answer(1000, "", func(i int) []byte { return listing("img/", "same", listed{fmt.Sprintf("img/%02d.tar", i), 10}) })
	src := hostileSource(t, srv, s3source.Config{})
	objs, err := within(t, 5*time.Second, func() ([]s3source.Object, error) { return src.ResolveImage(context.Background(), "img/") })
	if !errors.Is(err, s3source.ErrListLoop) || objs != nil {
		t.Fatalf("ResolveImage: %v, %d objects; want %v", err, len(objs), s3source.ErrListLoop)
	}
	if !strings.Contains(err.Error(), `"same"`) || s3source.Classify(err) != s3source.KindInvalid {
		t.Errorf("error %q, kind %v", err, s3source.Classify(err))
	}
	if n := srv.Requests("GET", ""); n != 2 {
		t.Errorf("%d listing requests, want 2", n)
	}
}

// TestListEndlessPages: a server that keeps answering "truncated" with new
// tokens is left at the page cap.
func TestListEndlessPages(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Faults.Answer(1000, "", func(i int) []byte {
		return listing("img/", fmt.Sprintf("t%d", i), listed{fmt.Sprintf("img/%04d.txt", i), 10})
	})
	src := hostileSource(t, srv, s3source.Config{MaxListPages: 7})
	_, err := within(t, 5*time.Second, func() ([]s3source.Object, error) { return src.List(context.Background(), "img/") })
	if !errors.Is(err, s3source.ErrListTooLong) || !strings.Contains(err.Error(), "more than 7") {
		t.Fatalf("List: %v; want %v", err, s3source.ErrListTooLong)
	}
	if n := srv.Requests("GET", ""); n != 7 {
		t.Errorf("%d listing requests, want 7", n)
	}
}

// TestListHostileKeys: keys a listing makes up outside the prefix, with
// characters that would rewrite a terminal, or with a negative size are
// refused naming the key escaped.
func TestListHostileKeys(t *testing.T) {
	for _, c := range []struct {
		name string
		obj  listed
		rule error
	}{
		{"outside the prefix", listed{"other/01.tar", 10}, s3source.ErrKeyOutsidePrefix},
		{"climbing out", listed{"img/../secret/01.tar", 10}, s3source.ErrKeyTraversal},
		{"right-to-left override", listed{"img/\u202erat.exe.tar", 10}, s3source.ErrKeyControl},
		{"C1 control sequence introducer", listed{"img/\u009b31mred.tar", 10}, s3source.ErrKeyControl},
		{"DEL", listed{"img/a\x7f.tar", 10}, s3source.ErrKeyControl},
		{"negative size", listed{"img/01.tar", -5}, s3source.ErrNegativeSize},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := s3test.NewServer(t)
			srv.Faults.Answer(1, "", func(int) []byte { return listing("img/", "", listed{"img/00.tar", 1}, c.obj) })
			src := hostileSource(t, srv, s3source.Config{})
			objs, err := within(t, 5*time.Second, func() ([]s3source.Object, error) { return src.ResolveImage(context.Background(), "img") })
			var ke *s3source.KeyError
			if !errors.Is(err, c.rule) || !errors.As(err, &ke) || objs != nil {
				t.Fatalf("ResolveImage: %v; want %v", err, c.rule)
			}
			msg := err.Error()
			if strings.ContainsFunc(msg, func(r rune) bool { return r < 0x20 || (r >= 0x7f && r < 0xa0) || r == '\u202e' }) {
				t.Errorf("message carries the key unescaped: %q", msg)
			}
			if !strings.Contains(msg, c.rule.Error()) || s3source.Classify(err) != s3source.KindInvalid {
				t.Errorf("message %q, kind %v", msg, s3source.Classify(err))
			}
		})
	}
}

// TestHeadersNeverAnswered: a server that accepts the request and never
// answers is left after the response-header timeout, for a listing and a
// HEAD alike.
func TestHeadersNeverAnswered(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/01.tar", []byte("layer"))
	srv.Faults.Delay(100, "", time.Hour)
	srv.Faults.Delay(100, "img/01.tar", time.Hour)
	src := hostileSource(t, srv, s3source.Config{ResponseHeaderTimeout: conf.D(300 * time.Millisecond), IdleTimeout: conf.D(300 * time.Millisecond)})
	for _, what := range []string{"img/", "img/01.tar"} {
		objs, err := within(t, 3*time.Second, func() ([]s3source.Object, error) { return src.ResolveImage(context.Background(), what) })
		if err == nil || objs != nil || !s3source.IsRetryable(err) || !strings.Contains(err.Error(), "timeout") {
			t.Errorf("ResolveImage(%s): %v, %d objects; want a retryable timeout", what, err, len(objs))
		}
	}
	_, err := within(t, 3*time.Second, func() (*s3source.Body, error) { return src.Open(context.Background(), "img/01.tar", 0) })
	if err == nil || !s3source.IsRetryable(err) {
		t.Errorf("Open: %v; want a retryable timeout", err)
	}
}

// TestStallMidBody: a body that stops coming ends the read after the idle
// timeout with ErrTimeout, the bytes before it delivered.
func TestStallMidBody(t *testing.T) {
	srv := s3test.NewServer(t)
	data := payload(1 << 20)
	srv.Put(t, "img/01.tar", data)
	srv.Faults.StallAfter(1, "img/01.tar", 64<<10)
	src := hostileSource(t, srv, s3source.Config{IdleTimeout: conf.D(300 * time.Millisecond)})
	b, err := src.Open(context.Background(), "img/01.tar", 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := within(t, 3*time.Second, func() ([]byte, error) { return io.ReadAll(b) })
	b.Close()
	if !errors.Is(err, s3source.ErrTimeout) || !s3source.IsRetryable(err) || !strings.Contains(err.Error(), "img/01.tar") {
		t.Fatalf("read: %v; want %v naming the key", err, s3source.ErrTimeout)
	}
	if len(got) < 64<<10 || !bytes.Equal(got, data[:len(got)]) {
		t.Errorf("%d bytes before the stall, want at least %d, intact", len(got), 64<<10)
	}
	// The source is still usable: the next read gets everything.
	b, err = src.Open(context.Background(), "img/01.tar", int64(len(got)))
	if err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(b)
	b.Close()
	if err != nil || !bytes.Equal(append(got, rest...), data) {
		t.Errorf("resumed read: %v", err)
	}
}

// TestMaxLayers: an image prefix with more ".tar" objects than the limit
// (128 by default) is refused; the limit itself is fine.
func TestMaxLayers(t *testing.T) {
	srv := s3test.NewServer(t)
	for i := range s3source.DefaultMaxLayers + 1 {
		srv.Put(t, fmt.Sprintf("big/%03d.tar", i), []byte("l"))
		if i < s3source.DefaultMaxLayers {
			srv.Put(t, fmt.Sprintf("ok/%03d.tar", i), []byte("l"))
		}
	}
	src := hostileSource(t, srv, s3source.Config{})
	objs, err := src.ResolveImage(context.Background(), "big")
	if !errors.Is(err, s3source.ErrTooManyLayers) || objs != nil || !strings.Contains(err.Error(), "more than 128") {
		t.Fatalf("ResolveImage of 129 layers: %v; want %v", err, s3source.ErrTooManyLayers)
	}
	if objs, err := src.ResolveImage(context.Background(), "ok"); err != nil || len(objs) != s3source.DefaultMaxLayers {
		t.Fatalf("ResolveImage of 128 layers: %d, %v", len(objs), err)
	}
}
