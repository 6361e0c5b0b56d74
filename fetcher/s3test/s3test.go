// Package s3test runs an in-process S3 server for tests: gofakes3 with its
// in-memory backend, on 127.0.0.1, behind faultyS3, a fault injector at the
// HTTP boundary that can answer errors, cut connections mid-body, send
// truncated objects and be slow (one request, or every request through a
// shaped link), that enforces If-Match on GET and HEAD as S3 does, and
// that counts and records every request so a test can assert that no S3
// request was made, or what headers each one carried.
package s3test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// DefaultBucket is the bucket NewServer creates.
const DefaultBucket = "images"

// Server is a running fake S3.
type Server struct {
	URL    string       // endpoint, e.g. http://127.0.0.1:40123 (path-style addressing)
	Bucket string       // the bucket created at start
	Faults *faultyS3    // the fault injector in front of gofakes3
	HTTP   *http.Server // the underlying server (httptest)

	backend *s3mem.Backend
	ts      *httptest.Server
	conns   *atomic.Int64 // shared by copies of the Server (a copy naming another bucket)
}

// NewServer starts a fake S3 with DefaultBucket; it stops when t ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	backend := s3mem.New()
	faker := gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	if err := backend.CreateBucket(DefaultBucket); err != nil {
		t.Fatalf("s3test: create bucket: %v", err)
	}
	f := newFaultyS3(faker.Server(), DefaultBucket)
	ts := httptest.NewUnstartedServer(f)
	s := &Server{Bucket: DefaultBucket, Faults: f, HTTP: ts.Config, backend: backend, ts: ts, conns: new(atomic.Int64)}
	ts.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	s.URL = ts.URL
	return s
}

// Connections is how many TCP connections the server has accepted.
func (s *Server) Connections() int { return int(s.conns.Load()) }

// Put stores an object (straight into the backend: not counted, no faults).
func (s *Server) Put(t testing.TB, key string, data []byte) {
	t.Helper()
	if _, err := s.backend.PutObject(s.Bucket, key, map[string]string{}, bytes.NewReader(data), int64(len(data)), nil); err != nil {
		t.Fatalf("s3test: put %s: %v", key, err)
	}
}

// Delete removes an object (straight from the backend).
func (s *Server) Delete(t testing.TB, key string) {
	t.Helper()
	if _, err := s.backend.DeleteObject(s.Bucket, key); err != nil {
		t.Fatalf("s3test: delete %s: %v", key, err)
	}
}

// CreateBucket adds another bucket.
func (s *Server) CreateBucket(t testing.TB, name string) {
	t.Helper()
	if err := s.backend.CreateBucket(name); err != nil {
		t.Fatalf("s3test: create bucket %s: %v", name, err)
	}
}

// Requests is how many requests reached the server with method for key
// ("" key: requests on the bucket itself, such as listings).
func (s *Server) Requests(method, key string) int { return s.Faults.count(method, key) }

// TotalRequests is how many requests reached the server.
func (s *Server) TotalRequests() int { return s.Faults.total() }

// keyOf extracts the object key of a path-style request path /bucket/key.
func keyOf(bucket, path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/"+bucket)
	if !ok {
		return "", false
	}
	if rest == "" || rest == "/" {
		return "", true
	}
	if !strings.HasPrefix(rest, "/") {
		return "", false
	}
	return rest[1:], true
}

func s3Error(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected by faultyS3</Message><RequestId>faulty</RequestId></Error>`, code)
}
