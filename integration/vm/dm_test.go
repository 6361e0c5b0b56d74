//go:build dm

package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
)

// Sizes of the pool every test here builds; the expected block counts are
// derived from them.
const (
	blockSectors = 128 // 64 KiB pool blocks
	blockBytes   = blockSectors * 512
	dataBytes    = 256 << 20
	metaBytes    = 16 << 20
	thinSectors  = 1 << 21 // 1 GiB virtual size
)

// scratchDir returns a fresh folder under $VM_SCRATCH (tmpfs inside the
// harness), removed when the test ends. Without the harness the test fails:
// dm tests are never skipped.
func scratchDir(t *testing.T) string {
	t.Helper()
	dir := scratch.Dir(t, "vmtest-")
	return dir
}

// run executes a host tool inside the guest and returns its trimmed stdout;
// a failure reports the command and its stderr.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String())
}

// TestControlNodeAnswersVersionIoctl checks that /dev/mapper/control exists
// without udev and that the kernel answers DM_VERSION issued from pure Go,
// the path the thinpool package uses.
func TestControlNodeAnswersVersionIoctl(t *testing.T) {
	fi, err := os.Stat("/dev/mapper/control")
	if err != nil {
		t.Fatalf("device-mapper control node: %v", err)
	}
	if fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("/dev/mapper/control is %v, want a character device", fi.Mode())
	}
	f, err := os.OpenFile("/dev/mapper/control", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open /dev/mapper/control: %v", err)
	}
	defer f.Close()

	buf := make([]byte, 16<<10)
	hdr := (*unix.DmIoctl)(unsafe.Pointer(&buf[0]))
	hdr.Version = [3]uint32{4, 0, 0}
	hdr.Data_size = uint32(len(buf))
	hdr.Data_start = uint32(unsafe.Sizeof(unix.DmIoctl{}))
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.DM_VERSION, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		t.Fatalf("DM_VERSION ioctl on /dev/mapper/control: %v", errno)
	}
	if hdr.Version[0] != 4 {
		t.Fatalf("device-mapper interface version %v, want major 4", hdr.Version)
	}
	t.Logf("device-mapper interface %d.%d.%d", hdr.Version[0], hdr.Version[1], hdr.Version[2])
}

// poolStatus is the part of a thin-pool status line the test checks:
// "<start> <len> thin-pool <transaction> <meta used>/<total> <data used>/<total> ... <rw|ro|out_of_data_space> ...".
type poolStatus struct {
	metaUsed, metaTotal, dataUsed, dataTotal uint64
	mode                                     string
}

func parsePoolStatus(line string) (poolStatus, error) {
	f := strings.Fields(line)
	if len(f) < 8 || f[2] != "thin-pool" {
		return poolStatus{}, fmt.Errorf("thin-pool status %q: want '<start> <len> thin-pool <tx> <meta> <data> ...'", line)
	}
	var s poolStatus
	var err error
	if s.metaUsed, s.metaTotal, err = usedTotal(f[4]); err != nil {
		return s, fmt.Errorf("thin-pool status %q: metadata field: %w", line, err)
	}
	if s.dataUsed, s.dataTotal, err = usedTotal(f[5]); err != nil {
		return s, fmt.Errorf("thin-pool status %q: data field: %w", line, err)
	}
	s.mode = f[7]
	return s, nil
}

func usedTotal(field string) (uint64, uint64, error) {
	u, tot, ok := strings.Cut(field, "/")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not <used>/<total>", field)
	}
	a, err := strconv.ParseUint(u, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("used blocks %q: %w", u, err)
	}
	b, err := strconv.ParseUint(tot, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("total blocks %q: %w", tot, err)
	}
	return a, b, nil
}

// TestLoopBackedThinPool builds a thin pool on two sparse loop-backed files
// with dmsetup, writes through a thin device, and checks what the kernel
// reports: the provisioned blocks match the bytes written, the thin device
// maps exactly those sectors, the data reads back, and deleting the thin
// device returns every block to the pool.
func TestLoopBackedThinPool(t *testing.T) {
	dir := scratchDir(t)
	name := fmt.Sprintf("vmtest-%d", os.Getpid())
	pool, thin := name+"-pool", name+"-thin"

	loop := func(file string, size int64) string {
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
		dev := run(t, "losetup", "-f", "--show", path)
		t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
		return dev
	}
	meta := loop("meta", metaBytes)
	data := loop("data", dataBytes)

	table := fmt.Sprintf("0 %d thin-pool %s %s %d 16 1 skip_block_zeroing", dataBytes/512, meta, data, blockSectors)
	run(t, "dmsetup", "create", pool, "--table", table)
	t.Cleanup(func() { _ = exec.Command("dmsetup", "remove", pool).Run() })
	run(t, "dmsetup", "message", pool, "0", "create_thin 7")
	run(t, "dmsetup", "create", thin, "--table", fmt.Sprintf("0 %d thin /dev/mapper/%s 7", thinSectors, pool))
	removeThin := func() { _ = exec.Command("dmsetup", "remove", thin).Run() }
	t.Cleanup(removeThin)

	before, err := parsePoolStatus(run(t, "dmsetup", "status", pool))
	if err != nil {
		t.Fatal(err)
	}
	if before.dataTotal != dataBytes/blockBytes || before.dataUsed != 0 || before.mode != "rw" {
		t.Fatalf("fresh pool status %+v, want 0/%d data blocks used, mode rw", before, dataBytes/blockBytes)
	}

	// 4 MiB plus one byte at a 64 KiB-aligned offset: 65 blocks provisioned.
	const offset = 3 * blockBytes
	payload := make([]byte, 4<<20+1)
	for i := range payload {
		payload[i] = byte(i*7 + i>>9)
	}
	wantBlocks := uint64((len(payload) + blockBytes - 1) / blockBytes)
	dev := "/dev/mapper/" + thin
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open thin device (made without udev): %v", err)
	}
	if _, err := f.WriteAt(payload, offset); err != nil {
		t.Fatalf("write %s: %v", dev, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", dev, err)
	}
	f.Close()

	after, err := parsePoolStatus(run(t, "dmsetup", "status", pool))
	if err != nil {
		t.Fatal(err)
	}
	if after.dataUsed != wantBlocks {
		t.Fatalf("pool data blocks used after writing %d bytes: %d, want %d", len(payload), after.dataUsed, wantBlocks)
	}
	if after.metaUsed == 0 || after.metaUsed > after.metaTotal {
		t.Fatalf("pool metadata blocks used %d of %d, want between 1 and the total", after.metaUsed, after.metaTotal)
	}
	// thin status: "<start> <len> thin <mapped sectors> <highest mapped sector>"
	ts := strings.Fields(run(t, "dmsetup", "status", thin))
	if len(ts) < 5 || ts[2] != "thin" {
		t.Fatalf("thin status %q: want '<start> <len> thin <mapped> <highest>'", strings.Join(ts, " "))
	}
	mapped, _ := strconv.ParseUint(ts[3], 10, 64)
	highest, _ := strconv.ParseUint(ts[4], 10, 64)
	if mapped != wantBlocks*blockSectors || highest != offset/512+wantBlocks*blockSectors-1 {
		t.Fatalf("thin status mapped=%d highest=%d, want mapped=%d highest=%d",
			mapped, highest, wantBlocks*blockSectors, offset/512+wantBlocks*blockSectors-1)
	}

	// Read back through a fresh descriptor, after dropping the page cache.
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatalf("drop caches: %v", err)
	}
	got := make([]byte, len(payload))
	f, err = os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(got, offset); err != nil {
		t.Fatalf("read %s: %v", dev, err)
	}
	hole := make([]byte, blockBytes)
	if _, err := f.ReadAt(hole, 0); err != nil {
		t.Fatalf("read %s: %v", dev, err)
	}
	f.Close()
	if !bytes.Equal(got, payload) {
		t.Fatal("data read back from the thin device differs from what was written")
	}
	if !bytes.Equal(hole, make([]byte, blockBytes)) {
		t.Fatal("an unprovisioned block of the thin device does not read as zeroes")
	}

	removeThin()
	run(t, "dmsetup", "message", pool, "0", "delete 7")
	final, err := parsePoolStatus(run(t, "dmsetup", "status", pool))
	if err != nil {
		t.Fatal(err)
	}
	if final.dataUsed != 0 {
		t.Fatalf("pool data blocks used after deleting the only thin device: %d, want 0", final.dataUsed)
	}
}

// TestSmokeScript runs smoke.sh (the harness's own end-to-end check: pool,
// thin device, ext4, mount, write, remount, read) and requires its final OK.
func TestSmokeScript(t *testing.T) {
	t.Setenv("VM_SCRATCH", scratchDir(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "./smoke.sh").CombinedOutput()
	t.Logf("smoke.sh output:\n%s", out)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("smoke.sh exited %d", ee.ExitCode())
	}
	if err != nil {
		t.Fatalf("smoke.sh: %v", err)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(out)), "smoke: OK") {
		t.Fatal("smoke.sh did not end with 'smoke: OK'")
	}
}
