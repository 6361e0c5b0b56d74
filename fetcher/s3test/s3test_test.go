package s3test

import (
	"io"
	"net/http"
	"testing"
)

func get(t *testing.T, url string) (int, []byte, error) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
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
