//go:build dm

package plugin_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
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
