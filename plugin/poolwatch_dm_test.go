//go:build dm

package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// TestDaemonGrowsPoolAlreadyUnderLowWater: a pool that crossed its
// low-water mark while the daemon was down (the kernel raises that event
// once, and nobody heard it) is grown once the daemon starts watching, so
// new devices are accepted again without any further write.
func TestDaemonGrowsPoolAlreadyUnderLowWater(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const id = 4000
	svc := openUnderLowWater(ctx, t, id, nil)
	st, err := svc.Pool.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := svc.Pool.LowWaterBlocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if free := st.TotalDataBlocks - st.UsedDataBlocks; free > lw {
		t.Fatalf("pool %d of %d blocks used, %d free: not under its %d-block mark", st.UsedDataBlocks, st.TotalDataBlocks, free, lw)
	}
	if err := svc.Pool.CreateThin(ctx, id+1); !errors.Is(err, thinpool.ErrBelowReserve) {
		t.Fatalf("create_thin under the reserve = %v; want ErrBelowReserve before the daemon grows the pool", err)
	}

	stop, err := svc.StartFetcher(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, err = svc.Pool.Status(ctx); err != nil {
			t.Fatal(err)
		}
		if st.TotalDataBlocks > 1024 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st.TotalDataBlocks != 1280 {
		t.Fatalf("pool %d blocks 30 s after the daemon started watching; want 1280 (grown from 64 to 80 MiB)", st.TotalDataBlocks)
	}
	if err := svc.Pool.CreateThin(ctx, id+1); err != nil {
		t.Fatalf("create_thin once the pool grew: %v", err)
	}
	if err := svc.Pool.Delete(ctx, id+1); err != nil {
		t.Fatal(err)
	}
}

// openUnderLowWater opens a service (its configuration changed by edit,
// when given) on a 64 MiB pool allowed to grow to 128 MiB, with GC off and
// a local S3 server, and, while nothing watches the pool, fills thin
// device id (activated, 128 MiB) with 60 MiB: the pool is then under its
// low-water mark. The service is closed when the test ends.
func openUnderLowWater(ctx context.Context, t *testing.T, id uint32, edit func(*plugin.Config)) *plugin.Service {
	t.Helper()
	cfg := dmtest.Config(t)
	exec.Command("ip", "link", "set", "lo", "up").Run()
	srv := s3test.NewServer(t)
	cfg.S3.Region, cfg.S3.Endpoint, cfg.S3.PathStyle, cfg.S3.Anonymous = "us-east-1", srv.URL, true, true
	cfg.Pool.DataSize, cfg.Pool.MaxDataSize, cfg.Pool.GrowthReserve = 64<<20, 128<<20, 1<<20 // 1024 blocks of 64 KiB
	cfg.GC.Enabled = false
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, err := plugin.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	path, err := func() (string, error) {
		if err := svc.Pool.CreateThin(ctx, id); err != nil {
			return "", err
		}
		return svc.Pool.Activate(ctx, fmt.Sprintf("lowwater-filler-%d", id), id, 128<<20)
	}()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20+4096)
	off := (4096 - int(uintptr(unsafe.Pointer(&buf[0]))&4095)) & 4095
	chunk := buf[off : off+1<<20]
	for i := range chunk {
		chunk[i] = byte(i)
	}
	for pos := int64(0); pos < 60<<20; pos += 1 << 20 {
		if _, err := f.WriteAt(chunk, pos); err != nil {
			t.Fatal(err)
		}
	}
	return svc
}
