//go:build dm

package thinpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// TestLowWaterEventGrowsPool: writes crossing the low-water mark raise a
// device-mapper event that Watch reports; Grow at that event extends the
// loop file, the loop device and the live table, so the writes go on past
// the pool's first size, and the next event comes at the new size's mark.
func TestLowWaterEventGrowsPool(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{Name: "tp-lowwater", RootDir: scratch.Dir(t, "tp-lowwater-"),
		DataSize: 32 * mib, MetadataSize: 16 << 20, MaxDataSize: 48 * mib, GrowthReserve: mib,
		LowWaterMark: 256} // half of the 512 blocks
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	if tbl, _, err := p.liveTable(); err != nil || tbl.LowWater != 256 {
		t.Fatalf("live table low-water mark = %d, %v; want 256", tbl.LowWater, err)
	}

	type seen struct {
		ev Event
		g  Growth
	}
	events := make(chan seen, 8)
	go p.Watch(ctx, func(ctx context.Context, ev Event) {
		s := seen{ev: ev}
		if ev.LowWater {
			g, err := p.Grow(ctx)
			if err != nil {
				t.Errorf("Grow at event %d: %v", ev.EventNr, err)
			}
			s.g = g
		}
		events <- s
	})

	path := activeThin(t, ctx, p, 1, "tp-lowwater-1", 128*mib)
	d := openDirect(t, path)
	chunk := pattern(7, mib)
	for off := int64(0); off < 20*mib; off += mib { // past 16 MiB: under 256 free blocks
		d.mustWrite(off, chunk)
	}
	var s seen
	select {
	case s = <-events:
	case <-time.After(30 * time.Second):
		t.Fatal("no device-mapper event within 30 s of crossing the low-water mark")
	}
	t.Logf("event %d: low water %v, status %d/%d blocks, growth %+v", s.ev.EventNr, s.ev.LowWater,
		s.ev.Status.UsedDataBlocks, s.ev.Status.TotalDataBlocks, s.g)
	if !s.ev.LowWater || !s.g.Grew() || s.g.From != 32*mib || s.g.To != 40*mib {
		t.Fatalf("event %+v, growth %+v; want a low-water event and growth from 32 to 40 MiB", s.ev, s.g)
	}
	st, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TotalDataBlocks != 40*mib/(64<<10) || st.Mode != ModeReadWrite {
		t.Fatalf("status after growth: %+v; want 640 blocks, rw", st)
	}
	if fi, err := os.Stat(filepath.Join(cfg.RootDir, DataFileName)); err != nil || fi.Size() != 40*mib {
		t.Fatalf("data file after growth: %v, %v; want 40 MiB", fi, err)
	}
	// Past the first size: these blocks exist only because the pool grew.
	for off := int64(20 * mib); off < 36*mib; off += mib {
		d.mustWrite(off, chunk)
	}
	mustEqual(t, "block written after growth", d.read(35*mib, mib), chunk)

	// The reload re-armed the mark (now 256 of 640 blocks): the writes
	// above crossed it again, and the pool grows to its maximum.
	select {
	case s = <-events:
	case <-time.After(30 * time.Second):
		t.Fatal("no second event after the writes crossed the new low-water mark")
	}
	if !s.ev.LowWater || s.g.To != 48*mib {
		t.Fatalf("second event %+v, growth %+v; want growth to the 48 MiB maximum", s.ev, s.g)
	}
	g, err := p.Grow(ctx)
	if err != nil || g.Grew() || g.Reason == "" {
		t.Fatalf("Grow at the maximum = %+v, %v; want no growth with a reason", g, err)
	}
	t.Logf("at the maximum: %s", g.Reason)
	b, err := p.Backing(ctx)
	if err != nil || !b.Loop || b.Virtual != 48*mib+16<<20 || b.FSFree == 0 {
		t.Fatalf("Backing = %+v, %v; want the loop files' 64 MiB and the tmpfs's free space", b, err)
	}
}

// TestGrowthKeepsFilesystemReserve: growth never takes the filesystem's
// free space below the reserve, counting what the sparse files may still
// claim.
func TestGrowthKeepsFilesystemReserve(t *testing.T) {
	ctx := context.Background()
	dir := scratch.Dir(t, "tp-reserve-")
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	free := int64(fs.Bavail) * int64(fs.Bsize)
	cfg := Config{Name: "tp-reserve", RootDir: dir,
		DataSize: 32 * mib, MetadataSize: 16 << 20, MaxDataSize: 1 << 40,
		GrowthReserve: conf.Size(free - 48*mib - 4*mib)} // room for the files' 48 MiB and 4 MiB more
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	g, err := p.Grow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Grew() || g.To > 36*mib || g.To < 35*mib {
		t.Fatalf("Grow = %+v; want about 4 MiB added (the room beyond the reserve), not the 8 MiB step", g)
	}
	g, err = p.Grow(ctx)
	if err != nil || g.Grew() {
		t.Fatalf("second Grow = %+v, %v; want none: the reserve is reached", g, err)
	}
	t.Logf("refused: %s", g.Reason)
}

// TestMetadataThresholdKeepsDeletes: past the metadata threshold new devices
// are refused with ErrMetadataReserve while the pool stays rw and deletes
// work, which frees the metadata for new devices again.
func TestMetadataThresholdKeepsDeletes(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Name: "tp-metathreshold", RootDir: scratch.Dir(t, "tp-metathreshold-"),
		DataSize: 64 * mib, MetadataSize: 2 << 20, MetadataThreshold: 60}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	var id uint32
	for id = 1; ; id++ {
		if err = p.CreateThin(ctx, id); err != nil {
			break
		}
		if id > 10000 {
			t.Fatal("10000 thin devices fit in 2 MiB of metadata")
		}
	}
	t.Logf("refused after %d devices: %v", id-1, err)
	wantErr(t, "create_thin past the threshold", err, ErrMetadataReserve)
	wantErr(t, "create_thin past the threshold", err, ErrPoolFull)
	st, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if used := 100 * float64(st.UsedMetadataBlocks) / float64(st.TotalMetadataBlocks); st.Mode != ModeReadWrite || used < 60 || used > 90 {
		t.Fatalf("status at the threshold: %+v (%.1f%% metadata); want rw, at 60%% and well short of full", st, used)
	}
	for d := uint32(1); d < id; d++ {
		if err := p.Delete(ctx, d); err != nil {
			t.Fatalf("delete %d at the metadata threshold: %v", d, err)
		}
	}
	if err := p.CreateThin(ctx, id); err != nil {
		t.Fatalf("create_thin after the deletes: %v", err)
	}
}

// TestFullPoolSparesOtherDevices: a device that fills the pool has its
// write wait for the no-space timeout (the status says writes are queued),
// then gets ENOSPC, while another device keeps reading and rewriting the blocks it already
// has; once the first is deleted the pool is rw again and takes new
// devices.
func TestFullPoolSparesOtherDevices(t *testing.T) {
	ctx := context.Background()
	p, _ := testPool(t, 32*mib)
	for _, id := range []uint32{1, 2} {
		if err := p.CreateThin(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	pathB, err := p.Activate(ctx, p.name+"-b", 2, 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	b := openDirect(t, pathB)
	for off := int64(0); off < 4*mib; off += mib {
		b.mustWrite(off, pattern(off, mib))
	}
	pathA, err := p.Activate(ctx, p.name+"-a", 1, 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	a := openDirect(t, pathA)
	var werr error
	var last time.Duration
	// Watch the pool while the writer fills it: the write that finds it
	// full waits, and the status says so meanwhile.
	queued := make(chan bool, 1)
	go func() {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if st, err := p.Status(ctx); err == nil && st.WritesQueued() {
				queued <- true
				return
			}
		}
		queued <- false
	}()
	for off := int64(0); off < 64*mib && werr == nil; off += mib {
		start := time.Now()
		werr = a.write(off, pattern(1, mib))
		last = time.Since(start)
	}
	if !errors.Is(werr, unix.ENOSPC) {
		t.Fatalf("writer filling the pool got %v, want ENOSPC", werr)
	}
	t.Logf("the write that found the pool full failed after %v (no-space timeout %v)", last.Round(time.Millisecond), testNoSpaceTimeout)
	if last < testNoSpaceTimeout-100*time.Millisecond {
		t.Fatalf("the write that found the pool full failed after %v, before the %v no-space timeout: it was not queued", last, testNoSpaceTimeout)
	}
	if !<-queued {
		t.Fatal("the status never said writes were queued while the write waited")
	}
	if st, err := p.Status(ctx); err != nil || st.Mode != ModeOutOfDataSpace || !st.WritesFailing() {
		t.Fatalf("status: %+v, %v; want out_of_data_space, failing writes once the timeout expired", st, err)
	}
	for off := int64(0); off < 4*mib; off += mib {
		want := pattern(off+100, mib)
		b.mustWrite(off, want) // mapped blocks: no allocation needed
		mustEqual(t, "other device's block on the full pool", b.read(off, mib), want)
	}
	a.f.Close()
	if err := p.Deactivate(ctx, p.name+"-a"); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Status(ctx); err != nil || st.Mode != ModeReadWrite || !st.QueueIfNoSpace {
		t.Fatalf("status after deleting the filler: %+v, %v; want rw, queueing again", st, err)
	}
	if err := p.CreateThin(ctx, 3); err != nil {
		t.Fatalf("create_thin after freeing: %v", err)
	}
}

// TestAdjustReloadsLowWater: a new pool gets the default low-water mark
// (10% of its blocks); Open of the active pool under another mark keeps
// the live table, and Adjust reloads it with the configured mark, and a
// table loaded with error_if_no_space with queue_if_no_space.
func TestAdjustReloadsLowWater(t *testing.T) {
	ctx := context.Background()
	p, cfg := testPool(t, 32*mib) // 512 blocks
	if lw, err := p.LowWaterBlocks(ctx); err != nil || lw != 51 {
		t.Fatalf("default low-water mark = %d, %v; want 51 (10%% of 512)", lw, err)
	}
	cfg.LowWaterMark = 100
	q, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if lw, err := q.LowWaterBlocks(ctx); err != nil || lw != 51 {
		t.Fatalf("low-water mark after a reader's Open = %d, %v; want 51 unchanged", lw, err)
	}
	if err := q.Adjust(ctx); err != nil {
		t.Fatal(err)
	}
	if lw, err := q.LowWaterBlocks(ctx); err != nil || lw != 100 {
		t.Fatalf("low-water mark after Adjust = %d, %v; want 100", lw, err)
	}
	if st, err := q.Status(ctx); err != nil || st.Mode != ModeReadWrite || st.TotalDataBlocks != 512 {
		t.Fatalf("status after Adjust: %+v, %v", st, err)
	}
	// A table an earlier version loaded with error_if_no_space (writes on
	// a full pool failing at once) is reloaded to queue them.
	tbl, sectors, err := q.liveTable()
	if err != nil {
		t.Fatal(err)
	}
	old := fmt.Sprintf("%s %s %d %d 2 skip_block_zeroing error_if_no_space", tbl.MetaDev, tbl.DataDev, tbl.BlockSize, tbl.LowWater)
	if err := q.reload([]dmTarget{{Start: 0, Length: sectors, Type: "thin-pool", Params: old}}); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Status(ctx); err != nil || !st.ErrorIfNoSpace {
		t.Fatalf("status with the old table: %+v, %v; want error_if_no_space", st, err)
	}
	if err := q.Adjust(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Status(ctx); err != nil || !st.QueueIfNoSpace || st.ErrorIfNoSpace {
		t.Fatalf("status after Adjust of the old table: %+v, %v; want queue_if_no_space", st, err)
	}
}

// TestReserveRefusesNewDevices: once a device's writes bring the free data
// under the reserve, new devices are refused with ErrBelowReserve (naming
// the setting), the kernel raises its low-water event there, and the
// device keeps writing into the reserve; deleting it lets new devices in.
func TestReserveRefusesNewDevices(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Name: "tp-reserve", RootDir: scratch.Dir(t, "tp-reserve-"),
		DataSize: 32 * mib, MetadataSize: 16 << 20, MinFreeSpace: conf.Pct(25), ReserveSetting: KeyMinFreeSpace}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	if lw, err := p.LowWaterBlocks(ctx); err != nil || lw != 128 {
		t.Fatalf("low-water mark = %d, %v; want 128 blocks, the reserve's edge (25%% of 512)", lw, err)
	}
	events := make(chan Event, 16)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go p.Watch(wctx, func(_ context.Context, ev Event) { events <- ev })
	path := activeThin(t, ctx, p, 1, p.name+"-w", 64*mib)
	w := openDirect(t, path)
	for off := int64(0); off < 25*mib; off += mib { // 7 MiB left: under the 8 MiB reserve
		w.mustWrite(off, pattern(off, mib))
	}
	err = p.CreateThin(ctx, 2)
	wantErr(t, "create_thin under the reserve", err, ErrBelowReserve)
	wantErr(t, "create_thin under the reserve", err, ErrPoolFull)
	t.Logf("refused: %v", err)
	if !strings.Contains(err.Error(), "pool.min_free_space") || !strings.Contains(err.Error(), "25% reserve") {
		t.Fatalf("refusal %q names neither the reserve nor its setting", err)
	}
	wantErr(t, "create_snap under the reserve", p.CreateSnap(ctx, 3, 1), ErrBelowReserve)
	select {
	case ev := <-events:
		if !ev.LowWater {
			t.Fatalf("event under the reserve: %+v; want the low-water mark crossed", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no low-water event under the reserve")
	}
	for off := int64(25 * mib); off < 30*mib; off += mib { // the reserve serves the device already there
		w.mustWrite(off, pattern(off, mib))
	}
	w.f.Close()
	if err := p.Deactivate(ctx, p.name+"-w"); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, 1); err != nil {
		t.Fatalf("delete under the reserve: %v", err)
	}
	if err := p.CreateThin(ctx, 2); err != nil {
		t.Fatalf("create_thin once the reserve is free again: %v", err)
	}
}

// TestWatchReportsLowWaterUntilHandled: the kernel raises the low-water
// event once per crossing. A pool that crossed its mark while nobody
// watched (the daemon was down, or restarted after raising
// pool.max_data_size) is reported when Watch starts, so the handler grows
// it and new devices are accepted again; and a handler that could not make
// room is called again (Recheck) while the pool stays under its mark, and
// no more once it is above.
func TestWatchReportsLowWaterUntilHandled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{Name: "tp-lw-start", RootDir: scratch.Dir(t, "tp-lw-start-"),
		DataSize: 32 * mib, MetadataSize: 16 << 20, MaxDataSize: 64 * mib, GrowthReserve: mib,
		MinFreeSpace: conf.Pct(DefaultMinFreePercent)}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	if err := p.Adjust(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := p.ctl.info(p.name)
	if err != nil {
		t.Fatal(err)
	}
	before := info.EventNr

	// Nobody watches: a device writes past the mark (the reserve's edge,
	// 10% of 512 blocks) and the kernel raises its one event.
	path := activeThin(t, ctx, p, 1, "tp-lw-start-1", 128*mib)
	d := openDirect(t, path)
	for off := int64(0); off < 30*mib; off += mib {
		d.mustWrite(off, pattern(off, mib))
	}
	for deadline := time.Now().Add(10 * time.Second); info.EventNr == before && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if info, err = p.ctl.info(p.name); err != nil {
			t.Fatal(err)
		}
	}
	if info.EventNr == before {
		t.Fatal("the kernel raised no event when the writes crossed the low-water mark")
	}
	wantErr(t, "create_thin under the reserve", p.CreateThin(ctx, 2), ErrBelowReserve)

	// The watch starts now. Its handler fails to make room the first time
	// (as a growth short of host space does), then grows the pool.
	p.lowWaterRecheck = 500 * time.Millisecond
	events := make(chan Event, 16)
	go p.Watch(ctx, func(ctx context.Context, ev Event) {
		if ev.LowWater && ev.Recheck {
			if _, err := p.Grow(ctx); err != nil {
				t.Errorf("Grow at event %+v: %v", ev, err)
			}
		}
		events <- ev
	})
	next := func(what string) Event {
		t.Helper()
		select {
		case ev := <-events:
			t.Logf("%s: %+v", what, ev)
			return ev
		case <-time.After(10 * time.Second):
			st, _ := p.Status(ctx)
			t.Fatalf("%s: nothing reported within 10 s; pool %d of %d blocks used", what, st.UsedDataBlocks, st.TotalDataBlocks)
			return Event{}
		}
	}
	if ev := next("at start"); !ev.LowWater || ev.Recheck || ev.Status.UsedDataBlocks < 480 {
		t.Fatalf("first report %+v; want the pool under its mark, not a recheck", ev)
	}
	if ev := next("recheck"); !ev.LowWater || !ev.Recheck {
		t.Fatalf("second report %+v; want a recheck of the pool still under its mark", ev)
	}
	st, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TotalDataBlocks != 640 {
		t.Fatalf("pool after the recheck's growth: %d blocks; want 640 (40 MiB)", st.TotalDataBlocks)
	}
	if err := p.CreateThin(ctx, 2); err != nil {
		t.Fatalf("create_thin once the pool grew: %v", err)
	}
	// Above the mark now: the reload raises an event of its own, and no
	// recheck follows.
	deadline := time.After(3 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.LowWater || ev.Recheck {
				t.Fatalf("report after the growth: %+v; want none under the mark", ev)
			}
			continue
		case <-deadline:
		}
		break
	}
}

// TestOpenFinishesGrowthWhoseFileSizeWasLost: Grow syncs the data file's
// new size before the reload commits it to the pool's metadata; a data
// file that still comes back shorter than the metadata records (its size
// lost by the host filesystem) is extended back when no block in use lies
// past its end, so the pool loads with its grown size; when one does, Open
// refuses with an error naming both sizes instead of loading zeros in
// place of a device's data.
func TestOpenFinishesGrowthWhoseFileSizeWasLost(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Name: "tp-grow-lost", RootDir: scratch.Dir(t, "tp-grow-lost-"),
		DataSize: 32 * mib, MetadataSize: 16 << 20, MaxDataSize: 64 * mib, GrowthReserve: mib}
	dataPath := filepath.Join(cfg.RootDir, DataFileName)
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	g, err := p.Grow(ctx)
	if err != nil || g.From != 32*mib || g.To != 40*mib {
		t.Fatalf("Grow = %+v, %v; want 32 -> 40 MiB", g, err)
	}
	if _, err := p.Status(ctx); err != nil { // the pool commits its metadata
		t.Fatal(err)
	}
	simulateReboot(t, p)
	if err := os.Truncate(dataPath, g.From); err != nil { // what a power cut lost
		t.Fatal(err)
	}
	p, err = Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open after the data file lost its grown size, no block in use past it: %v", err)
	}
	if fi, err := os.Stat(dataPath); err != nil || fi.Size() != 40*mib {
		t.Fatalf("data file after Open: %v, %v; want 40 MiB again", fi, err)
	}
	if st, err := p.Status(ctx); err != nil || st.TotalDataBlocks != 640 || st.Mode != ModeReadWrite {
		t.Fatalf("status after Open: %+v, %v; want 640 blocks, rw", st, err)
	}

	// A device's data past the old size: losing it cannot be repaired by
	// extending the file.
	path := activeThin(t, ctx, p, 1, "tp-grow-lost-1", 64*mib)
	d := openDirect(t, path)
	for off := int64(0); off < 36*mib; off += mib {
		d.mustWrite(off, pattern(off, mib))
	}
	d.f.Close()
	if _, err := p.Status(ctx); err != nil {
		t.Fatal(err)
	}
	simulateReboot(t, p)
	if err := os.Truncate(dataPath, g.From); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, cfg)
	wantErr(t, "Open with data in use past the data file's end", err, ErrInvalid)
	for _, want := range []string{dataPath, "33554432 bytes", "41943040 bytes", "docs/operating.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Open error %q does not name %q", err, want)
		}
	}
	if fi, err := os.Stat(dataPath); err != nil || fi.Size() != 32*mib {
		t.Fatalf("data file after the refused Open: %v, %v; want it left at 32 MiB", fi, err)
	}
	if err := os.Truncate(dataPath, g.To); err != nil { // for the cleanup
		t.Fatal(err)
	}
}

// TestAdjustResumesSuspendedPoolAndDevices: a process killed between the
// suspend and the resume of a table reload leaves the pool suspended, and
// one killed inside a snapshot leaves the origin's device suspended; every
// IO to them would wait. The owner's Open and Adjust resume both, so the
// device reads and writes again.
func TestAdjustResumesSuspendedPoolAndDevices(t *testing.T) {
	ctx := context.Background()
	p, cfg := testPool(t, 64*mib)
	path := activeThin(t, ctx, p, 1, p.name+"-origin", 16*mib)
	name := p.name + "-origin"
	// What a SIGKILL leaves: the origin suspended for create_snap, the
	// pool suspended for a reload (a table waiting in its inactive slot).
	if err := p.ctl.suspend(name, false); err != nil {
		t.Fatal(err)
	}
	defer p.ctl.resume(name)
	tbl, sectors, err := p.liveTable()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ctl.load(p.name, []dmTarget{{Start: 0, Length: sectors, Type: "thin-pool",
		Params: poolTableParams(tbl.MetaDev, tbl.DataDev, tbl.BlockSize, 77)}}, false); err != nil {
		t.Fatal(err)
	}
	if err := p.ctl.suspend(p.name, false); err != nil {
		t.Fatal(err)
	}
	defer p.ctl.resume(p.name)

	q, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Adjust(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := q.ctl.info(q.name)
	if err != nil {
		t.Fatal(err)
	}
	if info.suspended() || info.hasInactiveTbl() {
		t.Fatalf("pool after Open and Adjust: flags %#x; want resumed, no table left inactive", info.Flags)
	}
	if lw, err := q.LowWaterBlocks(ctx); err != nil || lw != 102 {
		t.Fatalf("low-water mark after Adjust = %d, %v; want the configured 102 (10%% of 1024)", lw, err)
	}
	devs, err := q.ActiveDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range devs {
		if dev.Suspended {
			t.Fatalf("device %q still suspended after Adjust", dev.Name)
		}
	}
	d := openDirect(t, path)
	done := make(chan error, 1)
	go func() { done <- d.write(0, pattern(9, mib)) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write after Adjust: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a write to the device still waits 20 s after Adjust")
	}
	mustEqual(t, "block written after Adjust", d.read(0, mib), pattern(9, mib))
}

// TestGrowthStopsAtWhatTheMetadataMaps: the metadata device does not grow
// with the data, so growth stops at the data the metadata can map (the
// kernel's guide: 48 bytes of metadata per data block). Past it a pool
// whose data was written would fill its metadata first and turn
// read-only, whatever data it had free.
func TestGrowthStopsAtWhatTheMetadataMaps(t *testing.T) {
	ctx := context.Background()
	dir := scratch.Dir(t, "tp-metacap-")
	// 2 MiB of metadata maps 43690 blocks of 64 KiB: 2730.6 MiB.
	const limit = 2 << 20 / 48 * (64 << 10)
	cfg := Config{Name: "tp-metacap", RootDir: dir,
		DataSize: 2560 * mib, MetadataSize: 2 << 20, MaxDataSize: 8 << 30, GrowthReserve: mib}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	g, err := p.Grow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Grew() || g.To > limit {
		t.Fatalf("Grow of a 2560 MiB pool with 2 MiB of metadata = %+v; want it grown to at most %d bytes, what the metadata maps", g, limit)
	}
	g, err = p.Grow(ctx)
	if err != nil || g.Grew() || !strings.Contains(g.Reason, "metadata") {
		t.Fatalf("second Grow = %+v, %v; want none, the reason naming the metadata", g, err)
	}
	t.Logf("refused: %s", g.Reason)
}
