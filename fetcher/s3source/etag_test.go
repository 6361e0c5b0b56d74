package s3source_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// fakeETagServer is a transport in front of the fake S3 that rewrites its
// ETags as some S3-compatible servers and proxies write them.
type fakeETagServer struct {
	next http.RoundTripper
	// unquoteList writes the ETags of ListObjectsV2 without their quotes,
	// while GET and HEAD keep them (NetApp ONTAP, some Ceph releases).
	unquoteList bool
	// ignoreIfMatch drops If-Match before the fake sees it: a server that
	// ignores the precondition and answers with whatever version it has.
	ignoreIfMatch bool
	// answerETag rewrites the ETag header of GET and HEAD answers (a proxy
	// that weakens it or drops it).
	answerETag func(string) string
}

var quotedListETag = regexp.MustCompile(`<ETag>(?:&#34;|&quot;|")([^<&"]*)(?:&#34;|&quot;|")</ETag>`)

func (f *fakeETagServer) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.ignoreIfMatch && r.Header.Get("If-Match") != "" {
		r = r.Clone(r.Context())
		r.Header.Del("If-Match")
	}
	resp, err := f.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	list := r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "2"
	if f.answerETag != nil && !list && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		if e := f.answerETag(resp.Header.Get("ETag")); e != "" {
			resp.Header.Set("ETag", e)
		} else {
			resp.Header.Del("ETag")
		}
	}
	if !f.unquoteList || !list {
		return resp, nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	body = quotedListETag.ReplaceAll(body, []byte("<ETag>$1</ETag>"))
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	return resp, nil
}

// etagSource is a source on srv through fake, reading objects larger than
// one part as ranged parts, two at a time.
func etagSource(t *testing.T, srv *s3test.Server, fake *fakeETagServer) *s3source.Source {
	t.Helper()
	fake.next = http.DefaultTransport
	return hostileSource(t, srv, s3source.Config{HTTPClient: &http.Client{Transport: fake},
		PartSize: conf.Size(part), ConnectionsPerObject: 2})
}

// listOne lists prefix and returns its object key.
func listOne(t *testing.T, src *s3source.Source, prefix, key string) s3source.Object {
	t.Helper()
	objs, err := src.List(context.Background(), prefix)
	if err != nil {
		t.Fatalf("list %s: %v", prefix, err)
	}
	for _, o := range objs {
		if o.Key == key {
			return o
		}
	}
	t.Fatalf("list %s: no %s in %v", prefix, key, objs)
	return s3source.Object{}
}

// TestUnquotedListETagsKeepTheRecordedForm: a server listing ETags
// unquoted gives the same ETag as a standard server's listing and HEAD,
// in the quoted form S3 uses, so what the pipeline recorded from a
// standard server still matches.
func TestUnquotedListETagsKeepTheRecordedForm(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/1.tar", payload(1000))
	standard := listOne(t, newSource(t, srv, 0), "img/", "img/1.tar")
	if !strings.HasPrefix(standard.ETag, `"`) || !strings.HasSuffix(standard.ETag, `"`) || len(standard.ETag) < 3 {
		t.Fatalf("standard listing ETag %s, want S3's quoted form", standard.ETag)
	}
	src := etagSource(t, srv, &fakeETagServer{unquoteList: true})
	if got := listOne(t, src, "img/", "img/1.tar"); got.ETag != standard.ETag {
		t.Errorf("unquoted listing gives ETag %s, a standard one %s: a recorded ETag would no longer match", got.ETag, standard.ETag)
	}
	head, err := src.Stat(context.Background(), "img/1.tar")
	if err != nil || head.ETag != standard.ETag {
		t.Errorf("HEAD ETag %s (%v), listing %s", head.ETag, err, standard.ETag)
	}
}

// TestUnquotedListETagsDownload: an object listed with an unquoted ETag
// downloads, as one GET and as ranged parts, every request carrying
// If-Match in the quoted form S3 compares strictly.
func TestUnquotedListETagsDownload(t *testing.T) {
	srv := s3test.NewServer(t)
	src := etagSource(t, srv, &fakeETagServer{unquoteList: true})
	for _, c := range []struct {
		key    string
		size   int
		ranged bool
	}{{"img/small.tar", part / 2, false}, {"img/large.tar", 3*part + 17, true}} {
		data := payload(c.size)
		srv.Put(t, c.key, data)
		obj := listOne(t, src, "img/", c.key)
		if src.Ranged(obj) != c.ranged {
			t.Fatalf("%s: ranged %t, want %t", c.key, src.Ranged(obj), c.ranged)
		}
		srv.Faults.Reset()
		r := src.NewReader(context.Background(), obj, 0)
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Errorf("%s (ranged %t) listed with ETag %s: %v", c.key, c.ranged, obj.ETag, err)
			continue
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: read %d bytes, not the object's %d", c.key, len(got), len(data))
		}
		reqs := gets(srv, c.key)
		if want := map[bool]int{false: 1, true: 4}[c.ranged]; len(reqs) != want {
			t.Errorf("%s: %d GETs, want %d", c.key, len(reqs), want)
		}
		for _, q := range reqs {
			if q.IfMatch != obj.ETag || !strings.HasPrefix(q.IfMatch, `"`) {
				t.Errorf("%s: GET %q with If-Match %s, want the quoted %s", c.key, q.Range, q.IfMatch, obj.ETag)
			}
		}
	}
}

// TestUnquotedListETagsOverwriteDetected: an object overwritten between
// the unquoted listing and the GET fails the read as changed, whether the
// server refuses If-Match (412) or ignores it and the answer's ETag
// differs, for a single GET and for ranged parts.
func TestUnquotedListETagsOverwriteDetected(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		for _, size := range []int{part / 2, 3 * part} {
			t.Run(fmt.Sprintf("ignoreIfMatch=%t/size=%d", ignore, size), func(t *testing.T) {
				srv := s3test.NewServer(t)
				src := etagSource(t, srv, &fakeETagServer{unquoteList: true, ignoreIfMatch: ignore})
				srv.Put(t, "img/1.tar", payload(size))
				obj := listOne(t, src, "img/", "img/1.tar")
				srv.Put(t, "img/1.tar", bytes.Repeat([]byte{0x5a}, size))
				r := src.NewReader(context.Background(), obj, 3)
				_, err := io.ReadAll(r)
				r.Close()
				if !errors.Is(err, s3source.ErrChanged) || s3source.Classify(err) != s3source.KindChanged {
					t.Fatalf("object overwritten after the listing: %v (kind %v), want %v", err, s3source.Classify(err), s3source.ErrChanged)
				}
				if r.Resumes() != 0 {
					t.Errorf("resumes %d: a changed object must not be resumed", r.Resumes())
				}
			})
		}
	}
}

// TestUnusableAnswerETags: a GET answered with a weak ETag or with none,
// and a HEAD answered with a weak one, fail with their own rule, naming
// the object, instead of calling an unchanged object changed.
func TestUnusableAnswerETags(t *testing.T) {
	weak := func(e string) string { return "W/" + e }
	none := func(string) string { return "" }
	for _, c := range []struct {
		name   string
		answer func(string) string
		size   int
		rule   error
	}{
		{"weak/single", weak, part / 2, s3source.ErrWeakETag},
		{"weak/ranged", weak, 3 * part, s3source.ErrWeakETag},
		{"none/single", none, part / 2, s3source.ErrNoETag},
		{"none/ranged", none, 3 * part, s3source.ErrNoETag},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := s3test.NewServer(t)
			src := etagSource(t, srv, &fakeETagServer{answerETag: c.answer})
			srv.Put(t, "img/1.tar", payload(c.size))
			obj := listOne(t, src, "img/", "img/1.tar")
			r := src.NewReader(context.Background(), obj, 3)
			_, err := io.ReadAll(r)
			r.Close()
			if !errors.Is(err, c.rule) || errors.Is(err, s3source.ErrChanged) || s3source.Classify(err) != s3source.KindInvalid {
				t.Fatalf("read: %v (kind %v), want %v, invalid, not changed", err, s3source.Classify(err), c.rule)
			}
			if !strings.Contains(err.Error(), "s3://"+srv.Bucket+"/img/1.tar") {
				t.Errorf("error %q does not name the object", err)
			}
		})
	}
	srv := s3test.NewServer(t)
	src := etagSource(t, srv, &fakeETagServer{answerETag: weak})
	srv.Put(t, "img/1.tar", payload(10))
	_, err := src.Stat(context.Background(), "img/1.tar")
	if !errors.Is(err, s3source.ErrWeakETag) || !strings.Contains(err.Error(), "img/1.tar") {
		t.Errorf("HEAD with a weak ETag: %v, want %v naming the object", err, s3source.ErrWeakETag)
	}
}
