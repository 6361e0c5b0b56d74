package s3test

import (
	"bytes"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// send GETs url with header set and reads the whole body. The error is the
// request's or the read's; with a read error, b is what came before it.
func send(t *testing.T, url string, header map[string]string) (resp *http.Response, b []byte, err error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(resp.Body)
	return resp, b, err
}

// get GETs url as send does and gives the answer's status (0 without an
// answer), for the tests that expect the fault injector's errors.
func get(t *testing.T, url string) (int, []byte, error) {
	t.Helper()
	resp, b, err := send(t, url, nil)
	if resp == nil {
		return 0, b, err
	}
	return resp.StatusCode, b, err
}

func TestFaultsAndCounts(t *testing.T) {
	srv := NewServer(t)
	srv.Put(t, "a/b.tar", []byte("0123456789"))
	url := srv.URL + "/" + srv.Bucket + "/a/b.tar"

	srv.Faults.Fail503(1, "a/b.tar")
	if code, _, err := get(t, url); err != nil || code != 503 {
		t.Errorf("first GET: %d %v, want 503", code, err)
	}
	if code, b, err := get(t, url); err != nil || code != 200 || string(b) != "0123456789" {
		t.Errorf("second GET: %d %q %v, want the object", code, b, err)
	}
	srv.Faults.Truncate(1, "a/b.tar", 4)
	if _, b, err := get(t, url); err == nil || string(b) != "0123" {
		t.Errorf("truncated GET: %q %v, want 4 bytes and an error", b, err)
	}
	srv.Faults.DropAfter(1, "a/b.tar", 3)
	if _, b, err := get(t, url); err == nil || len(b) > 3 {
		t.Errorf("dropped GET: %q %v, want at most 3 bytes and an error", b, err)
	}
	if n := srv.Requests(http.MethodGet, "a/b.tar"); n != 4 {
		t.Errorf("counted %d GETs of a/b.tar, want 4", n)
	}
	if n := srv.Requests(http.MethodGet, "other"); n != 0 {
		t.Errorf("counted %d GETs of other, want 0", n)
	}
	srv.Faults.Reset()
	if n := srv.TotalRequests(); n != 0 {
		t.Errorf("after Reset: %d requests, want 0", n)
	}
}

// TestFailFor: a burst fails every request for its key while it lasts,
// however many, and none after.
func TestFailFor(t *testing.T) {
	srv := NewServer(t)
	srv.Put(t, "a/b.tar", []byte("0123456789"))
	url := srv.URL + "/" + srv.Bucket + "/a/b.tar"
	srv.Faults.FailFor(300*time.Millisecond, "a/b.tar", 503, "SlowDown")
	for i := range 5 {
		if code, b, err := get(t, url); err != nil || code != 503 || !strings.Contains(string(b), "SlowDown") {
			t.Errorf("GET %d in the burst: %d %q %v, want 503 SlowDown", i, code, b, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if code, b, err := get(t, url); err != nil || code != 200 || string(b) != "0123456789" {
		t.Errorf("GET after the burst: %d %q %v, want the object", code, b, err)
	}
}

// getWith GETs url with header set as send does, failing the test on any
// error.
func getWith(t *testing.T, url string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := send(t, url, header)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestIfMatchRangeAndRecord: the server answers a range, refuses a stale
// If-Match with S3's 412 (gofakes3 alone would send the object), and
// records each request's Range and If-Match.
func TestIfMatchRangeAndRecord(t *testing.T) {
	srv := NewServer(t)
	srv.Put(t, "o.tar", []byte("0123456789"))
	url := srv.URL + "/" + srv.Bucket + "/o.tar"
	resp, _ := getWith(t, url, nil)
	etag := resp.Header.Get("ETag")

	resp, b := getWith(t, url, map[string]string{"Range": "bytes=2-5", "If-Match": etag})
	if resp.StatusCode != http.StatusPartialContent || string(b) != "2345" {
		t.Errorf("ranged GET with the right ETag: %d %q, want 206 \"2345\"", resp.StatusCode, b)
	}
	srv.Put(t, "o.tar", []byte("abcdefghij"))
	resp, b = getWith(t, url, map[string]string{"Range": "bytes=2-5", "If-Match": etag})
	if resp.StatusCode != http.StatusPreconditionFailed || !bytes.Contains(b, []byte("<Code>PreconditionFailed</Code>")) || bytes.Contains(b, []byte("cdef")) {
		t.Errorf("GET with a stale ETag: %d %q, want 412 PreconditionFailed and none of the object", resp.StatusCode, b)
	}
	resp, b = getWith(t, url, map[string]string{"If-Match": "*"})
	if resp.StatusCode != http.StatusOK || string(b) != "abcdefghij" {
		t.Errorf("GET with If-Match *: %d %q", resp.StatusCode, b)
	}
	want := []Request{{"GET", "o.tar", "", "", time.Time{}}, {"GET", "o.tar", "bytes=2-5", etag, time.Time{}}, {"GET", "o.tar", "bytes=2-5", etag, time.Time{}}, {"GET", "o.tar", "", "*", time.Time{}}}
	got := srv.Faults.Recorded()
	for i := range got {
		if i > 0 && got[i].At.Before(got[i-1].At) {
			t.Errorf("request %d recorded at %v, before the one before it (%v)", i, got[i].At, got[i-1].At)
		}
		got[i].At = time.Time{}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("recorded %+v, want %+v", got, want)
	}
}

// TestBeforeGetAndShape: a hook runs once, before the first GET of its
// range, and a shaped
// link delays and paces answers.
func TestBeforeGetAndShape(t *testing.T) {
	srv := NewServer(t)
	srv.Put(t, "o.tar", []byte("old"))
	url := srv.URL + "/" + srv.Bucket + "/o.tar"
	srv.Faults.BeforeGet("o.tar", "bytes=1-2", func() { srv.Put(t, "o.tar", []byte("new")) })
	var got []string
	for _, rng := range []string{"", "bytes=0-1", "bytes=1-2", "bytes=0-1", "bytes=1-2"} {
		_, b := getWith(t, url, map[string]string{"Range": rng})
		got = append(got, string(b))
	}
	if strings.Join(got, " ") != "old ol ew ne ew" {
		t.Errorf("bodies %v, want old ol ew ne ew (the object replaced once, before the first GET of bytes 1-2)", got)
	}

	srv.Put(t, "big.tar", make([]byte, 100_000))
	srv.Faults.Shape(50*time.Millisecond, 1_000_000)
	t0 := time.Now()
	getWith(t, srv.URL+"/"+srv.Bucket+"/big.tar", nil)
	// 50ms of latency and 100kB at 1MB/s (100ms).
	if took := time.Since(t0); took < 140*time.Millisecond {
		t.Errorf("shaped GET took %v, want at least 150ms", took)
	}
	srv.Faults.Reset()
	if srv.Faults.latency != 0 || srv.Faults.rate != 0 {
		t.Errorf("after Reset: latency %v, rate %d; want no shaping", srv.Faults.latency, srv.Faults.rate)
	}
}
