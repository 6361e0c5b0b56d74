package s3source_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// part is the part size of the ranged tests: the smallest allowed, so
// objects of several parts stay small.
const part = s3source.MinPartSize

// partedSource is a source on srv reading objects in parts of partSize,
// conns at a time.
func partedSource(t testing.TB, srv *s3test.Server, partSize int64, conns int) *s3source.Source {
	t.Helper()
	return hostileSource(t, srv, s3source.Config{PartSize: conf.Size(partSize), ConnectionsPerObject: conns})
}

// putAndStat stores data under key and returns the object as listed.
func putAndStat(t *testing.T, srv *s3test.Server, src *s3source.Source, key string, data []byte) s3source.Object {
	t.Helper()
	srv.Put(t, key, data)
	obj, err := src.Stat(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	srv.Faults.Reset() // the record starts after the HEAD
	return obj
}

// gets returns the GETs of key the server received.
func gets(srv *s3test.Server, key string) []s3test.Request {
	var out []s3test.Request
	for _, r := range srv.Faults.Recorded() {
		if r.Method == http.MethodGet && r.Key == key {
			out = append(out, r)
		}
	}
	return out
}

// rangeOf parses "bytes=start-end".
func rangeOf(t *testing.T, r s3test.Request) (start, end int64) {
	t.Helper()
	if _, err := fmt.Sscanf(r.Range, "bytes=%d-%d", &start, &end); err != nil {
		t.Fatalf("GET with Range %q, want bytes=start-end", r.Range)
	}
	return start, end
}

// TestRangedReaderSizes: objects of sizes around the part boundaries come
// back byte for byte; one larger than a part is fetched as one closed
// range per part, each carrying If-Match with the listed ETag, and one of
// at most a part as a single GET.
func TestRangedReaderSizes(t *testing.T) {
	srv := s3test.NewServer(t)
	src := partedSource(t, srv, part, 4)
	for _, size := range []int{0, 1, part - 1, part, part + 1, 3*part + 17, 9 * part} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			key := fmt.Sprintf("sizes/%d.tar", size)
			data := payload(size)
			obj := putAndStat(t, srv, src, key, data)
			readWhole(t, src, obj, 0, data)
			reqs := gets(srv, key)
			if size <= part {
				if want := min(size, 1); len(reqs) != want || (want == 1 && reqs[0].Range != "") {
					t.Errorf("object of at most one part: GETs %+v, want %d without Range", reqs, want)
				}
				return
			}
			parts := (size + part - 1) / part
			if len(reqs) != parts {
				t.Fatalf("%d GETs for %d parts: %+v", len(reqs), parts, reqs)
			}
			seen := map[int64]bool{}
			for _, q := range reqs {
				start, end := rangeOf(t, q)
				if start%part != 0 || end != min(start+part, int64(size))-1 || seen[start] {
					t.Errorf("GET of bytes %d-%d: not one whole part, or twice", start, end)
				}
				seen[start] = true
				if q.IfMatch != obj.ETag {
					t.Errorf("GET of bytes %d-%d carried If-Match %q, want %q", start, end, q.IfMatch, obj.ETag)
				}
			}
		})
	}
}

// TestRangedReaderOneStream: one connection per object, or an object
// without an ETag to hold its parts to, is read as one stream.
func TestRangedReaderOneStream(t *testing.T) {
	srv := s3test.NewServer(t)
	data := payload(3*part + 5)
	for _, c := range []struct {
		name  string
		conns int
		etag  bool
	}{{"one connection", 1, true}, {"no etag", 4, false}} {
		t.Run(c.name, func(t *testing.T) {
			src := partedSource(t, srv, part, c.conns)
			obj := putAndStat(t, srv, src, "one.tar", data)
			if !c.etag {
				obj.ETag = ""
			}
			readWhole(t, src, obj, 0, data)
			if reqs := gets(srv, "one.tar"); len(reqs) != 1 || reqs[0].Range != "" {
				t.Errorf("GETs %+v, want one without Range", reqs)
			}
		})
	}
}

// TestRangedReaderResumesCutParts: a part whose connection is reset half
// way, and one whose body ends short, are each reopened from the byte they
// reached (with If-Match again), and the object comes back whole.
func TestRangedReaderResumesCutParts(t *testing.T) {
	srv := s3test.NewServer(t)
	src := partedSource(t, srv, part, 4)
	data := payload(5*part + 3)
	obj := putAndStat(t, srv, src, "cut.tar", data)
	srv.Faults.DropAfter(1, "cut.tar", part/2)
	srv.Faults.Truncate(1, "cut.tar", part/3)

	r := readWhole(t, src, obj, 5, data)
	if r.Resumes() != 2 {
		t.Errorf("resumes %d, want 2 (a reset and a short body)", r.Resumes())
	}
	reqs := gets(srv, "cut.tar")
	if len(reqs) != 6+2 {
		t.Errorf("%d GETs, want 8 (6 parts, 2 resumed)", len(reqs))
	}
	// The short body is resumed exactly where it ended; the reset one
	// where the client's last byte was (a reset may discard what the
	// client had not read yet: at most where the server cut it). Either
	// cut may hit the other's resumed request, so each resumed GET is
	// measured from the GET of its part before it.
	last := map[int64]int64{} // part -> start of its latest GET
	var advances []int64
	for _, q := range reqs {
		start, end := rangeOf(t, q)
		if q.IfMatch != obj.ETag {
			t.Errorf("GET of bytes %d-%d carried If-Match %q, want %q", start, end, q.IfMatch, obj.ETag)
		}
		p := start / part
		if end != min((p+1)*part, int64(len(data)))-1 {
			t.Errorf("GET of bytes %d-%d does not end where its part ends", start, end)
		}
		if prev, ok := last[p]; ok {
			advances = append(advances, start-prev)
		} else if start != p*part {
			t.Errorf("first GET of part %d starts at %d, not at the part's start", p, start)
		}
		last[p] = start
	}
	ok := len(advances) == 2
	if i := slices.Index(advances, part/3); ok && i >= 0 {
		reset := advances[1-i]
		ok = reset >= 0 && reset <= part/2
	} else {
		ok = false
	}
	if !ok {
		t.Errorf("resumed GETs start %v bytes after their part's previous GET, want %d (the short body) and at most %d (the reset)", advances, part/3, part/2)
	}
}

// TestRangedReaderResumeBudget: more failures of a connection than
// maxResumes end the read with a retryable error, after only bytes of the
// object; each of the 4 connections resumes 2 times at most.
func TestRangedReaderResumeBudget(t *testing.T) {
	srv := s3test.NewServer(t)
	src := partedSource(t, srv, part, 4)
	data := payload(4 * part)
	obj := putAndStat(t, srv, src, "budget.tar", data)
	srv.Faults.DropAfter(100, "budget.tar", 1000)
	r := src.NewReader(context.Background(), obj, 2)
	got, err := io.ReadAll(r)
	r.Close()
	if err == nil || !s3source.IsRetryable(err) || r.Resumes() < 2 || r.Resumes() > 4*2 {
		t.Errorf("every body reset with 2 resumes allowed per connection: %v (kind %v), resumes %d, want 2 to 8", err, s3source.Classify(err), r.Resumes())
	}
	if !bytes.HasPrefix(data, got) || len(got) == len(data) {
		t.Errorf("read %d bytes before the error, not a strict prefix of the object", len(got))
	}

	// A part that is not there any more is not resumed.
	srv.Faults.Reset()
	srv.Delete(t, "budget.tar")
	r = src.NewReader(context.Background(), obj, 5)
	if _, err := io.Copy(io.Discard, r); !s3source.IsNotFound(err) || r.Resumes() != 0 {
		t.Errorf("deleted object: %v, resumes %d; want not-found without resuming", err, r.Resumes())
	}
	r.Close()
}

// TestRangedReaderObjectReplaced: the object overwritten (same size, new
// bytes) between two parts ends the read with ErrChanged, after only bytes
// of the version listed.
func TestRangedReaderObjectReplaced(t *testing.T) {
	srv := s3test.NewServer(t)
	// Two connections: parts 0 and 1 are requested first, part 2 once
	// part 0 was read; the object is replaced just before part 2's GET is
	// answered. A later part may have been fetched before that, from the
	// version listed, but part 2 comes first and fails.
	src := partedSource(t, srv, part, 2)
	old := payload(6 * part)
	obj := putAndStat(t, srv, src, "swap.tar", old)
	replaced := bytes.Repeat([]byte{0x5a}, len(old))
	srv.Faults.BeforeGet("swap.tar", fmt.Sprintf("bytes=%d-%d", 2*part, 3*part-1), func() { srv.Put(t, "swap.tar", replaced) })

	r := src.NewReader(context.Background(), obj, 5)
	got, err := io.ReadAll(r)
	r.Close()
	if !errors.Is(err, s3source.ErrChanged) || s3source.Classify(err) != s3source.KindChanged {
		t.Fatalf("object replaced mid-read: %v (kind %v), want %v", err, s3source.Classify(err), s3source.ErrChanged)
	}
	// Parts 0 and 1 were requested before the change (their answers may
	// still have come after it if the server was slow to take them).
	if !bytes.Equal(got, old[:len(got)]) || len(got)%part != 0 || len(got) > 2*part {
		t.Errorf("read %d bytes before the error, want whole parts of the listed version before part 2", len(got))
	}
	if r.Resumes() != 0 {
		t.Errorf("resumes %d: a changed object must not be resumed", r.Resumes())
	}
}

// readerGoroutines counts the goroutines running the ranged reader's code.
func readerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "s3source.(*rangedReader)") {
			n++
		}
	}
	return n
}

// waitNoReaderGoroutines fails the test unless the reader's goroutines are
// all gone within d.
func waitNoReaderGoroutines(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for readerGoroutines() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d reader goroutines still running after %v", readerGoroutines(), d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRangedReaderStops: Close in the middle of a read, or the caller's
// context canceled, leaves no goroutine of the reader running.
func TestRangedReaderStops(t *testing.T) {
	srv := s3test.NewServer(t)
	src := partedSource(t, srv, part, 4)
	data := payload(12 * part)
	obj := putAndStat(t, srv, src, "stop.tar", data)
	// A slow link, so requests are under way when the reader is stopped.
	srv.Faults.Shape(0, 4<<20)

	r := src.NewReader(context.Background(), obj, 5)
	buf := make([]byte, 10)
	if _, err := io.ReadFull(r, buf); err != nil || !bytes.Equal(buf, data[:10]) {
		t.Fatalf("first bytes: %v", err)
	}
	if readerGoroutines() == 0 {
		t.Fatal("no reader goroutine while reading: the check below could not fail")
	}
	r.Close()
	// A worker may still be returning from its last frame once Close
	// has seen it done.
	waitNoReaderGoroutines(t, time.Second)
	if _, err := r.Read(buf); err == nil {
		t.Error("Read after Close succeeded")
	}

	ctx, cancel := context.WithCancel(context.Background())
	r = src.NewReader(ctx, obj, 5)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := io.Copy(io.Discard, r); s3source.Classify(err) != s3source.KindCanceled {
		t.Errorf("read after cancel: %v (kind %v), want canceled", err, s3source.Classify(err))
	}
	// Without Close: the canceled context alone stops every worker.
	waitNoReaderGoroutines(t, 5*time.Second)
	r.Close()

	// A reader never read makes no request and starts nothing.
	srv.Faults.Reset()
	r = src.NewReader(context.Background(), obj, 5)
	r.Close()
	if n := srv.TotalRequests(); n != 0 || readerGoroutines() != 0 {
		t.Errorf("a reader closed unread made %d requests", n)
	}
}

func TestPartSettingsValidated(t *testing.T) {
	for _, c := range []struct {
		cfg  s3source.Config
		want string
	}{
		{s3source.Config{PartSize: s3source.MinPartSize - 1}, "s3.part_size: must be between 1MiB and 5GiB"},
		{s3source.Config{PartSize: s3source.MaxPartSize + 1}, "s3.part_size"},
		{s3source.Config{ConnectionsPerObject: s3source.MaxConnectionsPerObject + 1}, "s3.connections_per_object: must be between 1 and 64, got 65"},
	} {
		c.cfg.Bucket = "b"
		if _, err := s3source.New(context.Background(), c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want an error naming the %s", c.cfg, err, c.want)
		}
	}
}

// TestRangedReadersReuseConnections: the parts of several downloads at
// once go over connections kept open between them, not a new connection
// (and handshake) per part.
func TestRangedReadersReuseConnections(t *testing.T) {
	srv := s3test.NewServer(t)
	src := partedSource(t, srv, part, 4)
	const readers = 4 // 16 parts in flight: more than the SDK's 10 idle connections per host
	objs := make([]s3source.Object, readers)
	for i := range objs {
		objs[i] = putAndStat(t, srv, src, fmt.Sprintf("conn/%d.tar", i), payload(4*part))
	}
	// Every request waits, so each round has all its parts in flight at
	// once.
	srv.Faults.Shape(100*time.Millisecond, 0)
	round := func() {
		errs := make(chan error, readers)
		for _, obj := range objs {
			go func() {
				r := src.NewReader(context.Background(), obj, 0)
				defer r.Close()
				n, err := io.Copy(io.Discard, r)
				if err == nil && n != obj.Size {
					err = fmt.Errorf("read %d bytes of %d", n, obj.Size)
				}
				errs <- err
			}()
		}
		for range readers {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	round()
	first := srv.Connections()
	round()
	if n := srv.Connections(); n != first {
		t.Errorf("the second round of %d parts opened %d new connections, want none (the first round's kept open)", 4*readers, n-first)
	}
}

// TestRangedReaderBuffersAtMostConnectionsParts: a caller that does not
// read on leaves the reader with the parts its connections fetched and no
// more; each part handed out in full lets one more be fetched.
func TestRangedReaderBuffersAtMostConnectionsParts(t *testing.T) {
	srv := s3test.NewServer(t)
	src := partedSource(t, srv, part, 3)
	data := payload(10 * part)
	obj := putAndStat(t, srv, src, "held.tar", data)
	r := src.NewReader(context.Background(), obj, 0)
	defer r.Close()
	// settled waits for want GETs, then long enough for a reader that
	// fetched ahead to have asked for more.
	settled := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for len(gets(srv, "held.tar")) < want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
		if n := len(gets(srv, "held.tar")); n != want {
			t.Fatalf("%d GETs, want %d", n, want)
		}
	}
	got := make([]byte, 10)
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	settled(3) // one part per connection, the first being read
	rest := make([]byte, part-10)
	if _, err := io.ReadFull(r, rest); err != nil {
		t.Fatal(err)
	}
	settled(4) // part 0 handed out: its buffer takes part 3
	if !bytes.Equal(append(got, rest...), data[:part]) {
		t.Error("the first part differs from the object's")
	}
}
