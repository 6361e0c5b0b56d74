//go:build dm

package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
)

// scrapeSum sums the samples of every metric whose series starts with
// prefix (0 when there is none).
func scrapeSum(t *testing.T, addr, prefix string) float64 {
	t.Helper()
	sum, _, err := stack.MetricSum(context.Background(), addr, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// poolStatusJSON runs `pool status --format json` against cfgPath.
func poolStatusJSON(t *testing.T, cfgPath string) poolStatusView {
	t.Helper()
	code, out, errOut := runCommand(t, nil, "pool", "status", "--config", cfgPath, "--format", "json")
	if code != 0 {
		t.Fatalf("pool status = %d, %q, %q", code, out, errOut)
	}
	var v poolStatusView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("pool status output %q: %v", out, err)
	}
	return v
}

// TestPullGrowsPoolAtLowWater: with pool.max_data_size set, a pull whose
// unpacking crosses the low-water mark makes the daemon grow the loop-file
// pool online (the event is counted, the table reloaded: `pool status`
// shows the larger size) and the pull succeeds.
func TestPullGrowsPoolAtLowWater(t *testing.T) {
	const (
		dataSize = 256 << 20
		blocks   = dataSize / (64 << 10)
	)
	e := newPullEnvTB(t, func(c *plugin.Config) {
		c.Pool.DataSize = dataSize
		c.Pool.MaxDataSize = 1 << 30
		c.Pool.GrowthReserve = 64 << 20
		c.Pool.LowWaterMark = blocks * 6 / 10 // an image of 120 MiB crosses it
		c.Daemon.MetricsAddress = stack.AnyLoopbackPort
	})
	before := poolStatusJSON(t, e.cfgPath)
	if before.DataTotalBytes != dataSize || before.LowWaterBlocks != blocks*6/10 || before.LoopFilesVirtualBytes == 0 || before.BackingFSFreeBytes == 0 {
		t.Fatalf("pool status before the pull: %+v; want %d bytes of data, low-water mark %d, the loop files' figures", before, dataSize, blocks*6/10)
	}
	r := rand.New(rand.NewPCG(15, 16))
	body := make([]byte, 2<<20)
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	e.srv.Put(t, "big.tar", bulkLayer(t, "big", body, 60))
	start := time.Now()
	res, err := e.pull("big.tar", "big")
	if err != nil {
		t.Fatalf("pull crossing the low-water mark: %v", err)
	}
	t.Logf("pulled %s in %v", res.ImageID, time.Since(start).Round(time.Millisecond))
	var after poolStatusView
	for deadline := time.Now().Add(60 * time.Second); ; {
		after = poolStatusJSON(t, e.cfgPath)
		if after.DataTotalBytes > dataSize || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("pool status after: data %d/%d bytes, mode %s, low-water mark %d blocks, loop files %d virtual, %d free",
		after.DataUsedBytes, after.DataTotalBytes, after.Mode, after.LowWaterBlocks, after.LoopFilesVirtualBytes, after.BackingFSFreeBytes)
	if after.DataTotalBytes <= dataSize || after.Mode != "rw" {
		t.Fatalf("pool status after the pull: %+v; want more than %d bytes of data, rw", after, dataSize)
	}
	if after.DataUsedBytes < 120<<20 {
		t.Fatalf("pool holds %d bytes after a 120 MiB pull", after.DataUsedBytes)
	}
	events := scrapeSum(t, e.d.metrics, "flyio_snapshotter_pool_low_water_events_total")
	growths := scrapeSum(t, e.d.metrics, "flyio_snapshotter_pool_growths_total")
	grown := scrapeSum(t, e.d.metrics, "flyio_snapshotter_pool_grown_bytes_total")
	free := scrapeSum(t, e.d.metrics, "flyio_snapshotter_pool_backing_fs_free_bytes")
	t.Logf("metrics: %v low-water events, %v growths, %v bytes grown, %v bytes free on the loop files' filesystem", events, growths, grown, free)
	if events < 1 || growths < 1 || uint64(grown) != after.DataTotalBytes-dataSize || free <= 0 {
		t.Fatalf("metrics: %v low-water events, %v growths, %v bytes grown, %v free; want at least one event and growth, %d bytes grown",
			events, growths, grown, free, after.DataTotalBytes-dataSize)
	}
	if got := e.readActive(res, "big/marker"); got != "big" {
		t.Fatalf("big/marker in the activation after the growth = %q, want \"big\"", got)
	}
	e.checkClean()
}

// TestContainerWritesThroughGrowth: with pool.max_data_size set, a
// container writing steadily past the pool's size never sees an error: at
// the low-water event (the reserve's edge) the daemon grows the pool, and
// a write that finds the pool full meanwhile waits instead of failing.
// The growths are logged with the time the writer took.
func TestContainerWritesThroughGrowth(t *testing.T) {
	const dataSize = 256 << 20
	e := newPullEnvTB(t, func(c *plugin.Config) {
		c.Pool.DataSize = dataSize
		c.Pool.MaxDataSize = 1 << 30
		c.Pool.GrowthReserve = 64 << 20
		c.Daemon.MetricsAddress = stack.AnyLoopbackPort
	})
	r := rand.New(rand.NewPCG(15, 18))
	body := make([]byte, 2<<20)
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	e.srv.Put(t, "w.tar", bulkLayer(t, "w", body, 2))
	res, err := e.pull("w.tar", "w")
	if err != nil {
		t.Fatal(err)
	}
	sn := dmtest.DialProxy(t, e.cfg.Daemon.Socket)
	nctx := namespaces.WithNamespace(context.Background(), "default")
	ms, err := sn.Prepare(nctx, "writer", res.TopChainID)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "w")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mount.All(ms, dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.UnmountAll(dir, 0) })
	start := time.Now()
	// 320 MiB: more than the pool's first size, less than the file system.
	if out, err := shellRun(t, "dd if=/dev/zero of="+dir+"/big bs=1M count=320 conv=fsync"); err != nil {
		t.Fatalf("container writing past the pool's first size: %v: %s", err, out)
	}
	took := time.Since(start)
	v := poolStatusJSON(t, e.cfgPath)
	growths := scrapeSum(t, e.d.metrics, "flyio_snapshotter_pool_growths_total")
	t.Logf("wrote 320 MiB in %v; the pool grew %v times to %d bytes, mode %s, %d used", took.Round(time.Millisecond), growths, v.DataTotalBytes, v.Mode, v.DataUsedBytes)
	if v.DataTotalBytes <= dataSize || v.Mode != "rw" || growths < 1 || v.WritesFailing {
		t.Fatalf("pool status after the write: %+v, %v growths; want grown, rw", v, growths)
	}
	if out, err := shellRun(t, "grep ' "+dir+" ' /proc/mounts"); err != nil || !strings.Contains(out, " rw,") {
		t.Fatalf("the writer's file system after the growth: %q, %v; want mounted rw", out, err)
	}
}
