package s3source_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

func newSource(t *testing.T, srv *s3test.Server, timeout time.Duration) *s3source.Source {
	t.Helper()
	var cfg s3source.Config
	if timeout > 0 {
		cfg.HTTPClient = &http.Client{Timeout: timeout}
	}
	return hostileSource(t, srv, cfg)
}

// readWhole reads obj through src, reopening a failed body at most
// maxResumes times, and fails the test unless what it reads is data. It
// returns the closed reader, for its count of resumes.
func readWhole(t testing.TB, src *s3source.Source, obj s3source.Object, maxResumes int, data []byte) s3source.Reader {
	t.Helper()
	r := src.NewReader(context.Background(), obj, maxResumes)
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v (kind %v); want the %d-byte object", len(got), err, s3source.Classify(err), len(data))
	}
	return r
}

// envCredentials gives the SDK's default chain static credentials in the
// environment, and no configuration or credentials file to find others in.
func envCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
}

func payload(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, uint64(n)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestValidateKey(t *testing.T) {
	ok := []string{"images/debian/1.tar", "a", "images/", "x/./y.tar", "dots..in..names.tar", strings.Repeat("k", 1024)}
	for _, k := range ok {
		if err := s3source.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%.40q): %v", k, err)
		}
	}
	bad := []struct {
		key  string
		rule error
	}{
		{"", s3source.ErrKeyEmpty},
		{strings.Repeat("k", 1025), s3source.ErrKeyTooLong},
		{"/images/a.tar", s3source.ErrKeyAbsolute},
		{"images/../secret.tar", s3source.ErrKeyTraversal},
		{"..", s3source.ErrKeyTraversal},
		{"images/..", s3source.ErrKeyTraversal},
		{"a\x00b.tar", s3source.ErrKeyNUL},
		{"bad\xffutf8.tar", s3source.ErrKeyUTF8},
	}
	for _, c := range bad {
		err := s3source.ValidateKey(c.key)
		var ke *s3source.KeyError
		if !errors.Is(err, c.rule) || !errors.As(err, &ke) {
			t.Errorf("ValidateKey(%.40q) = %v, want %v", c.key, err, c.rule)
			continue
		}
		if !strings.Contains(err.Error(), c.rule.Error()) || s3source.Classify(err) != s3source.KindInvalid {
			t.Errorf("ValidateKey(%.40q): message %q / kind %v", c.key, err, s3source.Classify(err))
		}
	}
}

func TestListAndResolve(t *testing.T) {
	srv := s3test.NewServer(t)
	for _, k := range []string{"images/debian/02.tar.gz", "images/debian/01.tar", "images/debian/10.tar.zst",
		"images/debian/README", "images/debian/11.tar.bz2", "images/debian/12.tgz", "images/debian/sub/99.tar", "images/debian-slim/01.tar", "single.tar"} {
		srv.Put(t, k, []byte("content of "+k))
	}
	src := newSource(t, srv, 0)
	ctx := context.Background()

	objs, err := src.List(ctx, "images/debian/")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key)
		if want := int64(len("content of " + o.Key)); o.Size != want || o.ETag == "" {
			t.Errorf("%s: size %d etag %q, want size %d and an etag", o.Key, o.Size, o.ETag, want)
		}
	}
	if want := "images/debian/01.tar images/debian/02.tar.gz images/debian/10.tar.zst"; strings.Join(keys, " ") != want {
		t.Errorf("List = %v, want %s (only .tar, .tar.gz and .tar.zst objects directly under the prefix, in key order)", keys, want)
	}

	for _, name := range []string{"images/debian", "images/debian/"} {
		layers, err := src.ResolveImage(ctx, name)
		if err != nil || len(layers) != 3 || layers[0].Key != "images/debian/01.tar" {
			t.Errorf("ResolveImage(%q) = %v, %v; want the 3 layers of images/debian/", name, layers, err)
		}
	}
	one, err := src.ResolveImage(ctx, "single.tar")
	if err != nil || len(one) != 1 || one[0].Size != int64(len("content of single.tar")) {
		t.Errorf("ResolveImage(single.tar) = %v, %v", one, err)
	}
	if one, err := src.ResolveImage(ctx, "images/debian/02.tar.gz"); err != nil || len(one) != 1 || one[0].Key != "images/debian/02.tar.gz" {
		t.Errorf("ResolveImage(images/debian/02.tar.gz) = %v, %v; want the one object", one, err)
	}
	if _, err := src.ResolveImage(ctx, "images/none/"); !s3source.IsNotFound(err) {
		t.Errorf("ResolveImage of an empty prefix: %v (kind %v), want not-found", err, s3source.Classify(err))
	}
	if _, err := src.ResolveImage(ctx, "missing.tar"); !s3source.IsNotFound(err) {
		t.Errorf("ResolveImage of a missing key: %v (kind %v), want not-found", err, s3source.Classify(err))
	}
	if _, err := src.ResolveImage(ctx, "../etc/passwd.tar"); s3source.Classify(err) != s3source.KindInvalid {
		t.Errorf("ResolveImage of a traversal key: %v, want invalid", err)
	}
}

// readAllResuming reads key completely, resuming with a ranged GET (and
// If-Match on the first ETag) after each failure; it returns the bytes and
// how many opens it took.
func readAllResuming(t *testing.T, src *s3source.Source, key string, maxOpens int) ([]byte, int) {
	t.Helper()
	var out bytes.Buffer
	var etag string
	for opens := 1; opens <= maxOpens; opens++ {
		var opts []s3source.OpenOption
		if etag != "" {
			opts = append(opts, s3source.IfMatch(etag))
		}
		b, err := src.Open(context.Background(), key, int64(out.Len()), opts...)
		if err != nil {
			if s3source.IsRetryable(err) {
				continue
			}
			t.Fatalf("open %s at %d: %v (kind %v)", key, out.Len(), err, s3source.Classify(err))
		}
		if b.Offset != int64(out.Len()) {
			t.Fatalf("body offset %d, want %d", b.Offset, out.Len())
		}
		etag = b.ETag
		_, err = io.Copy(&out, b)
		b.Close()
		if err == nil && int64(out.Len()) == b.Size {
			return out.Bytes(), opens
		}
		if err == nil {
			err = io.ErrUnexpectedEOF // a clean EOF before the declared size
		}
		if !s3source.IsRetryable(err) {
			t.Fatalf("read %s: %v (kind %v), want retryable", key, err, s3source.Classify(err))
		}
	}
	t.Fatalf("read %s: not done after %d opens", key, maxOpens)
	return nil, 0
}

func TestRangedResumeAfterMidBodyDrop(t *testing.T) {
	srv := s3test.NewServer(t)
	data := payload(3<<20 + 123)
	srv.Put(t, "img/01.tar", data)
	src := newSource(t, srv, 0)

	srv.Faults.DropAfter(2, "img/01.tar", 1<<20) // two connections cut at 1 MiB into their body
	got, opens := readAllResuming(t, src, "img/01.tar", 5)
	if !bytes.Equal(got, data) {
		t.Fatalf("resumed download differs from the object (%d vs %d bytes)", len(got), len(data))
	}
	if opens != 3 {
		t.Errorf("took %d opens, want 3 (two drops, then the rest)", opens)
	}
	if n := srv.Requests(http.MethodGet, "img/01.tar"); n != 3 {
		t.Errorf("server saw %d GETs, want 3", n)
	}
}

func TestTruncatedObjectIsRetryable(t *testing.T) {
	srv := s3test.NewServer(t)
	data := payload(200_000)
	srv.Put(t, "t.tar", data)
	src := newSource(t, srv, 0)
	srv.Faults.Truncate(1, "t.tar", 50_000)
	got, opens := readAllResuming(t, src, "t.tar", 3)
	if !bytes.Equal(got, data) || opens != 2 {
		t.Errorf("got %d bytes in %d opens; want the object in 2", len(got), opens)
	}
}

func TestChangedObjectDuringResume(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "c.tar", payload(1000))
	src := newSource(t, srv, 0)
	b, err := src.Open(context.Background(), "c.tar", 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	srv.Put(t, "c.tar", payload(1001)) // a new version between two attempts
	_, err = src.Open(context.Background(), "c.tar", 500, s3source.IfMatch(b.ETag))
	if k := s3source.Classify(err); k != s3source.KindChanged {
		t.Errorf("resume with a stale ETag: %v (kind %v), want changed", err, k)
	}
}

func TestClassifyServerErrors(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "k.tar", []byte("x"))
	src := newSource(t, srv, 0)
	ctx := context.Background()

	if _, err := src.Open(ctx, "absent.tar", 0); !s3source.IsNotFound(err) {
		t.Errorf("404: %v (kind %v), want not-found", err, s3source.Classify(err))
	}
	if _, err := src.Stat(ctx, "absent.tar"); !s3source.IsNotFound(err) {
		t.Errorf("HEAD 404: %v (kind %v), want not-found", err, s3source.Classify(err))
	}
	srv.Faults.FailNext(1, "k.tar", 403, "AccessDenied")
	if _, err := src.Open(ctx, "k.tar", 0); !s3source.IsAccessDenied(err) {
		t.Errorf("403: %v (kind %v), want access-denied", err, s3source.Classify(err))
	}
	srv.Faults.FailNext(1, "k.tar", 403, "AccessDenied")
	if _, err := src.Stat(ctx, "k.tar"); !s3source.IsAccessDenied(err) {
		t.Errorf("HEAD 403 (no body): %v (kind %v), want access-denied", err, s3source.Classify(err))
	}
	srv.Faults.FailNext(1, "", 403, "AccessDenied")
	if _, err := src.List(ctx, "img/"); !s3source.IsAccessDenied(err) {
		t.Errorf("list 403: %v (kind %v), want access-denied", err, s3source.Classify(err))
	}

	// 503s: each attempt fails retryable (the SDK does not retry: one
	// request per call), then the object comes through.
	srv.Faults.Reset()
	srv.Faults.Fail503(2, "k.tar")
	for i := range 2 {
		if _, err := src.Open(ctx, "k.tar", 0); !s3source.IsRetryable(err) {
			t.Errorf("503 #%d: %v (kind %v), want retryable", i+1, err, s3source.Classify(err))
		}
	}
	b, err := src.Open(ctx, "k.tar", 0)
	if err != nil {
		t.Fatalf("after the 503s: %v", err)
	}
	b.Close()
	if n := srv.Requests(http.MethodGet, "k.tar"); n != 3 {
		t.Errorf("server saw %d GETs for 2 failures and a success, want 3 (no hidden SDK retries)", n)
	}
	srv.Faults.FailNext(1, "k.tar", 503, "SlowDown")
	if _, err := src.Open(ctx, "k.tar", 0); !s3source.IsRetryable(err) {
		t.Errorf("SlowDown: %v (kind %v), want retryable", err, s3source.Classify(err))
	}
}

func TestSlowServerTimesOutRetryable(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "slow.tar", []byte("x"))
	src := newSource(t, srv, 0)
	srv.Faults.Delay(1, "slow.tar", time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := src.Open(ctx, "slow.tar", 0)
	if err == nil || !s3source.IsRetryable(err) {
		t.Fatalf("server slower than the deadline: %v (kind %v), want retryable", err, s3source.Classify(err))
	}
	// Canceled by the caller is not a retry.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := src.Open(ctx, "slow.tar", 0); s3source.Classify(err) != s3source.KindCanceled {
		t.Errorf("canceled: %v (kind %v), want canceled", err, s3source.Classify(err))
	}
}

func TestNoRequestCountingAndAnonymous(t *testing.T) {
	srv := s3test.NewServer(t)
	src := newSource(t, srv, 0) // making a source contacts nothing
	if n := srv.TotalRequests(); n != 0 {
		t.Errorf("%d requests before any call, want 0", n)
	}
	if _, err := src.List(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	if n, s := srv.TotalRequests(), srv.Faults.Signed(); n != 1 || s != 0 {
		t.Errorf("anonymous listing: %d requests, %d signed; want 1 unsigned", n, s)
	}
}

func TestResumingReader(t *testing.T) {
	srv := s3test.NewServer(t)
	data := payload(2<<20 + 7)
	srv.Put(t, "r.tar", data)
	src := newSource(t, srv, 0)
	ctx := context.Background()
	obj, err := src.Stat(ctx, "r.tar")
	if err != nil {
		t.Fatal(err)
	}

	// Faults within the budget, one per request (status faults first): a 503,
	// a truncated body, a dropped connection; the fourth GET completes.
	srv.Faults.Truncate(1, "r.tar", 10)
	srv.Faults.Fail503(1, "r.tar")
	srv.Faults.DropAfter(1, "r.tar", 700_000)
	r := src.NewReader(ctx, obj, 5)
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, err %v; want the %d-byte object", len(got), err, len(data))
	}
	if r.Resumes() != 3 || srv.Requests(http.MethodGet, "r.tar") != 4 {
		t.Errorf("resumes %d, GETs %d; want 3 and 4", r.Resumes(), srv.Requests(http.MethodGet, "r.tar"))
	}

	// More failures than allowed: a retryable error, nothing hidden.
	srv.Faults.Reset()
	srv.Faults.DropAfter(3, "r.tar", 1000)
	r = src.NewReader(ctx, obj, 2)
	_, err = io.Copy(io.Discard, r)
	if err == nil || !s3source.IsRetryable(err) || r.Resumes() != 2 {
		t.Errorf("3 drops with 2 resumes allowed: %v (kind %v), resumes %d", err, s3source.Classify(err), r.Resumes())
	}

	// A 404 is not resumed.
	r = src.NewReader(ctx, s3source.Object{Key: "gone.tar", Size: 10}, 5)
	if _, err := io.Copy(io.Discard, r); !s3source.IsNotFound(err) || r.Resumes() != 0 {
		t.Errorf("missing object: %v, resumes %d; want not-found without resuming", err, r.Resumes())
	}

	// The object replaced between two attempts: not spliced.
	srv.Faults.Reset()
	srv.Faults.DropAfter(1, "r.tar", 1000)
	r = src.NewReader(ctx, obj, 5)
	buf := make([]byte, 500)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatal(err)
	}
	srv.Put(t, "r.tar", payload(2<<20+7+1))
	_, err = io.Copy(io.Discard, r)
	if s3source.Classify(err) != s3source.KindChanged {
		t.Errorf("object replaced mid-read: %v (kind %v), want changed", err, s3source.Classify(err))
	}
}

// TestDefaultCredentialChain: without Anonymous, requests are signed with
// what the SDK's default chain finds (here the environment), and an empty
// region falls back to us-east-1.
func TestDefaultCredentialChain(t *testing.T) {
	envCredentials(t)
	t.Setenv("AWS_REGION", "")
	srv := s3test.NewServer(t)
	srv.Put(t, "p/1.tar", []byte("x"))
	src, err := s3source.New(context.Background(), s3source.Config{Bucket: srv.Bucket, Endpoint: srv.URL, PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := src.List(context.Background(), "p/")
	if err != nil || len(objs) != 1 {
		t.Fatalf("List with environment credentials: %v, %v", objs, err)
	}
	if srv.Faults.Signed() != 1 {
		t.Errorf("%d signed requests, want the listing signed", srv.Faults.Signed())
	}
	if _, err := s3source.New(context.Background(), s3source.Config{}); err == nil {
		t.Error("New without a bucket succeeded")
	}
}
