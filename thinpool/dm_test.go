//go:build dm

package thinpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
)

const mib = 1 << 20

func TestDeviceLifecycle(t *testing.T) {
	ctx := context.Background()
	p, _ := testPool(t, 256*mib)

	st, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != ModeReadWrite || st.TotalDataBlocks != 256*mib/(64<<10) || st.UsedDataBlocks != 0 || !st.QueueIfNoSpace || st.ErrorIfNoSpace {
		t.Fatalf("fresh pool status %+v: want rw, %d data blocks, none used, queue_if_no_space", st, 256*mib/(64<<10))
	}

	if err := p.CreateThin(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "create_thin of a taken id", p.CreateThin(ctx, 1), ErrExists)
	wantErr(t, "create_thin above MaxThinID", p.CreateThin(ctx, MaxThinID+1), ErrInvalid)
	if ok, err := p.ThinExists(ctx, 1); err != nil || !ok {
		t.Fatalf("ThinExists(1) = %v, %v; want true", ok, err)
	}
	if ok, err := p.ThinExists(ctx, 2); err != nil || ok {
		t.Fatalf("ThinExists(2) = %v, %v; want false", ok, err)
	}
	if ids, err := p.ThinIDs(ctx); err != nil || !reflect.DeepEqual(ids, []uint32{1}) {
		t.Fatalf("ThinIDs = %v, %v; want [1]", ids, err)
	}

	name := p.name + "-dev1"
	path, err := p.Activate(ctx, name, 1, 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	if path != DevicePath(name) {
		t.Fatalf("Activate returned %q, want %q", path, DevicePath(name))
	}
	if size, err := deviceSize(path); err != nil || size != 64*mib {
		t.Fatalf("size of %s = %d, %v; want %d", path, size, err, 64*mib)
	}
	if again, err := p.Activate(ctx, name, 1, 64*mib); err != nil || again != path {
		t.Fatalf("second Activate = %q, %v; want the same path, no error", again, err)
	}
	if err := p.CreateThin(ctx, 2); err != nil {
		t.Fatal(err)
	}
	_, err = p.Activate(ctx, name, 2, 64*mib)
	wantErr(t, "activating a taken name with another id", err, ErrExists)
	if !strings.Contains(err.Error(), p.name) || !strings.Contains(err.Error(), name) {
		t.Fatalf("error %q does not name pool %q and device %q", err, p.name, name)
	}
	if ok, err := p.IsActive(ctx, name); err != nil || !ok {
		t.Fatalf("IsActive(%q) = %v, %v", name, ok, err)
	}

	d := openDirect(t, path)
	d.mustWrite(0, pattern(1, mib))
	ts, err := p.ThinStatus(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if ts.MappedSectors != mib/512 || !ts.HasMapped || ts.HighestMappedSector != mib/512-1 {
		t.Fatalf("thin status after writing 1 MiB: %+v", ts)
	}
	mustEqual(t, "read back", d.read(0, mib), pattern(1, mib))
	d.f.Close()

	devs, err := p.ActiveDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Name != name || devs[0].ThinID != 1 || devs[0].Sectors != 64*mib/512 || devs[0].Suspended {
		t.Fatalf("ActiveDevices = %+v", devs)
	}
	wantErr(t, "delete of an active device", p.Delete(ctx, 1), ErrBusy)

	// Busy while mounted: Deactivate gives up with ErrBusy.
	if err := Mkfs(ctx, path, FSExt4, nil); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(p.cfg.RootDir, "mnt-"+name)
	os.MkdirAll(mnt, 0o755)
	if err := unix.Mount(path, mnt, "ext4", 0, ""); err != nil {
		t.Fatalf("mount %s: %v", path, err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = p.Deactivate(short, name)
	cancel()
	wantErr(t, "deactivate while mounted", err, ErrBusy)
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}

	if err := p.Deactivate(ctx, name); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.IsActive(ctx, name); err != nil || ok {
		t.Fatalf("IsActive after Deactivate = %v, %v", ok, err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("node %s still present after Deactivate: %v", path, err)
	}
	if err := p.Deactivate(ctx, name); err != nil {
		t.Fatalf("Deactivate of an inactive device: %v", err)
	}
	wantErr(t, "deactivating the pool through Deactivate", p.Deactivate(ctx, p.name), ErrInvalid)

	for _, id := range []uint32{1, 2} {
		if err := p.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	wantErr(t, "delete of a deleted id", p.Delete(ctx, 1), ErrNotFound)
	wantErr(t, "create_snap of a missing origin", p.CreateSnap(ctx, 5, 1), ErrNotFound)
	_, err = p.Activate(ctx, name, 1, 64*mib)
	wantErr(t, "activate of a missing id", err, ErrNotFound)
	if ok, _ := p.IsActive(ctx, name); ok {
		t.Fatalf("failed Activate left device %q behind", name)
	}
	if ids, err := p.ThinIDs(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("ThinIDs after deleting everything = %v, %v", ids, err)
	}
	if st, err := p.Status(ctx); err != nil || st.UsedDataBlocks != 0 || st.HasHeldRoot {
		t.Fatalf("status after deleting everything: %+v, %v (want no data used, no held root)", st, err)
	}
}

func TestSnapshotCopyOnWrite(t *testing.T) {
	ctx := context.Background()
	p, _ := testPool(t, 256*mib)
	const size = 8 * mib
	originPath := activeThin(t, ctx, p, 10, p.name+"-origin", size)
	origin := openDirect(t, originPath)
	base := pattern(10, size)
	origin.mustWrite(0, base)

	// Snapshot of an active origin: suspended and resumed around the message.
	if err := p.CreateSnap(ctx, 11, 10); err != nil {
		t.Fatal(err)
	}
	devs, err := p.ActiveDevices(ctx)
	if err != nil || len(devs) != 1 || devs[0].Suspended {
		t.Fatalf("origin after CreateSnap: %+v, %v (want active, not suspended)", devs, err)
	}
	snapPath, err := p.Activate(ctx, p.name+"-snap", 11, size)
	if err != nil {
		t.Fatal(err)
	}
	snap := openDirect(t, snapPath)
	mustEqual(t, "snapshot right after create_snap vs origin", snap.read(0, size), base)

	// Write into the snapshot: the origin must not change, byte for byte.
	over := pattern(11, 3*mib)
	snap.mustWrite(mib+4096, over)
	mustEqual(t, "origin after writing its snapshot", origin.read(0, size), base)
	want := append([]byte(nil), base...)
	copy(want[mib+4096:], over)
	mustEqual(t, "snapshot after writing it", snap.read(0, size), want)

	// And the other way: writing the origin leaves the snapshot alone.
	originOver := pattern(12, 2*mib)
	origin.mustWrite(5*mib, originOver)
	mustEqual(t, "snapshot after writing its origin", snap.read(0, size), want)
	base2 := append([]byte(nil), base...)
	copy(base2[5*mib:], originOver)
	mustEqual(t, "origin after writing it", origin.read(0, size), base2)

	// A snapshot of the (now inactive) snapshot sees the same bytes.
	if err := p.Deactivate(ctx, p.name+"-snap"); err == nil {
		t.Fatal("Deactivate succeeded while the test holds the device open")
	} else {
		wantErr(t, "deactivate of an open device", err, ErrBusy)
	}
	snap.f.Close()
	if err := p.Deactivate(ctx, p.name+"-snap"); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateSnap(ctx, 12, 11); err != nil {
		t.Fatal(err)
	}
	snap2Path, err := p.Activate(ctx, p.name+"-snap2", 12, size)
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "snapshot of an inactive snapshot", openDirect(t, snap2Path).read(0, size), want)
	if ids, err := p.ThinIDs(ctx); err != nil || !reflect.DeepEqual(ids, []uint32{10, 11, 12}) {
		t.Fatalf("ThinIDs = %v, %v; want [10 11 12]", ids, err)
	}
}

func TestPoolFull(t *testing.T) {
	ctx := context.Background()
	p, _ := testPool(t, 32*mib) // 512 blocks of 64 KiB
	path := activeThin(t, ctx, p, 1, p.name+"-big", 64*mib)
	d := openDirect(t, path)
	chunk := pattern(1, mib)
	var writeErr error
	var written int64
	for off := int64(0); off < 64*mib; off += mib {
		if writeErr = d.write(off, chunk); writeErr != nil {
			break
		}
		written += mib
	}
	if writeErr == nil {
		t.Fatal("wrote 64 MiB into a 32 MiB pool without an error")
	}
	t.Logf("write failed after %d MiB: %v", written/mib, writeErr)
	st, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != ModeOutOfDataSpace || st.UsedDataBlocks != st.TotalDataBlocks {
		t.Fatalf("status of a filled pool: %+v; want out_of_data_space, all blocks used", st)
	}

	before := kernelDevices(t, p)
	err = p.CreateThin(ctx, 2)
	wantErr(t, "create_thin on a full pool", err, ErrDataFull)
	wantErr(t, "create_thin on a full pool", err, ErrPoolFull)
	if !strings.Contains(err.Error(), p.name) {
		t.Fatalf("error %q does not name the pool", err)
	}
	err = p.CreateSnap(ctx, 3, 1)
	wantErr(t, "create_snap on a full pool", err, ErrDataFull)
	if ids, err := p.ThinIDs(ctx); err != nil || !reflect.DeepEqual(ids, []uint32{1}) {
		t.Fatalf("ThinIDs after refused creates = %v, %v; want [1] (no half-made device)", ids, err)
	}
	if after := kernelDevices(t, p); !reflect.DeepEqual(before, after) {
		t.Fatalf("kernel devices changed by refused creates: %v -> %v", before, after)
	}

	// Freeing the space makes the pool usable again.
	d.f.Close()
	if err := p.Deactivate(ctx, p.name+"-big"); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateThin(ctx, 2); err != nil {
		t.Fatalf("create_thin after freeing the pool: %v", err)
	}
	if st, err := p.Status(ctx); err != nil || st.Mode != ModeReadWrite {
		t.Fatalf("status after freeing the pool: %+v, %v; want rw", st, err)
	}
}

// TestCreatesStopShortOfKernelMetadataReserve fills a tiny metadata device
// with thin devices, with no threshold of ours (100%), until the pool
// refuses: the refusal comes before the kernel's own reserve, so the pool
// stays rw (not read-only, not failed), lists every device made, and
// deletes and creates again.
func TestCreatesStopShortOfKernelMetadataReserve(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Name: "tp-metafull", RootDir: scratch.Dir(t, "tp-metafull-"),
		DataSize: 64 * mib, MetadataSize: 2 << 20, // 512 metadata blocks, the smallest Validate admits
		MetadataThreshold: 100}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	st, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var created []uint32
	var mostUsed uint64 // the most metadata blocks one create took
	for id := uint32(1); ; id++ {
		used := st.UsedMetadataBlocks
		if err = p.CreateThin(ctx, id); err != nil {
			break
		}
		created = append(created, id)
		if st, err = p.Status(ctx); err != nil {
			t.Fatal(err)
		}
		if st.UsedMetadataBlocks > used {
			mostUsed = max(mostUsed, st.UsedMetadataBlocks-used)
		}
		if id > 10000 {
			t.Fatal("10000 thin devices fit in 2 MiB of metadata")
		}
	}
	t.Logf("refused after %d thin devices (one create took at most %d metadata blocks): %v", len(created), mostUsed, err)
	wantErr(t, "create_thin with the metadata near the kernel's reserve", err, ErrMetadataReserve)
	wantErr(t, "create_thin with the metadata near the kernel's reserve", err, ErrMetadataFull)
	if errors.Is(err, ErrDataFull) {
		t.Fatalf("metadata exhaustion reported as data exhaustion: %v", err)
	}
	if !strings.Contains(err.Error(), p.name) {
		t.Fatalf("error %q does not name the pool", err)
	}
	if mostUsed >= createMetadataHeadroom {
		t.Fatalf("one create took %d metadata blocks, not under the %d kept for it", mostUsed, createMetadataHeadroom)
	}
	if st, err = p.Status(ctx); err != nil || st.Mode != ModeReadWrite || st.FullError() != nil {
		t.Fatalf("status of the refusing pool: %+v, %v; want rw", st, err)
	}
	if free, kernel := st.TotalMetadataBlocks-st.UsedMetadataBlocks, kernelMetadataReserve(st.TotalMetadataBlocks); free <= kernel || free > kernel+2*createMetadataHeadroom {
		t.Fatalf("refused with %d of %d metadata blocks free; want just above the kernel's %d", free, st.TotalMetadataBlocks, kernel)
	}
	ids, err := p.ThinIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ids, created) {
		t.Fatalf("ThinIDs of the refusing pool: %d ids (%v...), want the %d created", len(ids), ids[:min(5, len(ids))], len(created))
	}
	// A device gives back about the one block it took: deleting the last
	// 2*createMetadataHeadroom makes room for a create again.
	gone := created[len(created)-2*createMetadataHeadroom:]
	for _, id := range gone {
		if err := p.Delete(ctx, id); err != nil {
			t.Fatalf("delete %d at the kernel's reserve: %v", id, err)
		}
	}
	if err := p.CreateThin(ctx, gone[0]); err != nil {
		t.Fatalf("create_thin after %d deletes: %v", len(gone), err)
	}
}

func TestReopenAfterRestart(t *testing.T) {
	ctx := context.Background()
	p, cfg := testPool(t, 128*mib)
	for id := uint32(1); id <= 5; id++ {
		if err := p.CreateThin(ctx, id*1000); err != nil {
			t.Fatal(err)
		}
	}
	want := []uint32{1000, 2000, 3000, 4000, 5000, MaxThinID}
	path, err := p.Activate(ctx, p.name+"-a", 1000, 4*mib)
	if err != nil {
		t.Fatal(err)
	}
	data := pattern(7, 4*mib)
	d := openDirect(t, path)
	d.mustWrite(0, data)
	d.f.Close()
	if err := p.CreateSnap(ctx, MaxThinID, 1000); err != nil {
		t.Fatal(err)
	}
	if ids, err := p.ThinIDs(ctx); err != nil || !reflect.DeepEqual(ids, want) {
		t.Fatalf("ThinIDs = %v, %v; want %v", ids, err, want)
	}

	// Daemon restart: the pool stays active, a new Pool value adopts it.
	p.Close()
	p, err = Open(ctx, cfg)
	if err != nil {
		t.Fatalf("reopen of an active pool: %v", err)
	}
	if ids, err := p.ThinIDs(ctx); err != nil || !reflect.DeepEqual(ids, want) {
		t.Fatalf("ThinIDs after restart = %v, %v; want %v", ids, err, want)
	}
	if ok, err := p.IsActive(ctx, p.name+"-a"); err != nil || !ok {
		t.Fatalf("device lost across a daemon restart: %v, %v", ok, err)
	}

	// Reboot: devices and pool table gone, loop devices detached.
	simulateReboot(t, p)
	if _, err := p.ctl.info(cfg.Name); !errors.Is(err, unix.ENXIO) {
		t.Fatalf("pool still present after the simulated reboot: %v", err)
	}
	p, err = Open(ctx, cfg)
	if err != nil {
		t.Fatalf("reopen after reboot: %v", err)
	}
	if ids, err := p.ThinIDs(ctx); err != nil || !reflect.DeepEqual(ids, want) {
		t.Fatalf("ThinIDs after reboot = %v, %v; want %v", ids, err, want)
	}
	for _, id := range []uint32{1000, MaxThinID} {
		path, err := p.Activate(ctx, fmt.Sprintf("%s-r%d", p.name, id), id, 4*mib)
		if err != nil {
			t.Fatal(err)
		}
		mustEqual(t, fmt.Sprintf("thin %d after reboot", id), openDirect(t, path).read(0, 4*mib), data)
	}
}

func TestConcurrentCreateDelete(t *testing.T) {
	ctx := context.Background()
	p, _ := testPool(t, 512*mib)
	const n = 50
	const base = 100
	basePath := activeThin(t, ctx, p, base, p.name+"-base", 4*mib)
	openDirect(t, basePath).mustWrite(0, pattern(base, 256<<10))

	name := func(i int) string { return fmt.Sprintf("%s-c%02d", p.name, i) }
	run := func(f func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				errs[i] = f(i)
			}(i)
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	// Half fresh thin devices, half snapshots of the active base device.
	run(func(i int) error {
		id := uint32(base + 1 + i)
		var err error
		if i%2 == 0 {
			err = p.CreateThin(ctx, id)
		} else {
			err = p.CreateSnap(ctx, id, base)
		}
		if err != nil {
			return err
		}
		path, err := p.Activate(ctx, name(i), id, 4*mib)
		if err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteAt(pattern(int64(i), 64<<10), 64<<10)
		return errors.Join(err, f.Sync(), f.Close())
	})
	ids, err := p.ThinIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := p.ActiveDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != n+1 || len(devs) != n+1 {
		t.Fatalf("after creating %d: %d thin ids, %d active devices; want %d each", n, len(ids), len(devs), n+1)
	}
	for _, d := range devs {
		if !slices.Contains(ids, d.ThinID) {
			t.Fatalf("active device %s maps thin %d, absent from ThinIDs %v", d.Name, d.ThinID, ids)
		}
	}

	run(func(i int) error {
		if err := p.Deactivate(ctx, name(i)); err != nil {
			return err
		}
		return p.Delete(ctx, uint32(base+1+i))
	})
	ids, err = p.ThinIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	devs, err = p.ActiveDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ids, []uint32{base}) || len(devs) != 1 || devs[0].ThinID != base {
		t.Fatalf("after deleting %d: ThinIDs %v, active %+v; want only the base %d", n, ids, devs, base)
	}
	for _, k := range kernelDevices(t, p) {
		if strings.HasPrefix(k, p.name+"-c") || strings.HasPrefix(k, "thinpool-probe-") {
			t.Fatalf("kernel still lists device %q", k)
		}
	}
	leftover, _ := filepath.Glob(filepath.Join(MapperDir, p.name+"-c*"))
	if len(leftover) != 0 {
		t.Fatalf("nodes left in %s: %v", MapperDir, leftover)
	}
}

// TestExistingDevices runs a pool on block devices given in the config
// instead of its own loop files, through a restart and a reboot.
func TestExistingDevices(t *testing.T) {
	ctx := context.Background()
	dir := scratch.Dir(t, "tp-existing-")
	var devs []string
	for _, f := range []struct {
		name string
		size int64
	}{{"meta", 8 * mib}, {"data", 64 * mib}} {
		path := filepath.Join(dir, f.name)
		if err := makeSparse(path, f.size, true); err != nil {
			t.Fatal(err)
		}
		lf, err := attachLoop(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lf.Close() }) // autoclear detaches it after the pool is gone
		devs = append(devs, lf.Name())
	}
	cfg := Config{Name: "tp-existing", MetadataDevice: devs[0], DataDevice: devs[1]}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.ctl.remove(cfg.Name); err != nil && !errors.Is(err, unix.ENXIO) {
			t.Errorf("cleanup: %v", err)
		}
		removeNode(cfg.Name)
		os.RemoveAll(dir)
	})
	if st, err := p.Status(ctx); err != nil || st.TotalDataBlocks != 64*mib/(64<<10) {
		t.Fatalf("status %+v, %v; want %d data blocks", st, err, 64*mib/(64<<10))
	}
	for _, id := range []uint32{3, 4} {
		if err := p.CreateThin(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	if p, err = Open(ctx, cfg); err != nil {
		t.Fatalf("reopen of the active pool: %v", err)
	}
	simulateReboot(t, p)
	if p, err = Open(ctx, cfg); err != nil {
		t.Fatalf("reopen after reboot: %v", err)
	}
	if ids, err := p.ThinIDs(ctx); err != nil || !reflect.DeepEqual(ids, []uint32{3, 4}) {
		t.Fatalf("ThinIDs = %v, %v; want [3 4]", ids, err)
	}
	other := cfg
	other.MetadataDevice, other.DataDevice = devs[1], devs[0]
	if _, err := Open(ctx, other); !errors.Is(err, ErrExists) {
		t.Fatalf("adopting the pool with another metadata device: got %v, want ErrExists", err)
	}
}

func TestMkfsXFS(t *testing.T) {
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Fatalf("mkfs.xfs not installed: %v", err)
	}
	ctx := context.Background()
	p, _ := testPool(t, 1024*mib)
	path := activeThin(t, ctx, p, 1, p.name+"-x", 512*mib)
	if err := Mkfs(ctx, path, FSXFS, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateSnap(ctx, 2, 1); err != nil {
		t.Fatal(err)
	}
	snap, err := p.Activate(ctx, p.name+"-xs", 2, 512*mib)
	if err != nil {
		t.Fatal(err)
	}
	// Both carry the same filesystem UUID: mounting both needs nouuid.
	var mnts []string
	for i, dev := range []string{path, snap} {
		mnt := filepath.Join(p.cfg.RootDir, fmt.Sprintf("mnt-%s-%d", p.name, i))
		os.MkdirAll(mnt, 0o755)
		if err := unix.Mount(dev, mnt, "xfs", 0, strings.Join(MountOptions(FSXFS, false), ",")); err != nil {
			t.Fatalf("mount %s with %v: %v", dev, MountOptions(FSXFS, false), err)
		}
		mnts = append(mnts, mnt)
	}
	for _, m := range mnts {
		if err := unix.Unmount(m, 0); err != nil {
			t.Fatal(err)
		}
	}
}
