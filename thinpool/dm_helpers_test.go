//go:build dm

package thinpool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// Tests in files tagged dm need real device-mapper and root: they run inside
// the VM harness (integration/vm/suite.sh), never on a plain host.

// testNoSpaceTimeout is the no-space timeout the test pools set.
const testNoSpaceTimeout = 2 * time.Second

// testPool opens a fresh loop-file pool under $VM_SCRATCH and removes it,
// its devices and files when the test ends.
func testPool(t testing.TB, dataSize int64) (*Pool, Config) {
	t.Helper()
	name := "tp-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if len(name) > 40 {
		name = name[:40]
	}
	cfg := Config{
		Name:         name,
		RootDir:      scratch.Dir(t, name+"-"),
		DataSize:     conf.Size(dataSize),
		MetadataSize: 16 << 20,
		// Writes on a full pool wait this long before they fail: short,
		// so the tests that fill a pool do not wait the kernel's minute.
		NoSpaceTimeout: conf.D(testNoSpaceTimeout),
	}
	p, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	if err := p.Adjust(context.Background()); err != nil {
		t.Fatalf("Adjust: %v", err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	return p, cfg
}

// destroyPool removes every device on the pool, the pool and its files.
func destroyPool(t testing.TB, cfg Config) {
	t.Helper()
	ctx := context.Background()
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Errorf("cleanup: reopen %q: %v", cfg.Name, err)
		return
	}
	devs, err := p.ActiveDevices(ctx)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, d := range devs {
		unix.Unmount(filepath.Join(cfg.RootDir, "mnt-"+d.Name), unix.MNT_DETACH)
		if err := p.Deactivate(ctx, d.Name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	if err := p.ctl.remove(p.name); err != nil {
		t.Errorf("cleanup: remove pool %q: %v", p.name, err)
	}
	removeNode(p.name)
	if err := os.RemoveAll(cfg.RootDir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// simulateReboot does what a reboot does to the pool: every thin device
// and the pool table vanish (the loop devices detach with them); the files
// stay.
func simulateReboot(t *testing.T, p *Pool) {
	t.Helper()
	ctx := context.Background()
	devs, err := p.ActiveDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if err := p.Deactivate(ctx, d.Name); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.ctl.remove(p.name); err != nil {
		t.Fatalf("remove pool table: %v", err)
	}
	removeNode(p.name)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// directIO reads and writes a block device with O_DIRECT, so no page cache
// can hide what the device really holds.
type directIO struct {
	t *testing.T
	f *os.File
}

func openDirect(t *testing.T, path string) *directIO {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatalf("open %s O_DIRECT: %v", path, err)
	}
	t.Cleanup(func() { f.Close() })
	return &directIO{t: t, f: f}
}

func alignedBlock(n int) []byte {
	raw := make([]byte, n+4096)
	off := int(uintptr(unsafe.Pointer(&raw[0])) & 4095)
	if off != 0 {
		off = 4096 - off
	}
	return raw[off : off+n]
}

func (d *directIO) write(off int64, data []byte) error {
	buf := alignedBlock(len(data))
	copy(buf, data)
	_, err := d.f.WriteAt(buf, off)
	return err
}

func (d *directIO) mustWrite(off int64, data []byte) {
	d.t.Helper()
	if err := d.write(off, data); err != nil {
		d.t.Fatalf("write %d bytes at %d to %s: %v", len(data), off, d.f.Name(), err)
	}
}

func (d *directIO) read(off int64, n int) []byte {
	d.t.Helper()
	buf := alignedBlock(n)
	if _, err := d.f.ReadAt(buf, off); err != nil {
		d.t.Fatalf("read %d bytes at %d from %s: %v", n, off, d.f.Name(), err)
	}
	return append([]byte(nil), buf...)
}

func pattern(seed int64, n int) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// firstDiff describes where a and b differ.
func firstDiff(a, b []byte) string {
	if len(a) != len(b) {
		return fmt.Sprintf("lengths %d and %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d (%#x vs %#x)", i, a[i], b[i])
		}
	}
	return "equal"
}

func mustEqual(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %s", what, firstDiff(got, want))
	}
}

// kernelDevices returns the names of every dm device except the pools of
// other tests (which start with "tp-" and are not ours).
func kernelDevices(t *testing.T, p *Pool) []string {
	t.Helper()
	l, err := p.ctl.list()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range l {
		out = append(out, e.Name)
	}
	sort.Strings(out)
	return out
}

func wantErr(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got error %v, want %v", what, err, kind)
	}
}

// activeThin creates thin device id in p and activates it as name, of
// size bytes, and returns the device's path.
func activeThin(t *testing.T, ctx context.Context, p *Pool, id uint32, name string, size int64) string {
	t.Helper()
	if err := p.CreateThin(ctx, id); err != nil {
		t.Fatal(err)
	}
	path, err := p.Activate(ctx, name, id, size)
	if err != nil {
		t.Fatal(err)
	}
	return path
}
