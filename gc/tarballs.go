package gc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/inventory"
)

// DefaultTarballCache is the daemon's default Options.TarballCache: the
// downloaded tarballs of unpacked layers kept on the host, 4 GiB, so that
// an image unpacked again on another parent, or rebuilt after its device
// was lost, usually needs no download.
const DefaultTarballCache = 4 << 30

// Trimmed is what one TrimTarballs did.
type Trimmed struct {
	// Files and Bytes count the tarballs removed.
	Files int
	Bytes int64
	// Kept is the size of the tarballs left.
	Kept int64
	// Skipped says why nothing was looked at, when so.
	Skipped string
}

// TrimTarballs keeps the downloaded layer tarballs within
// Options.TarballCache bytes: it removes those of unpacked layers, least
// recently used first (the last use of an image having the layer, else the
// download), until the rest fit. A tarball whose layer is not unpacked is
// never removed: a pull may still need it. Records stay, so a pull that
// needs a removed file (its chain was removed meanwhile) downloads it
// again, and a pull of an image still unpacked needs none (the pipelines
// skip the layers unpacked as recorded). It keeps the tarballs a pull
// under way or a live run may read (Options.FilesInUse), and pulls
// starting meanwhile wait for it to finish; without FilesInUse it does
// nothing while a run is live or a pull other than one of image except is
// under way. A file that is not the one its row recorded (a download of the
// same content renamed its own onto that path since) is left alone.
func (c *Collector) TrimTarballs(ctx context.Context, except string) (Trimmed, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	release, ok := c.holdPulls(except)
	if ok {
		defer release()
	}
	var inUse map[string]bool
	if c.opts.FilesInUse != nil {
		used, done, err := c.opts.FilesInUse(ctx)
		if err != nil {
			return Trimmed{}, fmt.Errorf("gc: trim tarballs: %w", err)
		}
		defer done()
		inUse = used
	} else if !ok {
		return Trimmed{Skipped: "a pull is under way"}, nil
	} else if live, err := pipeline.RecordsOf(c.opts.DB).LiveRuns(ctx); err != nil {
		return Trimmed{}, fmt.Errorf("gc: trim tarballs: %w", err)
	} else if live > 0 {
		return Trimmed{Skipped: fmt.Sprintf("%d run(s) pending or running", live)}, nil
	}
	files, err := pipeline.RecordsOf(c.opts.DB).ListLayerFiles(ctx)
	if err != nil {
		return Trimmed{}, fmt.Errorf("gc: trim tarballs: %w", err)
	}
	chains, err := inventory.Chains(ctx, c.opts.DB)
	if err != nil {
		return Trimmed{}, fmt.Errorf("gc: trim tarballs: %w", err)
	}
	diffOf := map[string]string{} // chain → diff ID
	for _, ch := range chains {
		diffOf[ch.ChainID] = ch.DiffID
	}
	imgs, err := Images(ctx, c.opts.DB)
	if err != nil {
		return Trimmed{}, fmt.Errorf("gc: trim tarballs: %w", err)
	}
	lastUse := map[string]time.Time{} // diff ID of an unpacked layer → last use
	for _, ch := range chains {
		lastUse[ch.DiffID] = time.Time{}
	}
	for _, im := range imgs {
		for _, ch := range im.Chains {
			if d, ok := diffOf[ch]; ok && im.UsedAt.After(lastUse[d]) {
				lastUse[d] = im.UsedAt
			}
		}
	}
	type cand struct {
		path, digest string
		size         int64
		used         time.Time
		file         *pipeline.LayerFile
	}
	var (
		cands []cand
		tr    Trimmed
	)
	for _, f := range files {
		fi, err := os.Stat(f.Path)
		if err != nil {
			continue // already removed
		}
		tr.Kept += fi.Size()
		// A compressed tarball's digest is that of its compressed bytes;
		// its layer, unpacked, is known by its diff ID.
		used, unpacked := lastUse[cmp.Or(f.DiffID, f.Digest)]
		if !unpacked || inUse[f.Digest] {
			continue
		}
		if used.IsZero() {
			used = f.CreatedAt
		}
		cands = append(cands, cand{path: f.Path, digest: f.Digest, size: fi.Size(), used: used, file: f})
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return a.used.Compare(b.used) })
	var errs []error
	for _, cd := range cands {
		if tr.Kept <= c.opts.TarballCache {
			break
		}
		if ok, err := cd.file.Recorded(); err != nil || !ok {
			// Another file put there since (a download of the same
			// content): not this row's to remove.
			continue
		}
		if err := os.Remove(cd.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("gc: remove tarball %s: %w", cd.path, err))
			continue
		}
		tr.Files++
		tr.Bytes += cd.size
		tr.Kept -= cd.size
		log.G(ctx).WithField("layer", cd.digest).WithField("path", cd.path).WithField("bytes", cd.size).
			WithField("last_used", cd.used.Format(time.RFC3339)).WithField("budget", bytesOf(uint64(c.opts.TarballCache))).
			Info("gc: tarball of an unpacked layer removed from the download cache")
	}
	return tr, errors.Join(errs...)
}
