// Package gc keeps the thin pool from filling up with images: when the
// pool's data or metadata usage crosses a high threshold it removes the
// images nothing uses, least recently used first, until usage is under a
// low threshold; before a pull makes any device it makes room for the
// pull's layers and refuses the pull when they cannot fit; and it removes
// S3 images an operator names (`rm`).
//
// Collection covers every image whose snapshots are in the pool: the S3
// images the pipelines pulled, and the images containerd unpacked into
// the pool itself from a registry (ctr, nerdctl, the CRI), in any of its
// namespaces. The kubelet cannot do it for us: the CRI reports a host
// folder as the image filesystem, never the pool. Use is the last pull,
// the last activation (S3 images) and the newest container made on the
// image. An image is in use, so never removed, while a container is made
// on it, a container snapshot sits on one of its chains, a pull of it, a
// live run on its chains or a containerd lease holds it, or it is pinned
// (by name in the configuration, or by containerd's pinned label).
//
// Removing an S3 image removes its names from containerd first (so that
// containerd never lists a name whose snapshots are gone), then its
// activation, the chains no other image uses (top first), their devices,
// and last its records, with the objects and layer files nothing else
// needs: a crash half-way leaves the image recorded, and the next
// collection finishes the removal. A registry image is removed the way
// containerd removes one: its record is deleted and containerd's garbage
// collection, waited for, removes its content and the snapshots nothing
// else holds, through the proxy plugin.
package gc

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/fsspace"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// Defaults of Options.
const (
	DefaultHighThreshold = 85.0 // percent of the pool's data or metadata
	DefaultLowThreshold  = 80.0
	DefaultInterval      = 5 * time.Minute
	DefaultApplyPoll     = 200 * time.Millisecond
	DefaultApplyWatch    = 10 * time.Minute
)

// applyStuckPolls is how many ApplyPoll periods the watch of containerd's
// writes waits after a collection found nothing to remove.
const applyStuckPolls = 25

// marginDivisor sizes what a layer is taken to need in the pool: its
// tarball's bytes plus one part in marginDivisor, for the file system's
// own blocks (inodes, directories, journal) and block rounding.
const marginDivisor = 8

// ErrInUse is wrapped by a removal refused because the image is in use.
var ErrInUse = errors.New("image in use")

// ErrNoRoom is wrapped by a pull refused because its layers cannot fit in
// the pool.
var ErrNoRoom = errors.New("no room in the pool")

// Usage is how full the pool is, in bytes, and the fullest of the host
// filesystems holding the downloads and the pool's loop files, not
// counting the loop files' own blocks: removing images frees their
// tarballs there, never the loop files' blocks (deleting a thin device
// gives its blocks back to the pool, not to the file holding them).
type Usage struct {
	DataUsed, DataTotal uint64
	MetaUsed, MetaTotal uint64
	HostUsed, HostTotal uint64
	// DataReserve is the pool's reserve (pool.min_free_space), in data
	// bytes: under it the pool refuses new devices, so a pull's layers
	// must fit above it.
	DataReserve uint64
	// Backed is true for a pool on loop files: BackingRoom is then the
	// data the filesystem holding them can still back
	// (thinpool.Backing.DataRoom). A sparse data file may promise more
	// than that filesystem has left (logs and downloads fill it too), and
	// a write past it fails in the loop device.
	Backed      bool
	BackingRoom uint64
}

// HostUsage returns the used and total bytes of the fullest filesystem
// holding one of paths (used counts what the daemon cannot use: the
// filesystem's reserve for root is not free to it either), less the blocks
// the files of exclude hold on it (the pool's loop files, which no
// collection can shrink; a missing one holds none).
func HostUsage(exclude []string, paths ...string) (used, total uint64, err error) {
	for _, p := range paths {
		var fs unix.Statfs_t
		if err := unix.Statfs(p, &fs); err != nil {
			return 0, 0, fmt.Errorf("statfs %s: %w", p, err)
		}
		var dir unix.Stat_t
		if err := unix.Stat(p, &dir); err != nil {
			return 0, 0, fmt.Errorf("stat %s: %w", p, err)
		}
		t, avail := fsspace.Bytes(&fs)
		u := t - min(t, avail)
		for _, f := range exclude {
			var st unix.Stat_t
			if err := unix.Stat(f, &st); err == nil && st.Dev == dir.Dev {
				u -= min(u, uint64(st.Blocks)*512) // st_blocks counts 512-byte units
			}
		}
		if percent(u, t) > percent(used, total) {
			used, total = u, t
		}
	}
	return used, total, nil
}

// DirtyBytes returns the host's page cache waiting to be written back
// (Dirty and Writeback in /proc/meminfo): a bound on what the pool's
// devices will still allocate for the data written to them. It counts
// every filesystem's, so it errs towards collecting early.
func DirtyBytes(context.Context) (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("dirty pages: %w", err)
	}
	return dirtyOf(string(b))
}

// dirtyOf sums the Dirty and Writeback lines of a /proc/meminfo text.
func dirtyOf(meminfo string) (uint64, error) {
	var total uint64
	for _, line := range strings.Split(meminfo, "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "Dirty" && name != "Writeback") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("dirty pages: /proc/meminfo line %q: %w", line, err)
		}
		total += kb << 10
	}
	return total, nil
}

// HostPercent is the host filesystem usage in percent.
func (u Usage) HostPercent() float64 { return percent(u.HostUsed, u.HostTotal) }

// UsageOf converts a thin-pool status line into bytes.
func UsageOf(st thinpool.PoolStatus) Usage {
	block := uint64(st.BlockSizeSectors) * 512
	const metaBlock = 4096
	return Usage{DataUsed: st.UsedDataBlocks * block, DataTotal: st.TotalDataBlocks * block,
		MetaUsed: st.UsedMetadataBlocks * metaBlock, MetaTotal: st.TotalMetadataBlocks * metaBlock}
}

// DataFree is the data space not used.
func (u Usage) DataFree() uint64 {
	if u.DataUsed >= u.DataTotal {
		return 0
	}
	return u.DataTotal - u.DataUsed
}

// DataRoom is the data space a pull's new devices may take: what is free
// above the reserve, and, for a pool on loop files, what their filesystem
// can still back.
func (u Usage) DataRoom() uint64 {
	free := u.DataFree()
	free -= min(free, u.DataReserve)
	if u.Backed {
		free = min(free, u.BackingRoom)
	}
	return free
}

// DataAboveReserve is the data space a pull's new devices could take in
// an empty pool: the whole data space less the reserve.
func (u Usage) DataAboveReserve() uint64 { return u.DataTotal - min(u.DataTotal, u.DataReserve) }

// DataPercent is the data usage in percent, of dataTotal.
func (u Usage) DataPercent() float64 { return percent(u.DataUsed, u.dataTotal()) }

// dataTotal is the data space usage is judged against: the pool's; or,
// for a pool on loop files whose filesystem cannot back all of the pool's
// free space, what is used and what that filesystem can still back. Past
// it the pool's writes fail in the loop device (and a metadata write that
// fails there fails the pool), whatever its own counts say; removing
// images lowers the usage this way too, since the blocks they free in the
// pool are the data file's to write again.
func (u Usage) dataTotal() uint64 {
	if u.Backed && u.BackingRoom < u.DataFree() {
		return u.DataUsed + u.BackingRoom
	}
	return u.DataTotal
}

// MetaPercent is the metadata usage in percent.
func (u Usage) MetaPercent() float64 { return percent(u.MetaUsed, u.MetaTotal) }

func percent(used, total uint64) float64 {
	if total == 0 {
		return 0
	}
	return 100 * float64(used) / float64(total)
}

// String prints both usages, for logs and messages.
func (u Usage) String() string {
	s := fmt.Sprintf("data %.1f%% (%s of %s), metadata %.1f%%", u.DataPercent(), bytesOf(u.DataUsed), bytesOf(u.dataTotal()), u.MetaPercent())
	if t := u.dataTotal(); t != u.DataTotal {
		s += fmt.Sprintf(" (the pool's %s on loop files whose filesystem backs only %s more)", bytesOf(u.DataTotal), bytesOf(u.BackingRoom))
	}
	if u.HostTotal > 0 {
		s += fmt.Sprintf(", host filesystem %.1f%%", u.HostPercent())
	}
	return s
}

func bytesOf(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

// Snapshots is what collection needs of the snapshotter
// (*snapshotter.Snapshotter, or the pipelines' Snapshots).
type Snapshots interface {
	Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error
	Remove(ctx context.Context, key string) error
	RemoveIf(ctx context.Context, key string, guard snapshotter.RemoveGuard) error
	Cleanup(ctx context.Context) error
	// HeldOpen reports whether the device of snapshot key is held open
	// (snapshotter.Snapshotter.HeldOpen).
	HeldOpen(ctx context.Context, key string) (bool, error)
}

// Names is containerd's side of the pool: where S3 images are registered
// under their names, and what containerd knows of every image in the pool
// (*pipeline.ContainerdRegistrar).
type Names interface {
	// Unregister removes name where it names an image this daemon
	// created (an image of that name someone else made stays as it is);
	// an absent name is not an error.
	Unregister(ctx context.Context, name string) error
	// PoolImages lists the images, in every namespace, whose top chain
	// is unpacked in our snapshotter, ours (S3 images' names) and
	// others' (registry images), with their containers, pins and leases;
	// an error wrapping pipeline.ErrContainerdAbsent when containerd's
	// socket is absent.
	PoolImages(ctx context.Context) ([]pipeline.PoolImage, error)
	// RemoveImage removes image name from namespace ns the way
	// containerd removes one: the record, then containerd's garbage
	// collection of what only it held, waited for. An absent image is
	// not an error.
	RemoveImage(ctx context.Context, ns, name string) error
}

// Observer counts what collection does (*metrics.GC).
type Observer interface {
	// Ran counts one collection that was triggered by trigger and took d.
	Ran(trigger string, d time.Duration)
	// Removed counts one image from source (SourceS3, SourceRegistry)
	// removed for cause ("usage" or "rm") and the pool data bytes its
	// removal freed.
	Removed(cause, source string, freed int64)
	// Freed counts the pool data bytes freed for cause by removing the
	// chains of failed pulls from source: they are no image, so no image
	// is counted.
	Freed(cause, source string, freed int64)
}

// Options configure New. DB, Snapshots, Usage, Guard and Prune are
// required.
type Options struct {
	DB        *metadata.DB
	Snapshots Snapshots
	// Usage reads how full the pool is now.
	Usage func(ctx context.Context) (Usage, error)
	// Glance, when set, reads how full the pool is without making the
	// kernel commit its metadata first (thinpool.Pool.Peek): never less
	// used than Usage says. The watch of containerd's writes polls with
	// it, and reads Usage, whose commit costs a superblock write and its
	// flushes, only once a glance is past the high threshold.
	Glance func(ctx context.Context) (Usage, error)
	// Guard refuses the removal of a chain a live run or a pull under
	// way uses (pipeline.Pipelines.Guard).
	Guard func(chain string) snapshotter.RemoveGuard
	// Prune forgets the records and layer files the removals left unused
	// (pipeline.Pipelines.Prune).
	Prune func(ctx context.Context) error
	// Names, when set, is where image names are registered (containerd).
	Names Names
	// Observer, when set, counts runs and removals.
	Observer Observer

	// HighThreshold and LowThreshold are percents of the pool's data or
	// metadata: collection starts at High and stops under Low (defaults
	// 85 and 80).
	HighThreshold, LowThreshold float64
	// Pinned names images never removed: by one of their names, or an
	// S3 image by its source (s3://bucket/key, a prefix with or without
	// its final '/').
	Pinned []string
	// Interval spaces the collections Loop runs between pulls (default 5
	// minutes).
	Interval time.Duration
	// Disabled turns collection by itself off: Pulled, MakeRoom and Loop
	// remove no image (MakeRoom still grows the pool and refuses a pull
	// that cannot fit). Begin still marks the images being pulled, so that
	// Remove never takes one, and the tarball cache is still trimmed.
	Disabled bool
	// Grow, when set, grows the pool by one step and reports whether it
	// did (a loop-file pool allowed to grow): MakeRoom grows the pool
	// rather than refuse a pull that garbage collection left no room for.
	Grow func(ctx context.Context) (bool, error)
	// ApplyPoll spaces the usage checks Loop makes while containerd
	// writes a layer into the pool (Preparing), default 200 ms; ApplyWatch
	// bounds how long one such write is watched when neither its commit
	// nor its removal comes (default 10 minutes).
	ApplyPoll, ApplyWatch time.Duration
	// Pending, when set, reads the bytes written to the pool's devices
	// that the pool has not allocated yet (DirtyBytes): a layer containerd
	// applies sits in the page cache until its unmount flushes it, just
	// before the commit, so usage alone shows it too late. While
	// containerd writes a layer, Loop counts them as needed.
	Pending func(ctx context.Context) (uint64, error)
	// FilesInUse, when set, returns the digests of the layer files a pull
	// under way or a live run may still read
	// (pipeline.Pipelines.LayerFilesInUse), keeping the pulls from taking
	// new ones until release is called: TrimTarballs then trims the rest
	// while pulls are under way. Unset, it trims only when no pull other
	// than the caller's is under way and no run is live.
	FilesInUse func(ctx context.Context) (inUse map[string]bool, release func(), err error)
	// TarballCache is the byte budget of the downloaded tarballs of
	// unpacked layers (TrimTarballs, after every pull and every Interval);
	// zero keeps none once unpacked. DefaultTarballCache is the daemon's
	// default.
	TarballCache int64
}

// Collector removes unused images. Its methods are safe for concurrent use;
// one collection or removal runs at a time.
type Collector struct {
	opts Options

	mu sync.Mutex // one collection or removal at a time
	// hostOther, under mu, says a removal freed nothing on the host
	// filesystem past the threshold: what fills it is not the images', so
	// collections leave it out until it is under the high threshold again
	// (else every collection, one per poll of the watch of containerd's
	// writes, would remove one more image for it).
	hostOther bool

	pmu      sync.Mutex
	cond     *sync.Cond
	pulling  map[string]int // image id → pulls under way
	removing string         // image id being removed
	holding  bool           // pulls wait in Begin (holdPulls)

	// committed wakes Loop for a collection after containerd committed
	// a snapshot (Committed); one pending wake-up stands for any number.
	committed chan struct{}
	// preparing wakes Loop to watch the pool while containerd writes a
	// layer into it (Preparing), like committed.
	preparing chan struct{}

	// room makes one MakeRoom judge the pool at a time, so that the room
	// given to one pull is counted by the next.
	room sync.Mutex
	gmu  sync.Mutex
	// given is the data bytes MakeRoom let pulls under way have, until
	// each ends (the release MakeRoom returns), and givenPulls how many
	// pulls they are: a pull's devices are made and written after
	// MakeRoom judged the pool, so the pool's usage does not show them
	// yet, and a second pull judged on that usage alone would be let
	// into the same room.
	given      uint64
	givenPulls int

	wmu sync.Mutex
	// writing maps the active snapshots containerd writes layers into
	// (Preparing) to when they were prepared, until their commit or
	// removal.
	writing map[string]time.Time
}

// New validates opts and returns a collector.
func New(opts Options) (*Collector, error) {
	if opts.DB == nil || opts.Snapshots == nil || opts.Usage == nil || opts.Guard == nil || opts.Prune == nil {
		return nil, errors.New("gc: DB, Snapshots, Usage, Guard and Prune are required")
	}
	if opts.HighThreshold == 0 {
		opts.HighThreshold = DefaultHighThreshold
	}
	if opts.LowThreshold == 0 {
		opts.LowThreshold = DefaultLowThreshold
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.ApplyPoll <= 0 {
		opts.ApplyPoll = DefaultApplyPoll
	}
	if opts.ApplyWatch <= 0 {
		opts.ApplyWatch = DefaultApplyWatch
	}
	if err := (TarballCacheConfig{TarballCacheSize: conf.Size(opts.TarballCache)}).Validate(); err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	if err := ValidateThresholds(opts.HighThreshold, opts.LowThreshold); err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	c := &Collector{opts: opts, pulling: map[string]int{}, committed: make(chan struct{}, 1), preparing: make(chan struct{}, 1),
		writing: map[string]time.Time{}}
	c.cond = sync.NewCond(&c.pmu)
	return c, nil
}

// ValidateThresholds checks 0 < low < high <= 100.
func ValidateThresholds(high, low float64) error {
	if !(low > 0 && low < high && high <= 100) {
		return fmt.Errorf("thresholds high %v%% and low %v%%: must be 0 < low < high <= 100", high, low)
	}
	return nil
}

// Begin implements pipeline.PoolGuard: image imageID is in use until end
// is called. It waits while a removal of that image is under way, so that
// the pull starts after it and makes the image again, and while pulls are
// held (holdPulls).
func (c *Collector) Begin(imageID string) (end func()) {
	c.pmu.Lock()
	for c.removing == imageID || c.holding {
		c.cond.Wait()
	}
	c.pulling[imageID]++
	c.pmu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.pmu.Lock()
			if c.pulling[imageID]--; c.pulling[imageID] <= 0 {
				delete(c.pulling, imageID)
			}
			c.pmu.Unlock()
		})
	}
}

// callerPull, given as the except of holdPulls, Collect's own or
// sweepOrphans', stands for the one pull under way that calls (MakeRoom's
// caller, which is not told its image ID): that pull's chains are held
// from before it asks for room (pipeline.Pipelines.Guard), and it has not
// built any yet.
const callerPull = "\x00the calling pull"

// holdPulls makes every pull starting from now wait in Begin until
// release is called, and reports false (holding nothing) when a pull other
// than one of image except is under way (other than the one pull that
// calls, for callerPull): what the caller removes (a layer file, a chain
// of no image) is what such a pull may be about to use.
func (c *Collector) holdPulls(except string) (release func(), ok bool) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	total := 0
	for id, n := range c.pulling {
		total += n
		if except != callerPull && (id != except || n > 1) {
			return nil, false
		}
	}
	if except == callerPull && total > 1 {
		return nil, false
	}
	c.holding = true
	return func() {
		c.pmu.Lock()
		c.holding = false
		c.cond.Broadcast()
		c.pmu.Unlock()
	}, true
}

// Pulled implements pipeline.PoolGuard: a collection and a trim of the
// tarball cache after every pull.
func (c *Collector) Pulled(ctx context.Context, imageID string) {
	if !c.opts.Disabled {
		if _, err := c.collect(ctx, "pull", 0, imageID); err != nil {
			log.G(ctx).WithError(err).WithField("image", imageID).Warn("gc: collection after a pull")
		}
	}
	if _, err := c.TrimTarballs(ctx, imageID); err != nil {
		log.G(ctx).WithError(err).WithField("image", imageID).Warn("gc: trimming the tarball cache after a pull")
	}
}

// Preparing implements pipeline.PoolGuard: containerd prepared active
// snapshot key in the pool to write a layer into (a registry image's,
// which no pull of ours guards). Until its commit or removal (Committed,
// Dropped), or ApplyWatch at most, Loop reads the pool's usage every
// ApplyPoll and collects ("apply") as soon as usage, with the bytes not
// allocated yet (Pending), is past the high threshold: the layer is made
// room for while containerd writes it, not after its commit, which
// containerd makes under its database's lock, where no collection can run.
// Preparing never blocks, for the same reason.
func (c *Collector) Preparing(ctx context.Context, key string) {
	if c.opts.Disabled {
		return
	}
	c.wmu.Lock()
	c.writing[key] = time.Now()
	c.wmu.Unlock()
	wake(c.preparing)
	log.G(ctx).WithField("key", key).Debug("gc: containerd writes a layer into the pool: watching usage")
}

// Committed implements pipeline.PoolGuard: containerd committed active
// snapshot key as name in the pool (a registry image's layer, which no
// pull of ours guards), so Loop stops watching key and collects now
// (unless Disabled). It never blocks: its caller is containerd, under its
// database's lock, which a collection's removals through containerd need.
func (c *Collector) Committed(ctx context.Context, name, key string) {
	c.written(key)
	if c.opts.Disabled {
		return
	}
	if wake(c.committed) {
		log.G(ctx).WithField("name", name).Debug("gc: containerd committed a snapshot: collection asked for")
	}
}

// Dropped implements pipeline.PoolGuard: containerd removed snapshot key,
// so Loop stops watching it (an unpack given up). It never blocks.
func (c *Collector) Dropped(_ context.Context, key string) { c.written(key) }

// written ends the watch of containerd's write into key, if any.
func (c *Collector) written(key string) {
	c.wmu.Lock()
	delete(c.writing, key)
	c.wmu.Unlock()
}

// wake leaves one wake-up in ch unless one is pending, and reports whether
// it did.
func wake(ch chan struct{}) bool {
	select {
	case ch <- struct{}{}:
		return true
	default:
		return false
	}
}

// Loop collects (unless Disabled) and trims the tarball cache every
// Options.Interval, collects after containerd's commits (Committed), and
// watches the pool while containerd writes layers into it (Preparing),
// until ctx is done.
func (c *Collector) Loop(ctx context.Context) {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	var watch *time.Ticker
	stopWatch := func() {
		if watch != nil {
			watch.Stop()
			watch = nil
		}
	}
	defer stopWatch()
	for {
		var poll <-chan time.Time
		if watch != nil {
			poll = watch.C
		}
		select {
		case <-ctx.Done():
			return
		case <-c.preparing:
			if watch == nil {
				watch = time.NewTicker(c.opts.ApplyPoll)
			} else {
				watch.Reset(c.opts.ApplyPoll)
			}
		case <-poll:
			// A pool past the threshold with every image in use stays so
			// until a container or an image goes: checking it again at
			// every poll would only repeat the collection and its log
			// line, so the polls slow down until the next write begins.
			switch watching, stuck := c.watchWrites(ctx); {
			case !watching:
				stopWatch()
			case stuck:
				watch.Reset(applyStuckPolls * c.opts.ApplyPoll)
			}
		case <-c.committed:
			if _, err := c.Collect(ctx, "commit", 0); err != nil {
				log.G(ctx).WithError(err).Warn("gc: collection after containerd's commit")
			}
		case <-t.C:
			if !c.opts.Disabled {
				if _, err := c.Collect(ctx, "timer", 0); err != nil {
					log.G(ctx).WithError(err).Warn("gc: periodic collection")
				}
			}
			if _, err := c.TrimTarballs(ctx, ""); err != nil {
				log.G(ctx).WithError(err).Warn("gc: trimming the tarball cache")
			}
		}
	}
}

// watchWrites stops watching the writes containerd began more than
// ApplyWatch ago, then, while one is still under way, collects when the
// pool with the bytes not allocated yet is past the high threshold. It
// reports whether a write is still watched, and whether the pool stayed
// past the threshold with nothing it could remove.
func (c *Collector) watchWrites(ctx context.Context) (watching, stuck bool) {
	c.wmu.Lock()
	for key, at := range c.writing {
		if time.Since(at) > c.opts.ApplyWatch {
			delete(c.writing, key)
			log.G(ctx).WithField("key", key).WithField("since", at).Warn("gc: containerd's write into the pool neither committed nor removed: no longer watched")
		}
	}
	n := len(c.writing)
	c.wmu.Unlock()
	if n == 0 {
		return false, false
	}
	glance := c.opts.Glance
	if glance == nil {
		glance = c.opts.Usage
	}
	u, err := glance(ctx)
	if err != nil {
		log.G(ctx).WithError(err).Warn("gc: pool usage while containerd writes a layer")
		return true, false
	}
	var pending uint64
	if c.opts.Pending != nil {
		if pending, err = c.opts.Pending(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("gc: bytes not yet written to the pool: counting none")
		}
		// The host's dirty pages are every filesystem's, not only the
		// pool's: at most the band between the thresholds counts, so that
		// another workload's writes can start a collection no earlier than
		// the low threshold, and make it go at most that band below it.
		pending = min(pending, uint64(float64(u.dataTotal())*(c.opts.HighThreshold-c.opts.LowThreshold)/100))
	}
	if !over(u, pending, c.opts.HighThreshold) {
		return true, false
	}
	rep, err := c.Collect(ctx, "apply", pending)
	if err != nil {
		log.G(ctx).WithError(err).Warn("gc: collection while containerd writes a layer")
	}
	return true, rep != nil && len(rep.Removed) == 0 && over(rep.After, pending, c.opts.HighThreshold)
}

// Report is what one collection did.
type Report struct {
	Trigger       string
	Before, After Usage
	Removed       []api.Removed
	// Kept maps the images that would have been removed, were they not in
	// use, to why they are in use.
	Kept     map[string]string
	Duration time.Duration
}

// over reports whether the pool, with need more data bytes, is at or past
// pct of its data or metadata, or the host filesystem is.
func over(u Usage, need uint64, pct float64) bool {
	return poolOver(u, need, pct) || u.HostPercent() >= pct
}

// Collect removes unused images, least recently used first, when the pool
// with need more data bytes is at or past the high threshold, until it is
// under the low threshold or nothing unused is left. trigger names what
// asked for it ("pull", "room", "timer", "commit", "apply", "low_water"),
// for the logs and the metric.
func (c *Collector) Collect(ctx context.Context, trigger string, need uint64) (*Report, error) {
	return c.collect(ctx, trigger, need, "")
}

// collect is Collect for a caller that is itself a pull under way, of
// image own (callerPull when its image is not known; "" for a caller that
// is no pull): the chains of no image are swept unless a pull other than
// that one is under way.
func (c *Collector) collect(ctx context.Context, trigger string, need uint64, own string) (*Report, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	u, err := c.opts.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("gc: pool usage: %w", err)
	}
	rep := &Report{Trigger: trigger, Before: u, After: u, Kept: map[string]string{}}
	if c.hostOther && u.HostPercent() < c.opts.HighThreshold {
		c.hostOther = false
	}
	over := func(u Usage, need uint64, pct float64) bool {
		return poolOver(u, need, pct) || !c.hostOther && u.HostPercent() >= pct
	}
	if !over(u, need, c.opts.HighThreshold) {
		return rep, nil
	}
	lg := log.G(ctx).WithField("trigger", trigger).WithField("usage", u.String()).WithField("need", bytesOf(need))
	lg.Info("gc: pool usage past the high threshold: removing unused images")
	defer func() {
		rep.Duration = time.Since(start)
		if c.opts.Observer != nil {
			c.opts.Observer.Ran(trigger, rep.Duration)
		}
		log.G(ctx).WithField("trigger", trigger).WithField("usage", rep.After.String()).WithField("removed", len(rep.Removed)).
			WithField("kept_in_use", len(rep.Kept)).WithField("duration", rep.Duration).Info("gc: collection done")
	}()
	pool, err := c.look(ctx)
	if err != nil {
		return rep, err
	}
	imgs, err := Images(ctx, c.opts.DB)
	if err != nil {
		return rep, fmt.Errorf("gc: %w", err)
	}
	var errs []error
	if pool.blind != nil {
		lg.WithError(pool.blind).Warn("gc: containerd is not answering: chains no S3 image has are kept (a registry image may have them), and so are the S3 images containerd has names of, until it answers")
	} else if freed, err := c.sweepOrphans(ctx, pool.orphans(imgs, ""), "usage", own); err != nil {
		errs = append(errs, err)
	} else if freed != 0 {
		if u, err = c.opts.Usage(ctx); err != nil {
			return rep, fmt.Errorf("gc: pool usage: %w", err)
		}
		rep.After = u
	}
	for _, cd := range pool.candidates(imgs) {
		if !over(u, need, c.opts.LowThreshold) {
			break
		}
		if why, err := c.inUse(ctx, cd, pool); err != nil {
			errs = append(errs, err)
			continue
		} else if why != "" {
			rep.Kept[cd.id()] = why
			log.G(ctx).WithField("image", cd.id()).WithField("kind", cd.kind()).WithField("why", why).Debug("gc: image in use, kept")
			continue
		}
		reason := fmt.Sprintf("pool at %s with %s more needed, past the %v%% threshold; image unused since %s",
			u.String(), bytesOf(need), c.opts.HighThreshold, cd.usedAt.Format(time.RFC3339))
		r, err := c.remove(ctx, cd, pool, "usage", reason)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Removed = append(rep.Removed, *r)
		prev := u
		if u, err = c.opts.Usage(ctx); err != nil {
			return rep, fmt.Errorf("gc: pool usage: %w", err)
		}
		rep.After = u
		if !poolOver(prev, need, c.opts.LowThreshold) && u.HostUsed >= prev.HostUsed {
			// Only the host filesystem was over, and removing an image
			// freed nothing there: what fills it is not the images'.
			lg.WithField("usage", u.String()).Warn("gc: removing an image freed nothing on the host filesystem, which is over the threshold for another reason; no more images are removed for it")
			c.hostOther = true
			break
		}
	}
	return rep, errors.Join(errs...)
}

// poolOver reports whether the pool's data (with need more) or metadata
// is at pct or more: over, leaving the host filesystem out.
func poolOver(u Usage, need uint64, pct float64) bool {
	return percent(u.DataUsed+need, u.dataTotal()) >= pct || u.MetaPercent() >= pct
}

// poolView is what one collection sees of the pool: the snapshots on each
// snapshot, where each chain's committed snapshot is, and containerd's
// images in the pool.
type poolView struct {
	// children maps a snapshot key to the snapshots on it.
	children map[string][]snapshots.Info
	// ours are the chains the pipelines committed (their key is the
	// chain ID), with what the snapshotter says of each.
	ours map[string]snapshots.Info
	// theirs maps a namespace and a chain ID (nsChain) to the key of the
	// chain's snapshot containerd's unpacker committed in that namespace,
	// and a chain ID alone to the first such key in any namespace (the one
	// another namespace adopts: containerd unpacks a chain once per pool
	// here).
	theirs map[string]string
	// images are containerd's images in the pool (Names.PoolImages).
	images []pipeline.PoolImage
	// blind says why containerd's images could not be listed (its socket
	// is absent: not started yet, or restarting), nil when they were.
	// Without them nothing says which chains its registry images have,
	// or which of our names its containers and pins use.
	blind error
}

func nsChain(ns, chain string) string { return ns + "\x00" + chain }

// look walks the pool's snapshots and asks containerd for its images.
func (c *Collector) look(ctx context.Context) (*poolView, error) {
	v := &poolView{children: map[string][]snapshots.Info{}, ours: map[string]snapshots.Info{}, theirs: map[string]string{}}
	err := c.opts.Snapshots.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Parent != "" {
			v.children[info.Parent] = append(v.children[info.Parent], info)
		}
		if info.Kind != snapshots.KindCommitted {
			return nil
		}
		if _, ours := info.Labels[pipeline.LabelSource]; ours {
			v.ours[info.Name] = info
			return nil
		}
		// containerd names its snapshots in its proxy plugins
		// "<namespace>/<n>/<key>", and its unpacker commits a chain
		// under the chain ID with containerd.io/snapshot.ref = it.
		ref := info.Labels[snapshots.LabelSnapshotRef]
		ns, _, ok := strings.Cut(info.Name, "/")
		if ok && ref != "" && strings.HasSuffix(info.Name, "/"+ref) {
			for _, k := range []string{nsChain(ns, ref), ref} {
				if _, seen := v.theirs[k]; !seen {
					v.theirs[k] = info.Name
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gc: walk snapshots: %w", err)
	}
	if c.opts.Names != nil {
		v.images, err = c.opts.Names.PoolImages(ctx)
		switch {
		case errors.Is(err, pipeline.ErrContainerdAbsent):
			v.blind = err
		case err != nil:
			return nil, fmt.Errorf("gc: containerd's images: %w", err)
		}
	}
	return v, nil
}

// candidate is an image collection may remove: an S3 image of ours, or a
// registry image in one containerd namespace.
type candidate struct {
	s3  *Image
	reg *pipeline.PoolImage
	// records are containerd's records of the image: the S3 image's
	// names, in every namespace, or the registry image's own.
	records []pipeline.PoolImage
	// keys are the snapshot keys of its chains in our pool, bottom first.
	keys []string
	// chains are its chain IDs, bottom first.
	chains []string
	usedAt time.Time
}

// id names the image in reports and logs: an S3 image's ID, or
// "NAMESPACE/NAME" of containerd's.
func (cd *candidate) id() string {
	if cd.s3 != nil {
		return cd.s3.ImageID
	}
	return cd.reg.Namespace + "/" + cd.reg.Name
}

func (cd *candidate) kind() string {
	if cd.s3 != nil {
		return api.SourceS3
	}
	return api.SourceRegistry
}

func (cd *candidate) names() []string {
	if cd.s3 != nil {
		return cd.s3.Names
	}
	return []string{cd.reg.Name}
}

// s3Candidate is S3 image im with containerd's records of its names.
func (v *poolView) s3Candidate(im *Image) *candidate {
	cd := &candidate{s3: im, keys: im.Chains, chains: im.Chains, usedAt: im.UsedAt}
	for _, pi := range v.images {
		if pi.Ours && slices.Contains(im.Names, pi.Name) {
			cd.records = append(cd.records, pi)
			if pi.UsedAt.After(cd.usedAt) && len(pi.Containers) > 0 {
				cd.usedAt = pi.UsedAt
			}
		}
	}
	return cd
}

// candidates are the S3 images imgs and containerd's registry images in
// the pool, least recently used first (an S3 image before a registry
// image used at the same time).
func (v *poolView) candidates(imgs []*Image) []*candidate {
	var out []*candidate
	for _, im := range imgs {
		out = append(out, v.s3Candidate(im))
	}
	for i := range v.images {
		pi := &v.images[i]
		if pi.Ours {
			continue
		}
		cd := &candidate{reg: pi, records: []pipeline.PoolImage{*pi}, chains: pi.Chains, usedAt: pi.UsedAt}
		for _, ch := range pi.Chains {
			if k, ok := v.theirs[nsChain(pi.Namespace, ch)]; ok {
				cd.keys = append(cd.keys, k)
			} else if _, ok := v.ours[ch]; ok {
				cd.keys = append(cd.keys, ch)
			} else if k, ok := v.theirs[ch]; ok {
				cd.keys = append(cd.keys, k)
			}
		}
		out = append(out, cd)
	}
	slices.SortStableFunc(out, func(a, b *candidate) int { return a.usedAt.Compare(b.usedAt) })
	return out
}

// inUse says why image cd must be kept, or "" when nothing uses it.
// pullRunsLive says why an image whose activate run is live is kept.
const pullRunsLive = "a pull of it is under way in the daemon (its runs go on after the pull's client left); try again once `ls runs --filter state=pending,running` no longer lists them"

func (c *Collector) inUse(ctx context.Context, cd *candidate, v *poolView) (string, error) {
	for _, n := range cd.names() {
		if slices.Contains(c.opts.Pinned, n) {
			return fmt.Sprintf("pinned: %q is in [gc] pinned", n), nil
		}
	}
	if cd.s3 != nil {
		// A source pins with or without a prefix's final '/', as rm
		// names it.
		src := strings.TrimSuffix(cd.s3.Source, "/")
		for _, p := range c.opts.Pinned {
			if strings.TrimSuffix(p, "/") == src {
				return fmt.Sprintf("pinned: its source %q is in [gc] pinned", p), nil
			}
		}
	}
	if cd.s3 != nil {
		c.pmu.Lock()
		pulling := c.pulling[cd.s3.ImageID]
		c.pmu.Unlock()
		if pulling > 0 {
			return "a pull of it is under way", nil
		}
		live, err := pipeline.RecordsOf(c.opts.DB).ActivationLive(ctx, cd.s3.ImageID)
		if err != nil {
			return "", err
		}
		if live {
			return pullRunsLive, nil
		}
		// An activation's device is what an operator hands a VM, or
		// mounts, by its path: no record says so, the kernel's open
		// count does.
		key := pipeline.ActivationKey(cd.s3.ImageID)
		held, err := c.opts.Snapshots.HeldOpen(ctx, key)
		if err != nil && !errdefs.IsNotFound(err) {
			return "", fmt.Errorf("gc: image %s: %w", cd.id(), err)
		}
		if held {
			return fmt.Sprintf("its activation's device (snapshot %q) is open: a VM, a mount or a process uses it", key), nil
		}
	}
	if v.blind != nil && cd.s3 != nil {
		for _, n := range cd.s3.Names {
			if !cd.s3.Pending[n] {
				return fmt.Sprintf("containerd has its name %q, and whether a container or a pin of containerd's uses it cannot be checked while containerd does not answer (%v)", n, v.blind), nil
			}
		}
	}
	for _, r := range cd.records {
		switch {
		case r.Pinned:
			return fmt.Sprintf("pinned: %q carries containerd's label %s in namespace %s", r.Name, pipeline.LabelPinned, r.Namespace), nil
		case len(r.Containers) > 0:
			return fmt.Sprintf("containerd's container %q in namespace %s is made on %q", r.Containers[0], r.Namespace, r.Name), nil
		case r.Lease != "":
			return fmt.Sprintf("containerd's lease %q in namespace %s holds %q (a pull or an unpack under way)", r.Lease, r.Namespace, r.Name), nil
		}
	}
	for i, k := range cd.keys {
		for _, info := range v.children[k] {
			// A committed snapshot on a chain is another image's layer,
			// which keeps the chain by itself; an active snapshot or a
			// view that is not the pipelines' is a container's.
			if _, private := info.Labels[pipeline.LabelPrivate]; private || info.Kind == snapshots.KindCommitted {
				continue
			}
			return fmt.Sprintf("snapshot %q (a container's) is on layer %d", info.Name, i+1), nil
		}
	}
	err := c.opts.DB.WithTx(ctx, func(tx *sql.Tx) error {
		for _, ch := range cd.chains {
			if err := c.opts.Guard(ch)(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	})
	if errdefs.IsFailedPrecondition(err) {
		return "a live run or a pull under way uses it: " + err.Error(), nil
	}
	if err != nil {
		return "", fmt.Errorf("gc: live runs on image %s: %w", cd.id(), err)
	}
	return "", nil
}

// remove removes image cd (removeS3, or containerd's removal of a registry
// image), logs and counts the removal.
func (c *Collector) remove(ctx context.Context, cd *candidate, v *poolView, cause, reason string) (*api.Removed, error) {
	before, err := c.opts.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("remove image %s: pool usage: %w", cd.id(), err)
	}
	r := &api.Removed{Kind: cd.kind(), Names: cd.names(), Reason: reason}
	if cd.s3 != nil {
		r.ImageID, r.Source = cd.s3.ImageID, cd.s3.Source
		err = c.removeS3(ctx, cd.s3, v)
	} else {
		r.Namespace = cd.reg.Namespace
		err = c.opts.Names.RemoveImage(ctx, cd.reg.Namespace, cd.reg.Name)
	}
	// Also after a removal refused half-way (a layer something was put on
	// since the check): the layers above it and the activation are gone,
	// so their devices are deleted and their records forgotten now.
	if err := c.opts.Snapshots.Cleanup(ctx); err != nil {
		log.G(ctx).WithError(err).WithField("image", cd.id()).Warn("gc: deleting the removed devices (the next cleanup retries)")
	}
	if err := c.opts.Prune(ctx); err != nil {
		log.G(ctx).WithError(err).WithField("image", cd.id()).Warn("gc: pruning the records and files of the removed image")
	}
	if err != nil {
		return nil, err
	}
	after, err := c.opts.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("remove image %s: pool usage: %w", cd.id(), err)
	}
	r.Freed = int64(before.DataUsed) - int64(after.DataUsed)
	lg := log.G(ctx).WithField("image", cd.id()).WithField("kind", r.Kind).WithField("names", strings.Join(r.Names, ","))
	if cd.s3 != nil {
		lg = lg.WithField("source", r.Source)
	} else {
		lg = lg.WithField("namespace", r.Namespace)
	}
	lg.WithField("cause", cause).WithField("reason", reason).WithField("freed", bytesOf(uint64(max(r.Freed, 0)))).
		WithField("usage", after.String()).Info("gc: image removed")
	if c.opts.Observer != nil {
		c.opts.Observer.Removed(cause, r.Kind, r.Freed)
	}
	return r, nil
}

// removeS3 removes S3 image im: its names, activation, the chains no other
// image has (top first), their devices, then its records.
func (c *Collector) removeS3(ctx context.Context, im *Image, v *poolView) error {
	// A pull starting from here on waits in Begin while c.removing names
	// the image, so runs that are not live now do not start before the
	// removal ends.
	live, err := pipeline.RecordsOf(c.opts.DB).ActivationLive(ctx, im.ImageID)
	if err != nil {
		return fmt.Errorf("remove image %s (%s): %w", im.ImageID, im.Source, err)
	}
	c.pmu.Lock()
	if c.pulling[im.ImageID] > 0 {
		c.pmu.Unlock()
		return fmt.Errorf("remove image %s (%s): a pull of it is under way: %w", im.ImageID, im.Source, ErrInUse)
	}
	if live {
		c.pmu.Unlock()
		return fmt.Errorf("remove image %s (%s): %s: %w", im.ImageID, im.Source, pullRunsLive, ErrInUse)
	}
	c.removing = im.ImageID
	c.pmu.Unlock()
	defer func() {
		c.pmu.Lock()
		c.removing = ""
		c.cond.Broadcast()
		c.pmu.Unlock()
	}()
	what := fmt.Sprintf("remove image %s (%s)", im.ImageID, im.Source)
	// The image's chains and which of them another image shares are read
	// again now: a collection lists every image before its first removal,
	// and an image removed since may have been the one sharing a chain.
	im, err = ImageByID(ctx, c.opts.DB, im.ImageID)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if im == nil {
		return nil
	}
	if c.opts.Names != nil {
		for _, n := range im.Names {
			if err := c.opts.Names.Unregister(ctx, n); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
	}
	if err := c.opts.Snapshots.Remove(ctx, pipeline.ActivationKey(im.ImageID)); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("%s: activation: %w", what, err)
	}
	for i := len(im.Chains) - 1; i >= 0; i-- {
		ch := im.Chains[i]
		if im.SharedChains[ch] || v.layerOn(ch, im.Chains) || v.adopted(ch) {
			// Another image's layers use it (an S3 image's, one
			// containerd unpacked on it, or a registry image whose
			// layers are these): its chain ID covers the layers below
			// it, so they are shared too.
			break
		}
		restore, err := dropLayer(ctx, c.opts.DB, im.ImageID, ch)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		err = c.opts.Snapshots.RemoveIf(ctx, ch, c.opts.Guard(ch))
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			// Something was put on it since it was checked: it stays,
			// with what is below it, and so does the image's record of it.
			if rerr := restore(ctx); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return fmt.Errorf("%s: layer %d (chain %s): %w", what, i+1, ch, err)
		}
	}
	if err := pipeline.RecordsOf(c.opts.DB).DeleteImage(ctx, im.ImageID); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// orphans are the chains the pipelines committed that no image has (no S3
// image of imgs, no containerd image in the pool), top first; with source
// set, only those whose layer came from one of that s3:// source's
// objects. A pull that failed
// after its unpacks (its layout refused, its name taken or refused by
// containerd) leaves such chains: no image's removal ever reaches them.
func (v *poolView) orphans(imgs []*Image, source string) []string {
	had := map[string]bool{}
	for _, im := range imgs {
		for _, ch := range im.Chains {
			had[ch] = true
		}
	}
	for _, pi := range v.images {
		for _, ch := range pi.Chains {
			had[ch] = true
		}
	}
	depth := func(ch string) int {
		n := 0
		for info, ok := v.ours[ch]; ok && info.Parent != ""; info, ok = v.ours[info.Parent] {
			n++
		}
		return n
	}
	var out []string
	for ch, info := range v.ours {
		if !had[ch] && (source == "" || fromSource(info.Labels[pipeline.LabelSource], source)) {
			out = append(out, ch)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Or(depth(b)-depth(a), strings.Compare(a, b)) })
	return out
}

// fromSource reports whether the S3 object url (a chain's LabelSource) is
// one of source's layers: source itself, or an object under a prefix
// source.
func fromSource(url, source string) bool {
	return url == source || strings.HasSuffix(source, "/") && strings.HasPrefix(url, source)
}

// sweepOrphans removes the orphan chains given (top first), each guarded
// like an image's chain, while no pull other than the caller's own (of
// image own, see holdPulls) runs: a pull under way may be about to name
// one in its image. A chain something was put on, or a live run uses,
// stays. It reports the pool data freed.
func (c *Collector) sweepOrphans(ctx context.Context, chains []string, cause, own string) (int64, error) {
	if len(chains) == 0 {
		return 0, nil
	}
	release, ok := c.holdPulls(own)
	if !ok {
		return 0, nil
	}
	defer release()
	before, err := c.opts.Usage(ctx)
	if err != nil {
		return 0, fmt.Errorf("gc: pool usage: %w", err)
	}
	removed := 0
	for _, ch := range chains {
		err := c.opts.Snapshots.RemoveIf(ctx, ch, c.opts.Guard(ch))
		switch {
		case err == nil:
			removed++
		case errdefs.IsNotFound(err):
		case errdefs.IsFailedPrecondition(err):
			log.G(ctx).WithField("chain", ch).WithError(err).Debug("gc: chain of no image kept")
		default:
			return 0, fmt.Errorf("gc: remove chain %s of no image: %w", ch, err)
		}
	}
	if removed == 0 {
		return 0, nil
	}
	if err := c.opts.Snapshots.Cleanup(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("gc: deleting the removed devices (the next cleanup retries)")
	}
	if err := c.opts.Prune(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("gc: pruning the records of the removed chains")
	}
	after, err := c.opts.Usage(ctx)
	if err != nil {
		return 0, fmt.Errorf("gc: pool usage: %w", err)
	}
	freed := int64(before.DataUsed) - int64(after.DataUsed)
	log.G(ctx).WithField("chains", removed).WithField("cause", cause).WithField("freed", bytesOf(uint64(max(freed, 0)))).
		WithField("usage", after.String()).Info("gc: chains of no image removed (left by failed pulls)")
	if c.opts.Observer != nil {
		c.opts.Observer.Freed(cause, api.SourceS3, freed)
	}
	return freed, nil
}

// adopted reports whether one of containerd's registry images has chain
// among its layers: containerd's unpacker found the chain committed here
// (its snapshot.ref) and took it as is, so nothing of containerd's sits on
// it and only the image's own chain list says it is used.
func (v *poolView) adopted(chain string) bool {
	for _, pi := range v.images {
		if !pi.Ours && slices.Contains(pi.Chains, chain) {
			return true
		}
	}
	return false
}

// layerOn reports whether a committed snapshot other than the chains own
// sits on key: another image's layer.
func (v *poolView) layerOn(key string, own []string) bool {
	for _, info := range v.children[key] {
		if info.Kind == snapshots.KindCommitted && !slices.Contains(own, info.Name) {
			return true
		}
	}
	return false
}

// Remove removes the pulled images named refs (a name or an s3:// source),
// the way a collection does, refusing one in use with the reason (ErrInUse)
// and one never pulled (errdefs.ErrNotFound). It goes on past a refusal
// and returns every image removed with the errors joined.
func (c *Collector) Remove(ctx context.Context, refs []string) ([]api.Removed, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pool, err := c.look(ctx)
	if err != nil {
		return nil, err
	}
	var (
		out  []api.Removed
		errs []error
	)
	for _, ref := range refs {
		id, err := pipeline.RecordsOf(c.opts.DB).ImageIDByRef(ctx, ref)
		if err != nil {
			errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
			continue
		}
		var im *Image
		if id != "" {
			if im, err = ImageByID(ctx, c.opts.DB, id); err != nil {
				errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
				continue
			}
		}
		if im == nil {
			live, err := pipeline.RecordsOf(c.opts.DB).ActivationLiveOfRef(ctx, ref)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
			case live:
				errs = append(errs, fmt.Errorf("rm %s: %s: %w", ref, pullRunsLive, ErrInUse))
			default:
				errs = append(errs, fmt.Errorf("rm %s: no image pulled under that name: %w", ref, errdefs.ErrNotFound))
			}
			continue
		}
		cd := pool.s3Candidate(im)
		why, err := c.inUse(ctx, cd, pool)
		if err != nil {
			errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
			continue
		}
		if why != "" {
			errs = append(errs, fmt.Errorf("rm %s: image %s is in use (%s): %w", ref, im.ImageID, why, ErrInUse))
			continue
		}
		r, err := c.remove(ctx, cd, pool, "rm", "removed by rm "+ref)
		if err != nil {
			errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
			continue
		}
		// A pull of the source that failed after its unpacks left chains
		// that no image names: they go with the image, unless containerd
		// is not answering (a registry image of its may have them).
		imgs, err := Images(ctx, c.opts.DB)
		if err == nil && pool.blind == nil {
			var freed int64
			freed, err = c.sweepOrphans(ctx, pool.orphans(imgs, im.Source), "rm", "")
			r.Freed += freed
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
		}
		out = append(out, *r)
	}
	return out, errors.Join(errs...)
}

// MakeRoom implements pipeline.PoolGuard: it collects when the pool could
// not take needs, with the room it gave the pulls still under way, below
// the high threshold, grows the pool (Options.Grow) while the layers still
// do not fit, then refuses the pull (ErrNoRoom) when a layer does not fit
// in the data space left, or when the metadata is past the high threshold
// (new devices would fill it, and a full metadata device turns the pool
// read-only). The room it lets a pull have is counted as taken until the
// pull calls release, as well as whatever of it the pull's writes show in
// the pool's usage by then: a pull's share of the usage cannot be told
// apart from the containers' writes, and counting it twice refuses a pull
// that would have fitted, where counting it not at all lets pulls fill
// the pool together.
func (c *Collector) MakeRoom(ctx context.Context, source string, needs []pipeline.LayerNeed) (release func(), err error) {
	c.room.Lock()
	defer c.room.Unlock()
	var total uint64
	for _, n := range needs {
		total += need(n.Bytes)
	}
	if err := c.makeRoom(ctx, source, needs, total); err != nil {
		return func() {}, err
	}
	c.gmu.Lock()
	c.given += total
	c.givenPulls++
	c.gmu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.gmu.Lock()
			c.given -= total
			c.givenPulls--
			c.gmu.Unlock()
		})
	}, nil
}

// makeRoom is MakeRoom's judgment of needs, total bytes with the margin,
// under c.room.
func (c *Collector) makeRoom(ctx context.Context, source string, needs []pipeline.LayerNeed, total uint64) error {
	c.gmu.Lock()
	others, otherPulls := c.given, c.givenPulls
	c.gmu.Unlock()
	// A pull larger than what the pool's whole data space, grown as far as
	// it may, holds above its reserve would not fit with every image
	// removed (new devices are refused under the reserve): refuse it
	// before the collection empties the pool for nothing. The pulls under
	// way end; they are not counted here.
	u, err := c.grow(ctx, source, func(u Usage) bool { return u.DataAboveReserve() >= total })
	if err != nil {
		return err
	}
	if u.DataTotal == 0 {
		return fmt.Errorf("pull %s: the pool's status has no block counts (a failed pool; `pool status` shows its mode): it needs repair, not room: %w",
			source, ErrNoRoom)
	}
	if total > u.DataAboveReserve() {
		above := ""
		if u.DataReserve > 0 {
			above = fmt.Sprintf(" holds above its reserve of %s (pool.min_free_space, under which new devices are refused),", bytesOf(u.DataReserve))
		}
		return fmt.Errorf("pull %s: its layers need %s, more than the pool's whole data space (%s)%s even with every image removed: %w",
			source, bytesOf(total), bytesOf(u.DataTotal), above, ErrNoRoom)
	}
	// Disabled removes no image for the pull; what cannot fit is still
	// refused before any device is made.
	var rep *Report
	if !c.opts.Disabled {
		// MakeRoom's caller is a pull under way (pipeline.PoolGuard), the
		// only one when no other is.
		if rep, err = c.collect(log.WithLogger(ctx, log.G(ctx).WithField("source", source)), "room", total+others, callerPull); err != nil {
			log.G(ctx).WithError(err).WithField("source", source).Warn("gc: collection before a pull")
		}
	}
	if u, err = c.grow(ctx, source, func(u Usage) bool { return u.DataRoom() >= total+others }); err != nil {
		return err
	}
	kept := ""
	if rep != nil && len(rep.Kept) > 0 {
		kept = fmt.Sprintf("; %d image(s) in use kept", len(rep.Kept))
	}
	if u.MetaPercent() >= c.opts.HighThreshold {
		return fmt.Errorf("pull %s: the pool's metadata is %.1f%% used, at or past the %v%% threshold, after garbage collection%s: %w",
			source, u.MetaPercent(), c.opts.HighThreshold, kept, ErrNoRoom)
	}
	free, reserve := u.DataRoom(), ""
	if u.DataReserve > 0 {
		reserve = fmt.Sprintf(", above its reserve of %s (pool.min_free_space, under which new devices are refused),", bytesOf(u.DataReserve))
	}
	if u.Backed && u.BackingRoom < u.DataFree()-min(u.DataFree(), u.DataReserve) {
		reserve += fmt.Sprintf(" of which the filesystem under the pool's loop files can back only %s more (free space there),", bytesOf(u.BackingRoom))
	}
	if others > 0 {
		reserve += fmt.Sprintf(" less the %s given to %d other pull(s) under way,", bytesOf(others), otherPulls)
		free -= min(free, others)
	}
	var cum uint64
	for _, n := range needs {
		cum += need(n.Bytes)
		if cum > free {
			return fmt.Errorf("pull %s: layer %d (%s, %s) does not fit: the pool has %s free after garbage collection%s and the pull's layers up to this one need %s%s: %w",
				source, n.Position, n.Key, bytesOf(uint64(n.Bytes)), bytesOf(free), reserve, bytesOf(cum), kept, ErrNoRoom)
		}
	}
	return nil
}

// grow grows the pool (Options.Grow) one step at a time until enough says
// its usage is enough or it cannot grow, and returns the usage then. A
// pool whose status has no block counts (a failed pool) is not grown: no
// growth would show in its usage, and it needs repair.
func (c *Collector) grow(ctx context.Context, source string, enough func(Usage) bool) (Usage, error) {
	u, err := c.opts.Usage(ctx)
	if err != nil {
		return u, fmt.Errorf("pull %s: pool usage: %w", source, err)
	}
	for c.opts.Grow != nil && u.DataTotal > 0 && !enough(u) {
		grew, err := c.opts.Grow(ctx)
		if err != nil {
			log.G(ctx).WithError(err).WithField("source", source).Warn("gc: growing the pool for a pull")
		}
		if !grew {
			break
		}
		if u, err = c.opts.Usage(ctx); err != nil {
			return u, fmt.Errorf("pull %s: pool usage: %w", source, err)
		}
	}
	return u, nil
}

// need is what a layer tarball of n bytes is taken to take in the pool.
func need(n int64) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n) + uint64(n)/marginDivisor
}
