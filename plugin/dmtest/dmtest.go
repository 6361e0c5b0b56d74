//go:build dm

// Package dmtest gives the dm-tagged tests of plugin/ and cmd/ a complete
// daemon configuration on a small loop-file pool under $VM_SCRATCH, and
// tears the pool down after the test. It is compiled only with the dm tag
// (inside the VM harness).
package dmtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
)

var seq atomic.Int64

// Config returns a valid configuration whose every path is in a fresh
// directory under $VM_SCRATCH, with a uniquely named small pool (2 GiB
// sparse data, 16 MiB metadata, 128 MiB devices) and the control socket
// off. The pool is removed with its devices when the test ends.
func Config(t testing.TB) *plugin.Config {
	t.Helper()
	dir := scratch.Dir(t, "plugin-")
	cfg := plugin.DefaultConfig()
	cfg.Daemon.RootDir = dir
	cfg.Daemon.Socket = filepath.Join(dir, "run", "snap.sock")
	cfg.Daemon.ControlSocket = ""
	cfg.Metadata.Path = filepath.Join(dir, "metadata.db")
	cfg.Pool.RootDir = filepath.Join(dir, "pool")
	cfg.Pipeline.DownloadDir = filepath.Join(dir, "images")
	cfg.Pool.Name = fmt.Sprintf("pl%d-%d", os.Getpid(), seq.Add(1))
	cfg.Pool.DataSize = 2 << 30
	cfg.Pool.MetadataSize = 16 << 20
	cfg.Pool.BaseImageSize = 128 << 20
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Teardown(t, cfg) })
	return cfg
}

// WriteConfig writes cfg as TOML to <root_dir>/config.toml and returns the
// path.
func WriteConfig(t testing.TB, cfg *plugin.Config) string {
	t.Helper()
	b, err := plugin.MarshalConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.Daemon.RootDir, "config.toml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Teardown unmounts and deactivates every device on cfg's pool, removes
// the pool (its loop devices auto-clear) and deletes the directory. A pool
// that was never created is fine.
func Teardown(t testing.TB, cfg *plugin.Config) {
	ctx := context.Background()
	if out, err := exec.Command("dmsetup", "info", cfg.Pool.Name).CombinedOutput(); err != nil {
		t.Logf("teardown: pool %s not present (%s)", cfg.Pool.Name, out)
		os.RemoveAll(cfg.Daemon.RootDir)
		return
	}
	p, err := thinpool.Open(ctx, cfg.ThinpoolConfig())
	if err != nil {
		t.Errorf("teardown: open pool %s: %v", cfg.Pool.Name, err)
		return
	}
	if devs, err := p.ActiveDevices(ctx); err == nil {
		for _, d := range devs {
			exec.Command("umount", "-l", thinpool.DevicePath(d.Name)).Run()
			if err := p.Deactivate(ctx, d.Name); err != nil {
				t.Errorf("teardown: deactivate %s: %v", d.Name, err)
			}
		}
	}
	p.Close()
	// No thinpool API removes a pool; the loop devices auto-clear with it.
	if out, err := exec.Command("dmsetup", "remove", cfg.Pool.Name).CombinedOutput(); err != nil {
		t.Errorf("teardown: dmsetup remove %s: %v: %s", cfg.Pool.Name, err, out)
	}
	os.RemoveAll(cfg.Daemon.RootDir)
}

// DialProxy returns containerd's proxy snapshotter client (what containerd
// uses for a [proxy_plugins] entry) on the daemon's snapshots socket.
func DialProxy(t testing.TB, socket string) snapshots.Snapshotter {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "flyio")
}

// Serve runs svc.Serve in the background and returns once the service is
// ready to answer on its sockets; it fails t if Serve ends first. stop
// cancels Serve, waits for it to end and returns its error; calls after
// the first return the same error.
func Serve(t testing.TB, ctx context.Context, svc *plugin.Service) (stop func() error) {
	t.Helper()
	serveCtx, cancel := context.WithCancel(ctx)
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- svc.Serve(serveCtx, func() { close(ready) }, nil) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Serve: %v", err)
	}
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
}
