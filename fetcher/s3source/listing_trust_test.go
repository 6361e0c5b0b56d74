package s3source_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// noListedETags is a transport that drops the ETags of ListObjectsV2
// answers, as an S3-compatible server or gateway that lists none does;
// GET and HEAD keep theirs.
type noListedETags struct{ next http.RoundTripper }

var listedETag = regexp.MustCompile(`<ETag>[^<]*</ETag>`)

func (n noListedETags) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := n.next.RoundTrip(r)
	if err != nil || r.Method != http.MethodGet || r.URL.Query().Get("list-type") != "2" {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(listedETag.ReplaceAll(body, nil)))
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return resp, nil
}

// readOverwrittenMidway puts v1 at img/01.tar and lists it through src,
// which must list it without an ETag, then reads it through src (at most
// 3 resumes) with the first GET's body cut after 1000 bytes and the object
// overwritten with v2 before a GET of the rest. It returns the object as
// listed, the closed reader, what the read returned and its error.
func readOverwrittenMidway(t *testing.T, srv *s3test.Server, src *s3source.Source, v1, v2 []byte) (s3source.Object, s3source.Reader, []byte, error) {
	t.Helper()
	srv.Put(t, "img/01.tar", v1)
	objs, err := src.List(context.Background(), "img/")
	if err != nil || len(objs) != 1 || objs[0].ETag != "" {
		t.Fatalf("list: %+v, %v; want one object listed without an ETag", objs, err)
	}
	srv.Faults.Reset()
	srv.Faults.DropAfter(1, "img/01.tar", 1000)
	srv.Faults.BeforeGet("img/01.tar", "bytes=1000-", func() { srv.Put(t, "img/01.tar", v2) })
	r := src.NewReader(context.Background(), objs[0], 3)
	got, err := io.ReadAll(r)
	r.Close()
	return objs[0], r, got, err
}

// TestResumeHoldsToTheFirstAnswersETag: an object listed without an ETag
// is read as one stream. Its body is cut after 1000 bytes and the object
// overwritten with another of the same size before the resume: the
// resume carries the ETag the first answer gave, so the read fails as
// changed instead of returning v1's first bytes followed by v2's rest.
func TestResumeHoldsToTheFirstAnswersETag(t *testing.T) {
	srv := s3test.NewServer(t)
	src := hostileSource(t, srv, s3source.Config{HTTPClient: &http.Client{Transport: noListedETags{http.DefaultTransport}}})
	v1, v2 := bytes.Repeat([]byte("1"), 4000), bytes.Repeat([]byte("2"), 4000)
	_, _, got, err := readOverwrittenMidway(t, srv, src, v1, v2)
	if !errors.Is(err, s3source.ErrChanged) {
		t.Fatalf("read of an object overwritten between two GETs: %d bytes (%d of v1), %v; want ErrChanged", len(got), bytes.Count(got, []byte("1")), err)
	}
	for _, rq := range srv.Faults.Recorded() {
		if rq.Range == "bytes=1000-" && rq.IfMatch == "" {
			t.Errorf("the resume was sent without If-Match")
		}
	}
}

// TestListingDoesNotTrustTheServersShape: a server that ignores the
// listing's delimiter, or lists a key on two pages, cannot make a deeper
// key a layer or one layer two.
func TestListingDoesNotTrustTheServersShape(t *testing.T) {
	t.Run("deeper key", func(t *testing.T) {
		srv := s3test.NewServer(t)
		srv.Faults.Answer(10, "", func(int) []byte {
			return listing("img/", "", listed{"img/01.tar", 10}, listed{"img/old/02.tar", 10})
		})
		objs, err := hostileSource(t, srv, s3source.Config{}).ResolveImage(context.Background(), "img/")
		var keys []string
		for _, o := range objs {
			keys = append(keys, o.Key)
		}
		if err != nil || !slices.Equal(keys, []string{"img/01.tar"}) {
			t.Fatalf("image img/ resolved to %q, %v; want only img/01.tar (img/old/02.tar is below a deeper '/')", keys, err)
		}
	})
	t.Run("key listed twice", func(t *testing.T) {
		srv := s3test.NewServer(t)
		srv.Faults.Answer(10, "", func(i int) []byte {
			if i == 0 {
				return listing("img/", "t1", listed{"img/01.tar", 10})
			}
			return listing("img/", "", listed{"img/01.tar", 10})
		})
		objs, err := hostileSource(t, srv, s3source.Config{}).ResolveImage(context.Background(), "img/")
		var ke *s3source.KeyError
		if !errors.Is(err, s3source.ErrKeyListedTwice) || !errors.As(err, &ke) || ke.Key != "img/01.tar" {
			t.Fatalf("image listed with one key on two pages: %+v, %v; want ErrKeyListedTwice naming img/01.tar", objs, err)
		}
	})
}

// TestLongTimeoutsDoNotOverflow: s3.response_header_timeout and
// s3.idle_timeout are each valid when very long, and a listing, bounded
// by both, still works.
func TestLongTimeoutsDoNotOverflow(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/01.tar", []byte("layer"))
	huge := conf.D(2_000_000 * time.Hour)
	if _, err := hostileSource(t, srv, s3source.Config{ResponseHeaderTimeout: huge, IdleTimeout: huge}).List(context.Background(), "img/"); err != nil {
		t.Fatalf("a listing with two very long (valid) timeouts: %v", err)
	}
}

// TestErrorAnswersAreBounded: a GET answered with an error whose body
// stops coming is cut after s3.idle_timeout, not at the caller's
// deadline; one whose body is hundreds of MiB is not read whole into
// memory. Both fail as retryable, with the answer's status.
func TestErrorAnswersAreBounded(t *testing.T) {
	errorHead := `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>`
	t.Run("stalled", func(t *testing.T) {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/xml")
			w.Header().Set("Content-Length", "100000")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, errorHead)
			_ = http.NewResponseController(w).Flush()
			<-r.Context().Done()
		}))
		t.Cleanup(ts.Close)
		src, err := s3source.New(context.Background(), s3source.Config{Bucket: "images", Region: "us-east-1", Endpoint: ts.URL,
			PathStyle: true, Anonymous: true, IdleTimeout: conf.D(300 * time.Millisecond), ResponseHeaderTimeout: conf.D(300 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err = src.Open(ctx, "img/01.tar", 0)
		if err == nil || ctx.Err() != nil || s3source.Classify(err) != s3source.KindRetryable {
			t.Fatalf("Open of an object whose error body stalls: %v (the caller's deadline passed: %v); want a retryable error before it", err, ctx.Err() != nil)
		}
	})
	t.Run("huge", func(t *testing.T) {
		const size = 256 << 20
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/xml")
			w.Header().Set("Content-Length", strconv.Itoa(size))
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, errorHead)
			chunk := bytes.Repeat([]byte("x"), 1<<20)
			for left := size - len(errorHead); left > 0; left -= len(chunk) {
				if _, err := w.Write(chunk[:min(left, len(chunk))]); err != nil {
					return
				}
			}
		}))
		t.Cleanup(ts.Close)
		src, err := s3source.New(context.Background(), s3source.Config{Bucket: "images", Region: "us-east-1", Endpoint: ts.URL, PathStyle: true, Anonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err = src.Open(context.Background(), "img/01.tar", 0)
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Errorf("one GET's error answer made the process allocate %d MiB", grew>>20)
		}
		if err == nil || s3source.Classify(err) != s3source.KindRetryable {
			t.Errorf("Open answered 503 with a huge body: %v, want a retryable error", err)
		}
	})
}

// noContentRange drops the Content-Range header of 206 answers.
type noContentRange struct{ next http.RoundTripper }

func (n noContentRange) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := n.next.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusPartialContent {
		resp.Header.Del("Content-Range")
	}
	return resp, err
}

// TestPartialAnswerWithoutContentRange: a server that answers a ranged
// GET with 206 and no Content-Range fails the open naming that, rather
// than placing the bytes as if the whole object had come (and failing
// later as an object that changed).
func TestPartialAnswerWithoutContentRange(t *testing.T) {
	srv := s3test.NewServer(t)
	src := hostileSource(t, srv, s3source.Config{HTTPClient: &http.Client{Transport: noContentRange{http.DefaultTransport}}})
	srv.Put(t, "img/01.tar", bytes.Repeat([]byte("x"), 4000))
	_, err := src.Open(context.Background(), "img/01.tar", 1000)
	if !errors.Is(err, s3source.ErrNoContentRange) || s3source.Classify(err) != s3source.KindInvalid {
		t.Fatalf("ranged GET answered 206 without Content-Range: %v (kind %v), want ErrNoContentRange, invalid", err, s3source.Classify(err))
	}
}
