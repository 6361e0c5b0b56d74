package thinpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/durable"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/fsspace"
)

// growthStepDivisor sizes one growth: a quarter of the data size, so a few
// events take a small pool to its maximum without reserving far ahead of
// what is written.
const growthStepDivisor = 4

// metadataBytesPerBlock is the metadata the kernel's thin-provisioning
// guide sizes per data block. The metadata device does not grow with the
// data, so growth stops at the data it maps at that rate (MetadataDataLimit):
// past it, a pool whose data is written fills its metadata first and turns
// read-only, with data free.
const metadataBytesPerBlock = 48

// MetadataDataLimit is the data, in bytes, that metadataBlocks 4 KiB
// metadata blocks map in blocks of blockBytes, at metadataBytesPerBlock
// per block.
func MetadataDataLimit(metadataBlocks, blockBytes uint64) uint64 {
	return metadataBlocks * metaBlockSize / metadataBytesPerBlock * blockBytes
}

// Backing describes the filesystem under a loop-file pool.
type Backing struct {
	// Loop is false for a pool on block devices; the other fields are then
	// zero.
	Loop bool
	// Dir is the directory holding the loop files.
	Dir string
	// FSFree is what the filesystem has free for the daemon, in bytes.
	FSFree uint64
	// FSSize is the filesystem's size in bytes.
	FSSize uint64
	// Virtual is the loop files' apparent size (data plus metadata).
	Virtual uint64
	// Allocated is what the loop files already hold on the filesystem;
	// DataAllocated is the data file's share of it.
	Allocated, DataAllocated uint64
	// GrowthReserve is Config.GrowthReserve in bytes: the free space Grow
	// leaves on the filesystem.
	GrowthReserve uint64
}

// Unbacked is the part of the loop files the filesystem has not yet
// allocated: what the pool can still write that must come out of FSFree.
func (b Backing) Unbacked() uint64 {
	if b.Allocated >= b.Virtual {
		return 0
	}
	return b.Virtual - b.Allocated
}

// DataRoom is the pool data the loop files' filesystem can still back,
// with usedData bytes of the pool's data in use: the data file's blocks
// the pool does not use (a deleted device's, which its discards did not
// punch out of the file), and what the filesystem has free. A pool
// writing past it gets EIO from its loop device, whatever its own free
// block count says. GrowthReserve, which only growth keeps, is not left
// out: the writes fail at the filesystem's end, not at the reserve's. It
// is 0 for a pool on block devices (Loop false), whose data device backs
// all of its blocks.
func (b Backing) DataRoom(usedData uint64) uint64 {
	if !b.Loop {
		return 0
	}
	return b.DataAllocated - min(b.DataAllocated, usedData) + b.FSFree
}

// Overcommitted reports whether the loop files could need more space than
// the filesystem has free.
func (b Backing) Overcommitted() bool { return b.Loop && b.Unbacked() > b.FSFree }

// statfs is unix.Statfs, which Backing reads the loop files' filesystem
// with; a test puts a fake in its place to give it a filesystem it cannot
// mount.
var statfs = unix.Statfs

// Backing reads the filesystem under the pool's loop files.
func (p *Pool) Backing(ctx context.Context) (Backing, error) {
	if err := p.usable(); err != nil {
		return Backing{}, err
	}
	if p.cfg.DataDevice != "" {
		return Backing{}, nil
	}
	b := Backing{Loop: true, Dir: p.cfg.RootDir, GrowthReserve: uint64(max(p.cfg.GrowthReserve.Bytes(), 0))}
	var fs unix.Statfs_t
	if err := statfs(p.cfg.RootDir, &fs); err != nil {
		return Backing{}, p.errf(nil, err, "statfs %s", p.cfg.RootDir)
	}
	b.FSSize, b.FSFree = fsspace.Bytes(&fs)
	for _, name := range []string{DataFileName, MetadataFileName} {
		var st unix.Stat_t
		path := filepath.Join(p.cfg.RootDir, name)
		if err := unix.Stat(path, &st); err != nil {
			return Backing{}, p.errf(nil, err, "stat %s", path)
		}
		b.Virtual += uint64(st.Size)
		b.Allocated += uint64(st.Blocks) * 512
		if name == DataFileName {
			b.DataAllocated = uint64(st.Blocks) * 512
		}
	}
	return b, nil
}

// warnOvercommit logs when the loop files could outgrow the filesystem
// holding them: a pool that believes it has space the host has not fails
// its writes with EIO from the loop device, not a clean ENOSPC.
func (p *Pool) warnOvercommit(ctx context.Context) {
	b, err := p.Backing(ctx)
	if err != nil {
		log.G(ctx).WithError(err).WithField("pool", p.name).Warn("thinpool: reading the loop files' filesystem")
		return
	}
	if b.Overcommitted() {
		log.G(ctx).WithField("pool", p.name).WithField("dir", b.Dir).WithField("virtual_bytes", b.Virtual).
			WithField("unallocated_bytes", b.Unbacked()).WithField("fs_free_bytes", b.FSFree).
			Warn("thinpool: the loop files may grow past the free space of their filesystem; the pool fails its writes when it does")
	}
}

// liveTable returns the pool's live thin-pool table and its length in
// sectors.
func (p *Pool) liveTable() (poolTable, uint64, error) {
	targets, _, err := p.ctl.tableStatus(p.name, true, false)
	if err != nil {
		return poolTable{}, 0, err
	}
	if len(targets) != 1 || targets[0].Type != "thin-pool" {
		return poolTable{}, 0, fmt.Errorf("device %q is not a thin pool (table %v)", p.name, targets)
	}
	t, err := parsePoolTable(targets[0].Params)
	return t, targets[0].Length, err
}

// Growth is what one Grow did.
type Growth struct {
	// From and To are the data sizes in bytes before and after; equal when
	// the pool did not grow.
	From, To int64
	// Reason says why the pool did not grow, when it did not.
	Reason string
}

// Grew reports whether the pool grew.
func (g Growth) Grew() bool { return g.To > g.From }

// Grow makes a loop-file pool's data larger by one step (a quarter of its
// size) while Config.MaxDataSize and the pool's metadata allow
// (MetadataDataLimit), never adding more than the filesystem holding the
// loop files has free beyond Config.GrowthReserve and what the files may
// still claim. It extends the data file, has the
// loop device take the new size (LOOP_SET_CAPACITY), and reloads the pool
// table with the new length online (load, suspend, resume: IO to thin
// devices waits during the swap and goes on after it). A pool on block
// devices, one at its maximum, or one without room on the filesystem does
// not grow: the result says why and the error is nil.
func (p *Pool) Grow(ctx context.Context) (Growth, error) {
	if err := p.usable(); err != nil {
		return Growth{}, err
	}
	p.growMu.Lock()
	defer p.growMu.Unlock()
	t, sectors, err := p.liveTable()
	if err != nil {
		return Growth{}, p.errf(nil, err, "grow: read table")
	}
	block := int64(p.blockSize) * 512
	g := Growth{From: int64(sectors) * 512}
	g.To = g.From
	maxData := p.cfg.MaxDataSize.Bytes()
	switch {
	case p.cfg.DataDevice != "":
		g.Reason = "the pool is on block devices, not loop files"
		return g, nil
	case maxData <= 0:
		g.Reason = "growth is off (no maximum data size)"
		return g, nil
	case g.From+block > maxData:
		g.Reason = fmt.Sprintf("the data size %d is at the maximum %d", g.From, maxData)
		return g, nil
	}
	st, err := p.status(true)
	if err != nil {
		return g, p.errf(nil, err, "grow: read status")
	}
	if st.TotalMetadataBlocks > 0 {
		if limit := int64(min(MetadataDataLimit(st.TotalMetadataBlocks, uint64(block)), uint64(maxData))); limit < maxData {
			maxData = limit
			if g.From+block > maxData {
				g.Reason = fmt.Sprintf("the data size %d is at the %d bytes the pool's %d bytes of metadata map (%d bytes per %d-byte block); a larger pool needs a larger metadata device",
					g.From, maxData, st.TotalMetadataBlocks*metaBlockSize, metadataBytesPerBlock, block)
				return g, nil
			}
		}
	}
	b, err := p.Backing(ctx)
	if err != nil {
		return g, err
	}
	reserve := p.cfg.GrowthReserve.Bytes()
	room := int64(b.FSFree) - int64(b.Unbacked()) - reserve
	to := min(g.From+max(g.From/growthStepDivisor, block), maxData, g.From+room)
	to = to / block * block
	if to <= g.From {
		g.Reason = fmt.Sprintf("the filesystem of %s has %d bytes free, the loop files may still claim %d and %d are kept in reserve",
			b.Dir, b.FSFree, b.Unbacked(), reserve)
		return g, nil
	}
	// The reload below commits pool metadata that records the new size:
	// the file's new size is made durable first, so that no power cut can
	// leave metadata expecting more data than the file holds.
	dataPath := filepath.Join(p.cfg.RootDir, DataFileName)
	if err := extendFile(dataPath, to); err != nil {
		return g, p.errf(nil, err, "grow")
	}
	dataDev, err := parseDevString(t.DataDev)
	if err != nil {
		return g, p.errf(nil, err, "grow")
	}
	node, err := nodeFor(dataDev)
	if err != nil {
		return g, p.errf(nil, err, "grow")
	}
	if err := setLoopCapacity(node); err != nil {
		return g, p.errf(nil, err, "grow: %s", node)
	}
	if got, err := deviceSize(node); err != nil {
		return g, p.errf(nil, err, "grow")
	} else if got < to {
		return g, p.errf(nil, fmt.Errorf("loop device %s reports %d bytes after LOOP_SET_CAPACITY, want %d", node, got, to), "grow")
	}
	newSectors := uint64(to) / 512
	table := []dmTarget{{Start: 0, Length: newSectors, Type: "thin-pool",
		Params: poolTableParams(t.MetaDev, t.DataDev, t.BlockSize, p.lowWaterBlocks(newSectors/uint64(t.BlockSize)))}}
	if err := p.reload(table); err != nil {
		return g, p.errf(nil, err, "grow: reload the table with %d sectors", newSectors)
	}
	g.To = to
	log.G(ctx).WithField("pool", p.name).WithField("from_bytes", g.From).WithField("to_bytes", g.To).Info("thinpool: pool data grown")
	return g, nil
}

// extendFile sets the size of the file at path to size (sparse) and makes
// the new size durable: the file and its directory are synced.
func extendFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s to extend it: %w", path, err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("extend %s to %d bytes: %w", path, size, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s after extending it to %d bytes: %w", path, size, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return durable.SyncDir(filepath.Dir(path))
}

// reload swaps the pool's table for table: load into the inactive slot,
// suspend, resume. A failed suspend drops the loaded table again.
func (p *Pool) reload(table []dmTarget) error {
	if err := p.ctl.load(p.name, table, false); err != nil {
		return fmt.Errorf("load table %q: %w", table[0].Params, err)
	}
	if err := p.ctl.suspend(p.name, false); err != nil {
		_, clearErr := p.ctl.ioctl(unix.DM_TABLE_CLEAR, dmRequest{name: p.name})
		return errors.Join(fmt.Errorf("suspend: %w", err), clearErr)
	}
	if _, err := p.ctl.resume(p.name); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	return nil
}

// setLoopCapacity has loop device node re-read its backing file's size.
func setLoopCapacity(node string) error {
	f, err := os.OpenFile(node, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", node, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("LOOP_SET_CAPACITY %s: %w", node, err)
	}
	return nil
}

// Adjust is what the process owning the pool runs once after Open (a
// reader such as a status command does not): it reloads the table when
// the live one is not what Config asks for (another low-water mark, or
// error_if_no_space from an earlier version: the pool was activated
// under another configuration), so that events come where the owner
// expects them and writes on a full pool wait; it sets the kernel's
// no-space timeout (Config.NoSpaceTimeout); and it warns when the loop
// files could outgrow the filesystem holding them. It removes the probe
// devices of ThinExists calls whose process was killed. First it resumes the
// pool and its thin devices when they are suspended: a process killed
// inside a table reload or a snapshot leaves them so, and every IO to them
// would wait forever.
func (p *Pool) Adjust(ctx context.Context) error {
	if err := p.usable(); err != nil {
		return err
	}
	if err := p.resumeSuspended(ctx); err != nil {
		return p.errf(nil, err, "adjust")
	}
	if err := p.removeDeadProbes(ctx); err != nil {
		return p.errf(nil, err, "adjust")
	}
	p.warnOvercommit(ctx)
	p.syncNoSpaceTimeout(ctx)
	if err := p.syncTable(ctx); err != nil {
		return p.errf(nil, err, "adjust")
	}
	return nil
}

// resumeSuspended resumes the pool when it is suspended, then every
// suspended thin device on it. Only the owner suspends them, and only
// around a table reload (the pool) or a create_snap message (the origin's
// devices), always resuming them after; one found suspended was left so by
// a process killed in between. A pool suspended with a table loaded in its
// inactive slot takes that table when resumed: the reload the killed
// process had begun, whose table the kernel had already checked. A thin
// device that cannot be resumed is logged and left: the pool and the
// other devices work without it.
func (p *Pool) resumeSuspended(ctx context.Context) error {
	p.growMu.Lock()
	defer p.growMu.Unlock()
	lg := log.G(ctx).WithField("pool", p.name)
	info, err := p.ctl.info(p.name)
	if err != nil {
		return fmt.Errorf("read the pool's state: %w", err)
	}
	if info.suspended() {
		if _, err := p.ctl.resume(p.name); err != nil {
			return fmt.Errorf("resume the pool, found suspended: %w", err)
		}
		lg.WithField("inactive_table", info.hasInactiveTbl()).Warn("thinpool: pool found suspended (a table reload was cut short); resumed it")
	}
	devs, err := p.ActiveDevices(ctx)
	if err != nil {
		return err
	}
	for _, d := range devs {
		if !d.Suspended {
			continue
		}
		l := lg.WithField("device", d.Name).WithField("thin_id", d.ThinID)
		if _, err := p.ctl.resume(d.Name); err != nil {
			l.WithError(err).Error("thinpool: thin device found suspended could not be resumed; its IO waits")
			continue
		}
		l.Warn("thinpool: thin device found suspended (a snapshot of it was cut short); resumed it")
	}
	return nil
}

func (p *Pool) syncTable(ctx context.Context) error {
	p.growMu.Lock()
	defer p.growMu.Unlock()
	t, sectors, err := p.liveTable()
	if err != nil {
		return err
	}
	want := p.lowWaterBlocks(sectors / uint64(t.BlockSize))
	if t.LowWater == want && !slices.Contains(t.Features, unwantedFeature) {
		return nil
	}
	table := []dmTarget{{Start: 0, Length: sectors, Type: "thin-pool",
		Params: poolTableParams(t.MetaDev, t.DataDev, t.BlockSize, want)}}
	if err := p.reload(table); err != nil {
		return fmt.Errorf("reload the table with low-water mark %d blocks and features %v: %w", want, poolFeatures, err)
	}
	log.G(ctx).WithField("pool", p.name).WithField("from_blocks", t.LowWater).WithField("to_blocks", want).
		WithField("from_features", t.Features).WithField("to_features", poolFeatures).Info("thinpool: pool table reloaded")
	return nil
}

// LowWaterBlocks returns the low-water mark of the pool's live table, in
// data blocks.
func (p *Pool) LowWaterBlocks(ctx context.Context) (uint64, error) {
	if err := p.usable(); err != nil {
		return 0, err
	}
	t, _, err := p.liveTable()
	if err != nil {
		return 0, p.errf(nil, err, "read table")
	}
	return t.LowWater, nil
}
