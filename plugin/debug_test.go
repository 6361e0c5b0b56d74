package plugin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/smithy-go/middleware"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// fakePool stands in for the kernel at the thin pool's status boundary
// (the host has no device-mapper): the test sets the status line's
// outcome, as a pool turning read-only with needs_check would report it.
type fakePool struct {
	mu sync.Mutex
	st thinpool.PoolStatus
}

func (p *fakePool) Name() string { return "flyio-pool" }

func (p *fakePool) Status(context.Context) (thinpool.PoolStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st, nil
}

func (p *fakePool) set(st thinpool.PoolStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st = st
}

// getHealth asks the debug endpoint at addr for /healthz.
func getHealth(t *testing.T, addr string) (int, Health) {
	t.Helper()
	resp, body := httpGet(t, "http://"+addr+"/healthz")
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("/healthz Content-Type %q, want application/json", ct)
	}
	var h Health
	if err := json.Unmarshal(body, &h); err != nil {
		t.Fatalf("/healthz answered %s, not JSON: %v\n%s", resp.Status, err, body)
	}
	return resp.StatusCode, h
}

// TestHealthz serves the debug endpoint through Serve over a real SQLite
// database and a real S3 client talking to the in-process S3 server (a 503
// injected at its HTTP boundary), and checks what /healthz says as each
// part fails and recovers: 200 only while all three hold.
func TestHealthz(t *testing.T) {
	ctx := context.Background()
	db := metadatatest.Open(t)
	pool := &fakePool{st: thinpool.PoolStatus{Mode: thinpool.ModeReadWrite, TotalDataBlocks: 100}}

	srv := s3test.NewServer(t)
	srv.Put(t, "img/1.tar", []byte("layer"))
	fm := metrics.New().Fetch()
	src, err := s3source.New(ctx, s3source.Config{Bucket: srv.Bucket, Region: "us-east-1", Endpoint: srv.URL, PathStyle: true, Anonymous: true,
		APIOptions: []func(*middleware.Stack) error{fm.S3Middleware}})
	if err != nil {
		t.Fatal(err)
	}

	lis := LoopbackListener(t)
	addr := lis.Addr().String()
	startServe(t, newNative(t), ServeOptions{Socket: filepath.Join(t.TempDir(), "s.sock"), DebugListener: lis,
		Debug: DebugHandler(HealthSources{Pool: pool, DB: db, S3: fm.LastS3Request})})

	code, h := getHealth(t, addr)
	if code != http.StatusOK || !h.Healthy || !h.Pool.ReadWrite || h.Pool.Mode != "rw" || !h.Database.Open ||
		h.Database.Path != db.Path() || h.S3.LastRequest != nil {
		t.Fatalf("fresh daemon: %d %+v, want 200, healthy, no S3 request yet", code, h)
	}

	// A missing object is S3 answering: still healthy.
	if _, err := src.Stat(ctx, "img/absent.tar"); !s3source.IsNotFound(err) {
		t.Fatalf("stat of a missing key: %v", err)
	}
	if code, h = getHealth(t, addr); code != http.StatusOK || h.S3.LastRequest == nil || !h.S3.LastRequest.OK ||
		h.S3.LastRequest.Outcome != "not_found" || h.S3.LastRequest.Operation != "HeadObject" || h.S3.LastRequest.At.IsZero() {
		t.Fatalf("after a 404: %d %+v", code, h.S3.LastRequest)
	}

	srv.Faults.Fail503(1, "img/1.tar")
	if _, err := src.Stat(ctx, "img/1.tar"); err == nil {
		t.Fatal("the injected 503 was not an error")
	}
	if code, h = getHealth(t, addr); code != http.StatusServiceUnavailable || h.Healthy || h.S3.LastRequest == nil ||
		h.S3.LastRequest.OK || h.S3.LastRequest.Outcome != "server_error" || !h.Pool.ReadWrite || !h.Database.Open {
		t.Fatalf("after an S3 503: %d %+v, want 503 naming the server error alone", code, h)
	}
	if _, err := src.Stat(ctx, "img/1.tar"); err != nil {
		t.Fatal(err)
	}
	if code, h = getHealth(t, addr); code != http.StatusOK || !h.Healthy || !h.S3.LastRequest.OK {
		t.Fatalf("after S3 recovered: %d %+v", code, h)
	}

	pool.set(thinpool.PoolStatus{Mode: thinpool.ModeReadOnly, NeedsCheck: true, TotalDataBlocks: 100})
	if code, h = getHealth(t, addr); code != http.StatusServiceUnavailable || h.Healthy || h.Pool.ReadWrite || h.Pool.Mode != "ro" || !h.Pool.NeedsCheck {
		t.Fatalf("pool read-only, needs_check: %d %+v", code, h)
	}
	pool.set(thinpool.PoolStatus{Mode: thinpool.ModeOutOfDataSpace, UsedDataBlocks: 100, TotalDataBlocks: 100})
	if code, h = getHealth(t, addr); code != http.StatusServiceUnavailable || h.Pool.ReadWrite || h.Pool.Mode != "out_of_data_space" {
		t.Fatalf("pool out of data space: %d %+v", code, h)
	}
	pool.set(thinpool.PoolStatus{Mode: thinpool.ModeReadWrite, TotalDataBlocks: 100})

	// The database closed under the daemon: its ping fails.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if code, h = getHealth(t, addr); code != http.StatusServiceUnavailable || h.Healthy || h.Database.Open || h.Database.Error == "" || !h.Pool.ReadWrite {
		t.Fatalf("database closed: %d %+v", code, h)
	}
}

// TestDebugEndpointServesPprof: the profiler's index and a named profile
// answer on the debug endpoint; /healthz refuses a POST.
func TestDebugEndpointServesPprof(t *testing.T) {
	db := metadatatest.Open(t)
	lis := LoopbackListener(t)
	addr := lis.Addr().String()
	startServe(t, newNative(t), ServeOptions{Socket: filepath.Join(t.TempDir(), "s.sock"), DebugListener: lis,
		Debug: DebugHandler(HealthSources{Pool: &fakePool{st: thinpool.PoolStatus{Mode: thinpool.ModeReadWrite}}, DB: db})})

	for path, want := range map[string]string{"/debug/pprof/": "goroutine", "/debug/pprof/goroutine?debug=1": "goroutine profile: total"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %s, body without %q", path, resp.Status, want)
		}
	}
	resp, err := http.Post("http://"+addr+"/healthz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %s, want 405", resp.Status)
	}
}

func TestServeNeedsDebugHandler(t *testing.T) {
	lis := LoopbackListener(t)
	err := Serve(context.Background(), newNative(t), ServeOptions{Socket: filepath.Join(t.TempDir(), "s.sock"), DebugListener: lis})
	if err == nil || !strings.Contains(err.Error(), "debug endpoint needs a handler") {
		t.Fatalf("Serve with a debug listener and no handler: %v", err)
	}
}

// stalledPool is a fake pool whose metadata device has stalled: its
// status, one ioctl that first commits the metadata, waits for writes
// that do not finish and, like the ioctl, does not give up with its
// context.
type stalledPool struct {
	fakePool
	stalled chan struct{}
	calls   atomic.Int32
}

func (p *stalledPool) Status(context.Context) (thinpool.PoolStatus, error) {
	p.calls.Add(1)
	<-p.stalled
	return p.fakePool.Status(context.Background())
}

// TestHealthzAnswersWithThePoolStalled: with the pool's status call
// wedged in the kernel, /healthz still answers, unhealthy and naming the
// pool, within the bound troubleshooting.md promises, so a prober (a
// load balancer, a watchdog) reads the daemon as unhealthy with its
// reason instead of timing out on it.
func TestHealthzAnswersWithThePoolStalled(t *testing.T) {
	db := metadatatest.Open(t)
	pool := &stalledPool{fakePool: fakePool{st: thinpool.PoolStatus{Mode: thinpool.ModeReadWrite}}, stalled: make(chan struct{})}
	srv := httptest.NewServer(DebugHandler(HealthSources{Pool: pool, DB: db}))
	defer srv.Close()
	// Before the server's Close, which waits for the request under way.
	defer close(pool.stalled)

	slack := 2 * time.Second
	resp, err := (&http.Client{Timeout: healthCheckTimeout + slack}).Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatalf("/healthz with the pool's status stalled not answered within %s: %v", healthCheckTimeout+slack, err)
	}
	defer resp.Body.Close()
	var h Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || h.Healthy || h.Pool.ReadWrite || !strings.Contains(h.Pool.Error, "not answered within 5s") || !h.Database.Open {
		t.Fatalf("/healthz with the pool's status stalled: %s %+v, want 503 naming the pool alone", resp.Status, h)
	}
}

// TestHealthzProbesShareAStalledPoolStatus: while the pool's status call
// is stuck in the kernel, further probes wait on that call instead of
// making one each: every call given up on would stay stuck, holding a
// thread, and a prober every few seconds would pile them up for as long
// as the device stalls.
func TestHealthzProbesShareAStalledPoolStatus(t *testing.T) {
	db := metadatatest.Open(t)
	pool := &stalledPool{fakePool: fakePool{st: thinpool.PoolStatus{Mode: thinpool.ModeReadWrite}}, stalled: make(chan struct{})}
	h := DebugHandler(HealthSources{Pool: pool, DB: db})
	for probe := 0; probe < 3; probe++ {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/healthz", nil))
		cancel()
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("probe %d with the pool's status stalled: %d, want 503", probe, rec.Code)
		}
	}
	if n := pool.calls.Load(); n != 1 {
		t.Errorf("3 probes with the pool's status stalled made %d status calls, want 1", n)
	}
	close(pool.stalled)
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		if rec.Code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz after the pool's status answered: %d\n%s", rec.Code, rec.Body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Once it has answered, the next probe asks again.
	n := pool.calls.Load()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK || pool.calls.Load() != n+1 {
		t.Errorf("a probe after the stalled status answered: %d, %d status calls in all, want 200 and %d", rec.Code, pool.calls.Load(), n+1)
	}
}
