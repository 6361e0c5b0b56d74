//go:build dm

package snapshotter

import (
	"bytes"
	"context"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestCleanupLeavesOpenDeviceIntact: a removed snapshot whose device a
// process still holds open without O_EXCL (a VM using an activation's
// device path as its disk) keeps its data through Cleanup with
// pool.discard_blocks: the device is neither discarded nor deleted until
// it is let go (each Cleanup trying briefly, not for the pool's whole busy
// retry), and the Cleanup after that deletes it.
func TestCleanupLeavesOpenDeviceIntact(t *testing.T) {
	e := newTestEnv(t, "do")
	ctx := nsCtx("default")
	s := e.newSnapshotter(t, Config{AsyncRemove: true, DiscardBlocks: true})
	if _, err := s.Prepare(ctx, "vm-disk", ""); err != nil {
		t.Fatal(err)
	}
	_, path, id, err := s.DeviceOf(ctx, "vm-disk")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	const off, n = 1 << 20, 4096
	raw := make([]byte, 2*n)
	buf := raw[n-int(uintptr(unsafe.Pointer(&raw[0]))%n):][:n] // O_DIRECT wants an aligned buffer
	for i := range buf {
		buf[i] = 0xA5
	}
	want := bytes.Clone(buf)
	if _, err := unix.Pwrite(fd, buf, off); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}

	if err := s.Remove(ctx, "vm-disk"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Cleanup(context.Background()); err == nil {
		t.Error("Cleanup deleted a device a process holds open")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Cleanup took %v over one removed device held open: it waits out the pool's busy retry", took.Round(time.Millisecond))
	}
	clear(buf)
	if _, err := unix.Pread(fd, buf, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, want) {
		t.Fatalf("the open device's data was destroyed by the Cleanup of its removed snapshot: read %x..., wrote %x...", buf[:8], want[:8])
	}

	unix.Close(fd)
	fd = -1
	if err := s.Cleanup(context.Background()); err != nil {
		t.Fatalf("Cleanup once the device is let go: %v", err)
	}
	if ok, err := e.pool.ThinExists(context.Background(), id); err != nil || ok {
		t.Errorf("thin %d still in the pool after the Cleanup that followed its release: %v, %v", id, ok, err)
	}
}
