//go:build dm

package plugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
)

// loopbackAddr returns a free 127.0.0.1 address.
func loopbackAddr(t *testing.T) string {
	t.Helper()
	l := plugin.LoopbackListener(t)
	defer l.Close()
	return l.Addr().String()
}

// withMounted mounts mounts on a fresh directory, runs fn on it, unmounts.
func withMounted(t *testing.T, mounts []mount.Mount, fn func(dir string)) {
	t.Helper()
	dir := t.TempDir()
	if err := mount.All(mounts, dir); err != nil {
		t.Fatalf("mount %+v: %v", mounts, err)
	}
	defer func() {
		if err := mount.UnmountAll(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	}()
	fn(dir)
}

// metricValue returns the value text of the first sample line starting
// with prefix, or "".
func metricValue(body, prefix string) string {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l[len(prefix):])
		}
	}
	return ""
}

// TestServiceOverSocket builds the whole service from a config, serves it
// on a unix socket and drives it with containerd's proxy snapshotter client
// (what containerd uses for a [proxy_plugins] entry): data written through
// a Prepare is seen through a View of its commit, keys are shared
// across namespaces (containerd scopes them itself), the metrics endpoint reports calls, pool usage and device counts,
// and after a stop and a restart the committed snapshot is still there.
func TestServiceOverSocket(t *testing.T) {
	ctx := context.Background()
	cfg := dmtest.Config(t)
	cfg.Daemon.MetricsAddress = loopbackAddr(t)

	svc, err := plugin.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := dmtest.Serve(t, ctx, svc)
	defer stop()

	fi, err := os.Stat(cfg.Daemon.Socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v, mode %v; want 0600", cfg.Daemon.Socket, err, fi.Mode())
	}

	client := plugin.DialProxy(t, cfg.Daemon.Socket)
	nsA := namespaces.WithNamespace(ctx, "ns-a")
	nsB := namespaces.WithNamespace(ctx, "ns-b")

	mounts, err := client.Prepare(nsA, "work", "")
	if err != nil {
		t.Fatalf("Prepare over the socket: %v", err)
	}
	withMounted(t, mounts, func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("from the proxy client\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if err := client.Commit(nsA, "layer", "work", snapshots.WithLabels(map[string]string{"test": "yes"})); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	// Keys are not scoped by the request's namespace (containerd puts its
	// namespace into the keys it sends, and its GC calls with none).
	if info, err := client.Stat(nsB, "layer"); err != nil || info.Kind != snapshots.KindCommitted {
		t.Fatalf("Stat from another namespace = %+v, %v; want the committed snapshot", info, err)
	}
	if info, err := client.Stat(ctx, "layer"); err != nil || info.Kind != snapshots.KindCommitted {
		t.Fatalf("Stat with no namespace (containerd's GC) = %+v, %v; want the committed snapshot", info, err)
	}
	if _, err := client.Stat(nsB, "missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat of a missing key: %v, want NotFound", err)
	}
	info, err := client.Stat(nsA, "layer")
	if err != nil || info.Kind != snapshots.KindCommitted || info.Labels["test"] != "yes" {
		t.Fatalf("Stat = %+v, %v; want committed with label test=yes", info, err)
	}
	view, err := client.View(nsA, "look", "layer")
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	withMounted(t, view, func(dir string) {
		b, err := os.ReadFile(filepath.Join(dir, "hello.txt"))
		if err != nil || string(b) != "from the proxy client\n" {
			t.Errorf("file read through the view = %q, %v", b, err)
		}
	})
	usage, err := client.Usage(nsA, "layer")
	if err != nil || usage.Size <= 0 {
		t.Errorf("Usage = %+v, %v; want a positive size", usage, err)
	}
	var walked []string
	if err := client.Walk(nsA, func(_ context.Context, i snapshots.Info) error {
		walked = append(walked, i.Name)
		return nil
	}, "kind==committed"); err != nil {
		t.Fatal(err)
	}
	if len(walked) != 1 || walked[0] != "layer" {
		t.Errorf("Walk kind==committed = %v, want [layer]", walked)
	}
	if err := client.Remove(nsA, "look"); err != nil {
		t.Fatalf("Remove: %v", err)
	}

	body := plugin.Scrape(t, cfg.Daemon.MetricsAddress)
	for prefix, want := range map[string]string{
		`flyio_snapshotter_operation_duration_seconds_count{method="Prepare",outcome="ok"}`:     "1",
		`flyio_snapshotter_operation_duration_seconds_count{method="Stat",outcome="not_found"}`: "1",
		`flyio_snapshotter_devices{state="committed"}`:                                          "1",
		`flyio_snapshotter_pool_data_total_bytes{pool="` + cfg.Pool.Name + `"}`:                 "2.147483648e+09",
		`flyio_snapshotter_pool_mode{mode="rw",pool="` + cfg.Pool.Name + `"}`:                   "1",
	} {
		if got := metricValue(body, prefix); got != want {
			t.Errorf("%s = %q, want %q", prefix, got, want)
		}
	}
	if used := metricValue(body, `flyio_snapshotter_pool_data_used_bytes{pool="`+cfg.Pool.Name+`"}`); used == "" || used == "0" {
		t.Errorf("pool data used = %q, want a positive value after writing", used)
	}

	if err := stop(); err != nil {
		t.Fatalf("Serve after stop: %v", err)
	}
	if _, err := os.Lstat(cfg.Daemon.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after stop: %v", err)
	}
	if err := svc.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	// A restart finds the committed snapshot and its content.
	svc, err = plugin.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer svc.Close()
	if info, err := svc.Snapshotter.Stat(nsA, "layer"); err != nil || info.Kind != snapshots.KindCommitted {
		t.Fatalf("after restart Stat = %+v, %v", info, err)
	}
	if _, err := svc.Snapshotter.Stat(nsA, "look"); !errdefs.IsNotFound(err) {
		t.Errorf("removed view came back after restart: %v", err)
	}
}

// TestOpenFailsCleanly checks that a config naming a pool that already
// runs on other files is refused with an error naming the pool, without
// disturbing that pool: its own service opens again afterwards.
func TestOpenFailsCleanly(t *testing.T) {
	ctx := context.Background()
	first := dmtest.Config(t)
	svc, err := plugin.Open(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	svc.Close()

	c := *dmtest.Config(t) // a copy: its teardown keeps its own pool name
	second := &c
	second.Pool.Name = first.Pool.Name // same dm name, other pool files
	if _, err := plugin.Open(ctx, second); err == nil {
		t.Fatal("opened a pool whose name belongs to another pool's files")
	} else if !strings.Contains(err.Error(), first.Pool.Name) {
		t.Errorf("error %q does not name the pool", err)
	}
	svc, err = plugin.Open(ctx, first)
	if err != nil {
		t.Fatalf("reopen the first service: %v", err)
	}
	svc.Close()
}

// TestSecondDaemonOnPoolRefused: a daemon with a root and a database of
// its own but a running daemon's pool (its name and its loop files), one
// that deletes the devices its database does not explain, is refused
// before it opens anything, naming the running daemon's pid; the running
// daemon's snapshot is still there.
func TestSecondDaemonOnPoolRefused(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "ns")
	first := dmtest.Config(t)
	svc, err := plugin.Open(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := svc.Snapshotter.Prepare(ctx, "work", ""); err != nil {
		t.Fatal(err)
	}

	c := *dmtest.Config(t) // a copy: its teardown keeps its own pool name
	second := &c
	second.Pool.Config = first.Pool.Config
	second.Pool.DeleteUnknownDevices = true
	other, err := plugin.Open(ctx, second)
	if err == nil {
		other.Close()
	}
	pid := "pid " + strconv.Itoa(os.Getpid())
	if !errors.Is(err, plugin.ErrLocked) || !strings.Contains(err.Error(), pid) {
		t.Errorf("a second daemon on a running daemon's pool: %v, want %v naming %s", err, plugin.ErrLocked, pid)
	}
	if _, err := os.Stat(second.Metadata.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused daemon made its database: %v", err)
	}
	mounts, err := svc.Snapshotter.Mounts(ctx, "work")
	if err != nil {
		t.Fatalf("the running daemon's snapshot after the second daemon: %v", err)
	}
	withMounted(t, mounts, func(string) {})
}
