//go:build dm

package plugin_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
)

// TestStartFetcherRefusedLeavesNothingRunning: a control socket the daemon
// cannot listen on (daemon.control_socket naming a directory, an
// operator's typo) fails StartFetcher, and the daemon then closes its pool
// and database and exits. Nothing StartFetcher started may work on by
// then: the collection loop, the pool's watch, the registration of pending
// names and the retention passes would work on a closed pool and database,
// or be killed half-way by the exit. Here the pool is under its low-water
// mark, which the watch answers at once by growing the pool, whose table
// reload suspends it: a start refused must leave it as it was.
func TestStartFetcherRefusedLeavesNothingRunning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := dmtest.Config(t)
	exec.Command("ip", "link", "set", "lo", "up").Run()
	srv := s3test.NewServer(t)
	cfg.S3.Region, cfg.S3.Endpoint, cfg.S3.PathStyle, cfg.S3.Anonymous = "us-east-1", srv.URL, true, true
	cfg.Pool.DataSize, cfg.Pool.MaxDataSize, cfg.Pool.GrowthReserve = 64<<20, 128<<20, 1<<20 // 1024 blocks of 64 KiB
	cfg.Daemon.ControlSocket = filepath.Join(cfg.Daemon.RootDir, "control.d")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cfg.Daemon.ControlSocket, 0o755); err != nil {
		t.Fatal(err)
	}
	svc, err := plugin.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	// A device writes past the mark while no watch runs.
	const id, name = 4000, "startfetcher-filler"
	if err := svc.Pool.CreateThin(ctx, id); err != nil {
		t.Fatal(err)
	}
	path, err := svc.Pool.Activate(ctx, name, id, 128<<20)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20+4096)
	off := (4096 - int(uintptr(unsafe.Pointer(&buf[0]))&4095)) & 4095
	chunk := buf[off : off+1<<20]
	for pos := int64(0); pos < 60<<20; pos += 1 << 20 {
		if _, err := f.WriteAt(chunk, pos); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	before, err := svc.Pool.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}

	stop, err := svc.StartFetcher(ctx)
	if err == nil {
		stop()
		t.Fatalf("StartFetcher served the control API on directory %s", cfg.Daemon.ControlSocket)
	}
	stacks := make([]byte, 4<<20)
	stacks = stacks[:runtime.Stack(stacks, true)]
	for _, fn := range []string{"(*Service).StartFetcher.func", "(*Service).watchPool", "(*Collector).Loop",
		"(*Pipelines).RegisterPendingEvery", "(*Pipelines).RetainEvery"} {
		if bytes.Contains(stacks, []byte(fn)) {
			t.Errorf("StartFetcher returned %q while a goroutine of %s it started still runs", err, fn)
		}
	}
	time.Sleep(2 * time.Second)
	after, err := svc.Pool.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.TotalDataBlocks != before.TotalDataBlocks {
		t.Errorf("the pool went from %d to %d data blocks across a StartFetcher refused (%v): what it started went on working on the pool",
			before.TotalDataBlocks, after.TotalDataBlocks, err)
	}
}
