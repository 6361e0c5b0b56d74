package plugin

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/snapshots/native"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
)

// These tests serve containerd's own native snapshotter (a real
// snapshots.Snapshotter on plain directories) so that the serving path can
// be checked on a host without device-mapper; the same path over the thin
// pool is tested by the dm-tagged tests in the VM.

// startServe runs Serve in the background and returns once it is ready,
// with a function that stops it and returns Serve's result.
func startServe(t *testing.T, sn snapshots.Snapshotter, opts ServeOptions) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	opts.Ready = func() { close(ready) }
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, sn, opts) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Serve returned before ready: %v", err)
	}
	var stopped bool
	var result error
	stop = func() error {
		if !stopped {
			cancel()
			result, stopped = <-done, true
		}
		return result
	}
	t.Cleanup(func() { stop() })
	return stop
}

// DialProxy returns containerd's proxy snapshotter client (what containerd
// uses for a [proxy_plugins] entry) on socket. Exported for the dm tests of
// package plugin_test.
func DialProxy(t *testing.T, socket string) snapshots.Snapshotter {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "flyio")
}

func newNative(t *testing.T) snapshots.Snapshotter {
	t.Helper()
	sn, err := native.NewSnapshotter(filepath.Join(t.TempDir(), "native"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.Close() })
	return sn
}

func TestServeAnswersProxyClient(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "run", "sub", "snap.sock") // parent dirs do not exist yet
	m := metrics.New()
	sn := newNative(t)
	mlis := LoopbackListener(t)
	stop := startServe(t, m.Wrap(sn), ServeOptions{Socket: socket, MetricsListener: mlis, Metrics: m})

	fi, err := os.Stat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, want a socket with 0600", fi.Mode())
	}

	client := DialProxy(t, socket)
	nsA := namespaces.WithNamespace(context.Background(), "ns-a")
	if _, err := client.Prepare(nsA, "layer-1", ""); err != nil {
		t.Fatalf("Prepare over the socket: %v", err)
	}
	if err := client.Commit(nsA, "committed-1", "layer-1"); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	mounts, err := client.View(nsA, "view-1", "committed-1")
	if err != nil || len(mounts) == 0 {
		t.Fatalf("View = %v, %v", mounts, err)
	}
	info, err := client.Stat(nsA, "committed-1")
	if err != nil || info.Kind != snapshots.KindCommitted {
		t.Fatalf("Stat = %+v, %v; want a committed snapshot", info, err)
	}
	// containerd's native snapshotter ignores namespaces (containerd's
	// metadata layer adds them), so per-namespace isolation over the socket
	// is checked against our snapshotter in the dm tests; here a missing key
	// must come back as NotFound through the gRPC error mapping.
	if _, err := client.Stat(nsA, "no-such-key"); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat of a missing key: err = %v, want NotFound", err)
	}
	var keys []string
	if err := client.Walk(nsA, func(_ context.Context, i snapshots.Info) error {
		keys = append(keys, i.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Errorf("Walk in ns-a listed %v, want committed-1 and view-1", keys)
	}
	if err := client.Remove(nsA, "view-1"); err != nil {
		t.Fatalf("Remove: %v", err)
	}

	// Metrics: one Prepare, one Commit, one NotFound Stat, served over HTTP.
	body := Scrape(t, mlis.Addr().String())
	for _, want := range []string{
		`flyio_snapshotter_operation_duration_seconds_count{method="Prepare",outcome="ok"} 1`,
		`flyio_snapshotter_operation_duration_seconds_count{method="Commit",outcome="ok"} 1`,
		`flyio_snapshotter_operation_duration_seconds_count{method="Stat",outcome="not_found"} 1`,
		`flyio_snapshotter_operation_duration_seconds_count{method="Remove",outcome="ok"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	if err := stop(); err != nil {
		t.Fatalf("Serve after stop: %v", err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still present after stop: %v", err)
	}
}

// LoopbackListener listens on a free 127.0.0.1 port. It brings lo up first:
// in the VM harness (network off) the loopback interface may be down.
func LoopbackListener(t *testing.T) net.Listener {
	t.Helper()
	exec.Command("ip", "link", "set", "lo", "up").Run()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("no loopback for the metrics endpoint: %v", err)
	}
	return l
}

// httpGet GETs url and reads the whole answer, failing the test if either
// fails.
func httpGet(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// Scrape fetches http://addr/metrics.
func Scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, b := httpGet(t, "http://"+addr+"/metrics")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, b)
	}
	return string(b)
}

func TestListenUnixReplacesStaleSocketOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	// A socket file whose listener is gone (a crashed daemon) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	lis, err := ListenUnix(ctx, stale, SocketMode, 0)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer lis.Close()

	// A socket someone serves on is not taken over.
	if _, err := ListenUnix(ctx, stale, SocketMode, 0); err == nil || !strings.Contains(err.Error(), "another process is serving on it") {
		t.Fatalf("live socket: err = %v, want a refusal", err)
	}

	// A regular file is never deleted.
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(ctx, file, SocketMode, 0); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("regular file: err = %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "data" {
		t.Fatal("regular file was modified")
	}

	if _, err := ListenUnix(ctx, "rel.sock", SocketMode, 0); err == nil {
		t.Fatal("relative socket path accepted")
	}
}

func TestServeFailsFastOnBusyMetricsAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	socket := filepath.Join(t.TempDir(), "s.sock")
	err = Serve(context.Background(), newNative(t), ServeOptions{Socket: socket, MetricsAddress: busy.Addr().String(), Metrics: metrics.New()})
	if err == nil || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("err = %v, want one naming the busy address", err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind after a failed start: %v", err)
	}
}

// stallingSnapshotter is a fault injector: its Prepare announces itself on
// entered and then blocks until release is closed (or its context ends)
// before calling the real snapshotter.
type stallingSnapshotter struct {
	snapshots.Snapshotter
	entered chan struct{}
	release chan struct{}
}

func (s *stallingSnapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	s.entered <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Snapshotter.Prepare(ctx, key, parent, opts...)
}

// startStalled serves a stalling snapshotter, starts one Prepare through the
// proxy client and returns once the server is inside it.
func startStalled(t *testing.T, timeout time.Duration) (sn *stallingSnapshotter, cancel func(), served <-chan error, prepared <-chan error) {
	t.Helper()
	sn = &stallingSnapshotter{Snapshotter: newNative(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	socket := filepath.Join(t.TempDir(), "s.sock")
	ctx, cancelServe := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, sn, ServeOptions{Socket: socket, ShutdownTimeout: timeout, Ready: func() { close(ready) }})
	}()
	<-ready
	client := DialProxy(t, socket)
	prep := make(chan error, 1)
	go func() {
		_, err := client.Prepare(namespaces.WithNamespace(context.Background(), "default"), "inflight", "")
		prep <- err
	}()
	<-sn.entered
	return sn, cancelServe, done, prep
}

func TestServeStopLetsInflightCallFinish(t *testing.T) {
	sn, cancel, served, prepared := startStalled(t, time.Hour)
	cancel()
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) while a call was in flight", err)
	case err := <-prepared:
		t.Fatalf("in-flight Prepare ended (%v) before it was released", err)
	default:
	}
	close(sn.release)
	if err := <-prepared; err != nil {
		t.Fatalf("in-flight Prepare failed across the stop: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := sn.Snapshotter.Stat(namespaces.WithNamespace(context.Background(), "default"), "inflight"); err != nil {
		t.Errorf("the in-flight Prepare's snapshot is missing: %v", err)
	}
}

func TestServeStopIsBounded(t *testing.T) {
	// The stalled call is never released: after the shutdown timeout Serve
	// cuts it off and returns, and the client sees an error.
	_, cancel, served, prepared := startStalled(t, 50*time.Millisecond)
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := <-prepared; err == nil {
		t.Fatal("a call cut off by the shutdown timeout reported success")
	}
}
