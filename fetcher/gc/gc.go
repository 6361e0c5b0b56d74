// Package gc keeps the thin pool from filling up with pulled S3 images:
// when the pool's data or metadata usage crosses a high threshold it
// removes the images nothing uses, least recently used first (last pull or
// activation), until usage is under a low threshold; before a pull makes
// any device it makes room for the pull's layers and refuses the pull when
// they cannot fit; and it removes images an operator names (`rm`). An image
// is in use, so never removed, while a container snapshot sits on one of
// its chains, a pull of it or a live run on its chains is under way, or it
// is pinned (by name in the configuration, or by containerd's pinned
// label).
//
// Removing an image removes its names from containerd first (so that
// containerd never lists a name whose snapshots are gone), then its
// activation, the chains no other image uses (top first), their devices,
// and last its records, with the objects and layer files nothing else
// needs: a crash half-way leaves the image recorded, and the next
// collection finishes the removal.
package gc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// Defaults of Options.
const (
	DefaultHighThreshold = 85.0 // percent of the pool's data or metadata
	DefaultLowThreshold  = 80.0
	DefaultInterval      = 5 * time.Minute
)

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
// filesystems holding the downloads and the pool's loop files: when the
// host runs low, removing images (their tarballs, and the blocks their
// devices held in the loop files) is what frees it.
type Usage struct {
	DataUsed, DataTotal uint64
	MetaUsed, MetaTotal uint64
	HostUsed, HostTotal uint64
}

// HostUsage returns the used and total bytes of the fullest filesystem
// holding one of paths (used counts what the daemon cannot use: the
// filesystem's reserve for root is not free to it either).
func HostUsage(paths ...string) (used, total uint64, err error) {
	for _, p := range paths {
		var fs unix.Statfs_t
		if err := unix.Statfs(p, &fs); err != nil {
			return 0, 0, fmt.Errorf("statfs %s: %w", p, err)
		}
		t := fs.Blocks * uint64(fs.Bsize)
		u := t - min(t, fs.Bavail*uint64(fs.Bsize))
		if percent(u, t) > percent(used, total) {
			used, total = u, t
		}
	}
	return used, total, nil
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

// DataPercent is the data usage in percent.
func (u Usage) DataPercent() float64 { return percent(u.DataUsed, u.DataTotal) }

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
	s := fmt.Sprintf("data %.1f%% (%s of %s), metadata %.1f%%", u.DataPercent(), bytesOf(u.DataUsed), bytesOf(u.DataTotal), u.MetaPercent())
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
}

// Names is where images are registered under their names
// (*pipeline.ContainerdRegistrar).
type Names interface {
	// Unregister removes name where it names an image this daemon
	// created (an image of that name someone else made stays as it is);
	// an absent name is not an error.
	Unregister(ctx context.Context, name string) error
	// Pinned reports whether name, as an image this daemon created, is
	// pinned there.
	Pinned(ctx context.Context, name string) (bool, error)
}

// Observer counts what collection does (*metrics.GC).
type Observer interface {
	// Ran counts one collection that was triggered by trigger and took d.
	Ran(trigger string, d time.Duration)
	// Removed counts one image removed for cause ("usage" or "rm") and the
	// pool data bytes its removal freed.
	Removed(cause string, freed int64)
}

// Options configure New. DB, Snapshots, Usage, Guard and Prune are
// required.
type Options struct {
	DB        *metadata.DB
	Snapshots Snapshots
	// Usage reads how full the pool is now.
	Usage func(ctx context.Context) (Usage, error)
	// Guard refuses the removal of a chain a live run uses
	// (pipeline.GuardChain).
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
	// Pinned names images never removed.
	Pinned []string
	// Interval spaces the collections Loop runs between pulls (default 5
	// minutes).
	Interval time.Duration
	// Disabled turns collection by itself off: Pulled, MakeRoom and Loop
	// remove no image. Begin still marks the images being pulled, so that
	// Remove never takes one, and the tarball cache is still trimmed.
	Disabled bool
	// Grow, when set, grows the pool by one step and reports whether it
	// did (a loop-file pool allowed to grow): MakeRoom grows the pool
	// rather than refuse a pull that garbage collection left no room for.
	Grow func(ctx context.Context) (bool, error)
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

	pmu      sync.Mutex
	cond     *sync.Cond
	pulling  map[string]int // image id → pulls under way
	removing string         // image id being removed
	trimming bool           // TrimTarballs is removing files
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
	if err := (TarballCacheConfig{TarballCacheSize: conf.Size(opts.TarballCache)}).Validate(); err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	if err := ValidateThresholds(opts.HighThreshold, opts.LowThreshold); err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	c := &Collector{opts: opts, pulling: map[string]int{}}
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
// the pull starts after it and makes the image again.
func (c *Collector) Begin(imageID string) (end func()) {
	c.pmu.Lock()
	for c.removing == imageID || c.trimming {
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

// Pulled implements pipeline.PoolGuard: a collection and a trim of the
// tarball cache after every pull.
func (c *Collector) Pulled(ctx context.Context, imageID string) {
	if !c.opts.Disabled {
		if _, err := c.Collect(ctx, "pull", 0); err != nil {
			log.G(ctx).WithError(err).WithField("image", imageID).Warn("gc: collection after a pull")
		}
	}
	if _, err := c.TrimTarballs(ctx, imageID); err != nil {
		log.G(ctx).WithError(err).WithField("image", imageID).Warn("gc: trimming the tarball cache after a pull")
	}
}

// Loop collects (unless Disabled) and trims the tarball cache every
// Options.Interval until ctx is done.
func (c *Collector) Loop(ctx context.Context) {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
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

// Removed describes one removed image.
type Removed struct {
	ImageID string
	Source  string
	Names   []string
	Reason  string
	// Freed is the pool data the removal freed, in bytes.
	Freed int64
}

// Report is what one collection did.
type Report struct {
	Trigger       string
	Before, After Usage
	Removed       []Removed
	// Kept maps the images that would have been removed, were they not in
	// use, to why they are in use.
	Kept     map[string]string
	Duration time.Duration
}

// over reports whether the pool, with need more data bytes, is at or past
// pct of its data or metadata, or the host filesystem is.
func over(u Usage, need uint64, pct float64) bool {
	return percent(u.DataUsed+need, u.DataTotal) >= pct || u.MetaPercent() >= pct || u.HostPercent() >= pct
}

// Collect removes unused images, least recently used first, when the pool
// with need more data bytes is at or past the high threshold, until it is
// under the low threshold or nothing unused is left. trigger names what
// asked for it ("pull", "room", "timer"), for the logs and the metric.
func (c *Collector) Collect(ctx context.Context, trigger string, need uint64) (*Report, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	u, err := c.opts.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("gc: pool usage: %w", err)
	}
	rep := &Report{Trigger: trigger, Before: u, After: u, Kept: map[string]string{}}
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
	imgs, err := c.opts.DB.GCImages(ctx)
	if err != nil {
		return rep, fmt.Errorf("gc: %w", err)
	}
	children, err := c.children(ctx)
	if err != nil {
		return rep, err
	}
	var errs []error
	for _, im := range imgs {
		if !over(u, need, c.opts.LowThreshold) {
			break
		}
		if why, err := c.inUse(ctx, im, children); err != nil {
			errs = append(errs, err)
			continue
		} else if why != "" {
			rep.Kept[im.ImageID] = why
			log.G(ctx).WithField("image", im.ImageID).WithField("source", im.Source).WithField("why", why).Debug("gc: image in use, kept")
			continue
		}
		reason := fmt.Sprintf("pool at %s with %s more needed, past the %v%% threshold; image unused since %s",
			u.String(), bytesOf(need), c.opts.HighThreshold, im.UsedAt.Format(time.RFC3339))
		r, err := c.remove(ctx, im, "usage", reason)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Removed = append(rep.Removed, *r)
		if u, err = c.opts.Usage(ctx); err != nil {
			return rep, fmt.Errorf("gc: pool usage: %w", err)
		}
		rep.After = u
	}
	return rep, errors.Join(errs...)
}

// children maps a snapshot key to the snapshots on it.
func (c *Collector) children(ctx context.Context) (map[string][]snapshots.Info, error) {
	out := map[string][]snapshots.Info{}
	err := c.opts.Snapshots.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Parent != "" {
			out[info.Parent] = append(out[info.Parent], info)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gc: walk snapshots: %w", err)
	}
	return out, nil
}

// inUse says why image im must be kept, or "" when nothing uses it.
func (c *Collector) inUse(ctx context.Context, im *metadata.GCImage, children map[string][]snapshots.Info) (string, error) {
	for _, n := range im.Names {
		if slices.Contains(c.opts.Pinned, n) {
			return fmt.Sprintf("pinned: %q is in [gc] pinned", n), nil
		}
	}
	c.pmu.Lock()
	pulling := c.pulling[im.ImageID]
	c.pmu.Unlock()
	if pulling > 0 {
		return "a pull of it is under way", nil
	}
	for i, ch := range im.Chains {
		for _, info := range children[ch] {
			if _, private := info.Labels[pipeline.LabelPrivate]; private {
				continue
			}
			if _, ours := info.Labels[pipeline.LabelSource]; ours && info.Kind == snapshots.KindCommitted {
				continue
			}
			return fmt.Sprintf("snapshot %q (a container's) is on layer %d", info.Name, i+1), nil
		}
	}
	err := c.opts.DB.WithTx(ctx, func(tx *sql.Tx) error {
		for _, ch := range im.Chains {
			if err := c.opts.Guard(ch)(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	})
	if errdefs.IsFailedPrecondition(err) {
		return "a live run uses it: " + err.Error(), nil
	}
	if err != nil {
		return "", fmt.Errorf("gc: live runs on image %s: %w", im.ImageID, err)
	}
	if c.opts.Names != nil {
		for _, n := range im.Names {
			pinned, err := c.opts.Names.Pinned(ctx, n)
			if err != nil {
				return "", fmt.Errorf("gc: is %q pinned: %w", n, err)
			}
			if pinned {
				return fmt.Sprintf("pinned: %q carries containerd's label %s", n, pipeline.LabelPinned), nil
			}
		}
	}
	return "", nil
}

// remove removes image im: its names, activation, unshared chains (top
// first), their devices, then its records and what they alone needed.
func (c *Collector) remove(ctx context.Context, im *metadata.GCImage, cause, reason string) (*Removed, error) {
	c.pmu.Lock()
	if c.pulling[im.ImageID] > 0 {
		c.pmu.Unlock()
		return nil, fmt.Errorf("remove image %s (%s): a pull of it is under way: %w", im.ImageID, im.Source, ErrInUse)
	}
	c.removing = im.ImageID
	c.pmu.Unlock()
	defer func() {
		c.pmu.Lock()
		c.removing = ""
		c.cond.Broadcast()
		c.pmu.Unlock()
	}()
	before, err := c.opts.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("remove image %s: pool usage: %w", im.ImageID, err)
	}
	what := fmt.Sprintf("remove image %s (%s)", im.ImageID, im.Source)
	if c.opts.Names != nil {
		for _, n := range im.Names {
			if err := c.opts.Names.Unregister(ctx, n); err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
		}
	}
	if err := c.opts.Snapshots.Remove(ctx, metadata.ActivationKey(im.ImageID)); err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%s: activation: %w", what, err)
	}
	for i := len(im.Chains) - 1; i >= 0; i-- {
		ch := im.Chains[i]
		if im.SharedChains[ch] {
			// Its chain ID covers the layers below it: they are shared too.
			break
		}
		err := c.opts.Snapshots.RemoveIf(ctx, ch, c.opts.Guard(ch))
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			// Something was put on it since it was checked: it stays,
			// with what is below it.
			return nil, fmt.Errorf("%s: layer %d (chain %s): %w", what, i+1, ch, err)
		}
	}
	if err := c.opts.DB.DeleteImage(ctx, im.ImageID); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := c.opts.Snapshots.Cleanup(ctx); err != nil {
		log.G(ctx).WithError(err).WithField("image", im.ImageID).Warn("gc: deleting the removed devices (the next cleanup retries)")
	}
	if err := c.opts.Prune(ctx); err != nil {
		log.G(ctx).WithError(err).WithField("image", im.ImageID).Warn("gc: pruning the records and files of the removed image")
	}
	after, err := c.opts.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: pool usage: %w", what, err)
	}
	r := &Removed{ImageID: im.ImageID, Source: im.Source, Names: im.Names, Reason: reason, Freed: int64(before.DataUsed) - int64(after.DataUsed)}
	log.G(ctx).WithField("image", im.ImageID).WithField("source", im.Source).WithField("names", strings.Join(im.Names, ",")).
		WithField("reason", reason).WithField("freed", bytesOf(uint64(max(r.Freed, 0)))).WithField("usage", after.String()).Info("gc: image removed")
	if c.opts.Observer != nil {
		c.opts.Observer.Removed(cause, r.Freed)
	}
	return r, nil
}

// Remove removes the pulled images named refs (a name or an s3:// source),
// the way a collection does, refusing one in use with the reason (ErrInUse)
// and one never pulled (errdefs.ErrNotFound). It goes on past a refusal
// and returns every image removed with the errors joined.
func (c *Collector) Remove(ctx context.Context, refs []string) ([]Removed, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	children, err := c.children(ctx)
	if err != nil {
		return nil, err
	}
	var (
		out  []Removed
		errs []error
	)
	for _, ref := range refs {
		id, err := c.opts.DB.ImageIDByRef(ctx, ref)
		if err != nil {
			errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
			continue
		}
		var im *metadata.GCImage
		if id != "" {
			if im, err = c.opts.DB.GCImage(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
				continue
			}
		}
		if im == nil {
			errs = append(errs, fmt.Errorf("rm %s: no image pulled under that name: %w", ref, errdefs.ErrNotFound))
			continue
		}
		why, err := c.inUse(ctx, im, children)
		if err != nil {
			errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
			continue
		}
		if why != "" {
			errs = append(errs, fmt.Errorf("rm %s: image %s is in use (%s): %w", ref, im.ImageID, why, ErrInUse))
			continue
		}
		r, err := c.remove(ctx, im, "rm", "removed by rm "+ref)
		if err != nil {
			errs = append(errs, fmt.Errorf("rm %s: %w", ref, err))
			continue
		}
		out = append(out, *r)
	}
	return out, errors.Join(errs...)
}

// MakeRoom implements pipeline.PoolGuard: it collects when the pool could
// not take needs below the high threshold, grows the pool (Options.Grow)
// while the layers still do not fit, then refuses the pull (ErrNoRoom)
// when a layer does not fit in the data space left, or when the metadata
// is past the high threshold (new devices would fill it, and a full
// metadata device turns the pool read-only).
func (c *Collector) MakeRoom(ctx context.Context, source string, needs []pipeline.LayerNeed) error {
	if c.opts.Disabled {
		return nil
	}
	var total uint64
	for _, n := range needs {
		total += need(n.Bytes)
	}
	rep, err := c.Collect(log.WithLogger(ctx, log.G(ctx).WithField("source", source)), "room", total)
	if err != nil {
		log.G(ctx).WithError(err).WithField("source", source).Warn("gc: collection before a pull")
	}
	var u Usage
	if rep != nil {
		u = rep.After
	} else if u, err = c.opts.Usage(ctx); err != nil {
		return fmt.Errorf("pull %s: pool usage: %w", source, err)
	}
	if c.opts.Grow != nil {
		for u.DataFree() < total {
			grew, err := c.opts.Grow(ctx)
			if err != nil {
				log.G(ctx).WithError(err).WithField("source", source).Warn("gc: growing the pool for a pull")
			}
			if !grew {
				break
			}
			if u, err = c.opts.Usage(ctx); err != nil {
				return fmt.Errorf("pull %s: pool usage: %w", source, err)
			}
		}
	}
	kept := ""
	if rep != nil && len(rep.Kept) > 0 {
		kept = fmt.Sprintf("; %d image(s) in use kept", len(rep.Kept))
	}
	if u.MetaPercent() >= c.opts.HighThreshold {
		return fmt.Errorf("pull %s: the pool's metadata is %.1f%% used, at or past the %v%% threshold, after garbage collection%s: %w",
			source, u.MetaPercent(), c.opts.HighThreshold, kept, ErrNoRoom)
	}
	free := u.DataFree()
	var cum uint64
	for _, n := range needs {
		cum += need(n.Bytes)
		if cum > free {
			return fmt.Errorf("pull %s: layer %d (%s, %s) does not fit: the pool has %s free after garbage collection and the pull's layers up to this one need %s%s: %w",
				source, n.Position, n.Key, bytesOf(uint64(n.Bytes)), bytesOf(free), bytesOf(cum), kept, ErrNoRoom)
		}
	}
	return nil
}

// need is what a layer tarball of n bytes is taken to take in the pool.
func need(n int64) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n) + uint64(n)/marginDivisor
}
