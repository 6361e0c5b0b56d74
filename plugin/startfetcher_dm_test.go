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

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
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
	var cfg *plugin.Config
	svc := openUnderLowWater(ctx, t, 4000, func(c *plugin.Config) {
		c.GC.Enabled = plugin.DefaultConfig().GC.Enabled
		c.Daemon.ControlSocket = filepath.Join(c.Daemon.RootDir, "control.d")
		cfg = c
	})
	if err := os.MkdirAll(cfg.Daemon.ControlSocket, 0o755); err != nil {
		t.Fatal(err)
	}
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

// TestStartFetcherStoppedAfterResumeLeavesNoRunGoing: a StartFetcher whose
// context is canceled once it has resumed the runs a previous process left
// (a stop during start-up) and that then fails (here its control socket
// names a directory) returns only once those runs have ended: the daemon
// closes its pool and database next and exits, and a run going on would
// work on them closed. The resumed run is a layer's inflation by
// daemon.gzip_command, a script that takes 3 s to end whatever the run's
// context says.
func TestStartFetcherStoppedAfterResumeLeavesNoRunGoing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := dmtest.Config(t)
	// The VM harness boots with its network off: the fake S3 needs lo.
	exec.Command("ip", "link", "set", "lo", "up").Run()
	srv := s3test.NewServer(t)
	cfg.S3.Region, cfg.S3.Endpoint, cfg.S3.PathStyle, cfg.S3.Anonymous = "us-east-1", srv.URL, true, true
	cfg.Daemon.ControlSocket = filepath.Join(cfg.Daemon.RootDir, "run", "control.sock")
	marks := t.TempDir()
	script := filepath.Join(marks, "slow-gzip")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntouch "+marks+"/started\nsleep 3\nkill -TERM $$\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Daemon.GzipCommand = script
	srv.Put(t, "a/1.tar.gz", s3test.Gzip(t, layerTar(t, "a", "x")))
	started := func() {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(marks, "started")); err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no run started the gzip command in 2 minutes")
			}
		}
	}

	svc, err := plugin.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	// A first start leaves a run under way, as a daemon stopped mid-pull.
	stop, err := svc.StartFetcher(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pulled := make(chan error, 1)
	go func() {
		_, err := control.NewClient(cfg.Daemon.ControlSocket).Pull(ctx, api.PullRequest{Bucket: srv.Bucket, Key: "a/", Ref: "test/a"}, nil)
		pulled <- err
	}()
	started()
	stop()
	if err := <-pulled; err == nil {
		t.Fatal("the pull ended well across its daemon's stop")
	}

	// The next start resumes that run and is stopped; then its control
	// socket is refused.
	os.Remove(filepath.Join(marks, "started"))
	svc.Config.Daemon.ControlSocket = filepath.Join(cfg.Daemon.RootDir, "control.d")
	if err := os.MkdirAll(svc.Config.Daemon.ControlSocket, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(plugin.FaultHoldStartEnv, "start-fetcher:resumed")
	sctx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	go func() {
		for sctx.Err() == nil {
			if _, err := os.Stat(filepath.Join(marks, "started")); err == nil {
				stopStart()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	stop, err = svc.StartFetcher(sctx)
	if err == nil {
		stop()
		t.Fatalf("StartFetcher served the control API on directory %s", svc.Config.Daemon.ControlSocket)
	}
	stacks := make([]byte, 4<<20)
	stacks = stacks[:runtime.Stack(stacks, true)]
	if bytes.Contains(stacks, []byte("(*Manager).launch.func")) {
		t.Errorf("StartFetcher returned %q while a run it resumed still runs:\n%s", err, stacks)
	}
}
