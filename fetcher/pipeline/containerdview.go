package pipeline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// LabelPrivate marks the pipeline's own snapshots: "extract" on a layer's
// extraction snapshot, "activation" on an image's active snapshot,
// "verify" on the read-only view through which an activate run checks a
// new top chain before it replaces the image's activation.
// containerd's metadata store does not know them, and its garbage collector
// removes every backend snapshot it does not know (core/metadata's
// garbageCollect walks the backend and prunes the rest), so the view
// containerd gets (ContainerdView) does not list them.
const LabelPrivate = "flyio.io/pipeline"

// Values of LabelPrivate.
const (
	privateExtract    = "extract"
	privateActivation = "activation"
	privateVerify     = "verify"
)

// ContainerdView returns the snapshotter to serve to containerd when these
// pipelines share it:
//   - Walk leaves out the pipeline's private active snapshots (an extraction
//     under way, an image's activation), so containerd's garbage collector
//     never removes what it does not own; without a Registrar it also
//     leaves out the committed chain snapshots (containerd never adopts
//     them then);
//   - Remove of a committed chain snapshot made by the pipelines, or made
//     by containerd's unpacker and built on by them (chainKey), is refused
//     (FailedPrecondition) while an image of it has a name containerd does
//     not have yet (pending.go), and while a live run uses that chain (a pull under
//     way commits chains that containerd adopts only when the image is
//     registered at its end, and containerd's collector, which removes every
//     backend snapshot it does not know, must not take them meanwhile). The
//     check and the removal are one transaction, so a pull that starts
//     using the chain either sees it removed or keeps it; a run that uses
//     other chains, even a stalled one, blocks nothing here;
//   - Remove of a committed chain snapshot whose only children are image
//     activations removes those first: the image is gone from containerd,
//     so is its activation;
//   - Prepare of a snapshot containerd writes a layer into, Commit and
//     Remove tell the pool guard (PoolGuard.Preparing, Committed,
//     Dropped): a registry image's layers land in the pool without a pull
//     of ours, and collection must make room for them while containerd
//     writes them and follow their commits;
//   - Cleanup, after the snapshotter's own, prunes the pipeline records the
//     removals orphaned (Prune).
func (p *Pipelines) ContainerdView(sn Snapshots) snapshots.Snapshotter {
	return &containerdView{Snapshots: sn, p: p}
}

type containerdView struct {
	Snapshots
	p *Pipelines
}

func private(info snapshots.Info) bool {
	_, ok := info.Labels[LabelPrivate]
	return ok
}

// pipelineChain reports whether info is a chain snapshot the pipelines
// committed.
func pipelineChain(info snapshots.Info) bool {
	_, ok := info.Labels[LabelSource]
	return ok && info.Kind == snapshots.KindCommitted
}

// registryChain is the chain ID of info when it is a chain containerd's
// unpacker committed in our pool ("<namespace>/<n>/<chain ID>", labelled
// containerd.io/snapshot.ref = the chain ID): one the pipelines take as
// that chain (chainKey). It is "" for any other snapshot.
func registryChain(info snapshots.Info) string {
	chain := info.Labels[snapshots.LabelSnapshotRef]
	if chain == "" || info.Kind != snapshots.KindCommitted || !strings.HasSuffix(info.Name, "/"+chain) {
		return ""
	}
	return chain
}

func (v *containerdView) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	hideChains := v.p.opts.Registrar == nil
	return v.Snapshots.Walk(ctx, func(ctx context.Context, info snapshots.Info) error {
		if private(info) || (hideChains && pipelineChain(info)) {
			return nil
		}
		return fn(ctx, info)
	}, filters...)
}

// chainFields are the request fields of the machines that name a chain a
// live run uses (or is about to make): see liveRunsUsing.
var chainFields = map[string][]string{
	api.FSMUnpack:   {"$.chain_id", "$.parent_chain_id"},
	api.FSMActivate: {"$.layers[]"},
}

// GuardChain refuses, inside the transaction that removes a chain's
// snapshot, the removal of chain while a live run uses it. Pipelines.Guard
// also keeps the chains the pulls under way build on.
func GuardChain(chain string) snapshotter.RemoveGuard {
	return func(ctx context.Context, tx *sql.Tx) error {
		n, err := liveRunsUsing(ctx, tx, chain, chainFields)
		if err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("remove %s: a chain of the S3 pipelines, kept while %d live run(s) use it: %w", chain, n, errdefs.ErrFailedPrecondition)
		}
		return nil
	}
}

func (v *containerdView) Remove(ctx context.Context, key string) error {
	info, err := v.Snapshots.Stat(ctx, key)
	if err != nil {
		return err
	}
	if !pipelineChain(info) {
		remove := v.Snapshots.Remove
		if chain := registryChain(info); chain != "" {
			// The pipelines build on it as they build on a chain of
			// their own (chainKey): kept alike while a run or a pull
			// uses the chain.
			remove = func(ctx context.Context, key string) error {
				return v.Snapshots.RemoveIf(ctx, key, v.p.containerdGuard(chain))
			}
		}
		if err := remove(ctx, key); err != nil {
			return err
		}
		if g := v.p.guard; g != nil {
			g.Dropped(ctx, key)
		}
		return nil
	}
	// Only a pipeline chain can carry an image activation. A refusal here
	// is only a hint; the guarded removal below decides.
	guard := v.p.containerdGuard(key)
	if err := v.p.db.WithTx(ctx, func(tx *sql.Tx) error { return guard(ctx, tx) }); err != nil {
		return err
	}
	if err := v.p.removeActivationsOf(ctx, key); err != nil {
		return err
	}
	return v.Snapshots.RemoveIf(ctx, key, guard)
}

// Guard refuses, inside the transaction that removes a chain's snapshot,
// the removal of chain while a live run uses it (GuardChain) or while a
// pull under way in this process builds on it. A pull's layer finds its
// chain already made (another image's) and its unpack run ends; the next
// layer's unpack run, which names that chain as its parent, starts only
// once that layer is downloaded, and no live run names the chain
// meanwhile. The pull therefore holds each chain from just before its
// unpack run starts until the pull ends, when the image's records keep it.
func (p *Pipelines) Guard(chain string) snapshotter.RemoveGuard {
	live := GuardChain(chain)
	return func(ctx context.Context, tx *sql.Tx) error {
		if err := live(ctx, tx); err != nil {
			return err
		}
		if n := p.building.count(chain); n > 0 {
			return fmt.Errorf("remove %s: a chain of the S3 pipelines, kept while %d pull(s) under way build on it: %w", chain, n, errdefs.ErrFailedPrecondition)
		}
		return nil
	}
}

// containerdGuard refuses containerd's removal of chain while a live run
// or a pull uses it (Guard) or while an image of it has a name containerd
// does not have yet (guardPending).
func (p *Pipelines) containerdGuard(chain string) snapshotter.RemoveGuard {
	live, pending := p.Guard(chain), guardPending(chain)
	return func(ctx context.Context, tx *sql.Tx) error {
		if err := live(ctx, tx); err != nil {
			return err
		}
		return pending(ctx, tx)
	}
}

func (v *containerdView) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	m, err := v.Snapshots.Prepare(ctx, key, parent, opts...)
	if err != nil {
		return nil, err
	}
	if g := v.p.guard; g != nil && layerWrite(key, opts) {
		g.Preparing(ctx, key)
	}
	return m, nil
}

// layerWrite reports whether containerd prepares key, with opts, to write
// a layer into: its unpackers name the snapshot after the chain it is to
// be committed as (snapshots.LabelSnapshotRef, which containerd's metadata
// store passes on) and key it "extract-..." (snapshots.UnpackKeyFormat,
// under the "<namespace>/<n>/" containerd prefixes keys with here). A
// container's snapshot has neither; the pipelines' own never come here.
func layerWrite(key string, opts []snapshots.Opt) bool {
	var info snapshots.Info
	for _, o := range opts {
		if err := o(&info); err != nil {
			return false
		}
	}
	if private(info) {
		return false
	}
	if info.Labels[snapshots.LabelSnapshotRef] != "" {
		return true
	}
	base := key
	if i := strings.LastIndex(key, "/"); i >= 0 {
		base = key[i+1:]
	}
	return strings.HasPrefix(base, snapshots.UnpackKeyPrefix+"-")
}

func (v *containerdView) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	if err := v.Snapshots.Commit(ctx, name, key, opts...); err != nil {
		return err
	}
	if g := v.p.guard; g != nil {
		g.Committed(ctx, name, key)
	}
	return nil
}

func (v *containerdView) Cleanup(ctx context.Context) error {
	if err := v.Snapshots.Cleanup(ctx); err != nil {
		return err
	}
	_, err := v.p.Prune(ctx)
	return err
}

// removeActivationsOf removes the image activations made on parent when
// they are its only children (anything else still holds parent, and the
// removal will be refused for it anyway).
func (p *Pipelines) removeActivationsOf(ctx context.Context, parent string) error {
	var acts []string
	others := 0
	err := p.opts.Snapshots.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Parent != parent {
			return nil
		}
		if info.Labels[LabelPrivate] == privateActivation {
			acts = append(acts, info.Name)
		} else {
			others++
		}
		return nil
	}, "parent=="+strconv.Quote(parent))
	if err != nil {
		return fmt.Errorf("children of %s: %w", parent, err)
	}
	if others > 0 {
		return nil
	}
	for _, name := range acts {
		// Guarded like the chain: a run that starts using the chain now
		// keeps its activation too.
		if err := p.opts.Snapshots.RemoveIf(ctx, name, p.Guard(parent)); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove activation %s of %s: %w", name, parent, err)
		}
		log.G(ctx).WithField("snapshot", name).WithField("parent", parent).Info("image activation removed with its chain")
	}
	return nil
}

// Prune forgets the records of chains and images whose snapshots are gone
// (Records.PruneOrphans) and deletes the layer files no record needs any
// more, and those no layer row names at all (a download that failed after
// renaming its file into place). containerd's garbage collection calls it
// through Cleanup; it is safe to call at any time. It keeps the object
// records and layer files a live run or a pull under way may still read
// (the pulls' objects are held from before their downloads start, so a
// pull that found them already downloaded keeps them until it ends). The
// files no layer row names it removes only while no pull is under way and
// no run is live (otherwise the result says Deferred): a download's file
// is in place before its row.
func (p *Pipelines) Prune(ctx context.Context) (PruneResult, error) {
	res, stamps, err := RecordsOf(p.db).pruneOrphans(ctx, pruneBatch, true, p.objectHolds.ids, p.heldRunIDs)
	if err != nil {
		return res, fmt.Errorf("prune: %w", err)
	}
	var errs []error
	for i, path := range res.LayerPaths {
		if err := removeLayerFile(path, stamps[i]); err != nil {
			errs = append(errs, fmt.Errorf("prune: %w", err))
		}
	}
	res.Deferred = true
	if p.files.TryLock() {
		defer p.files.Unlock()
		live, err := RecordsOf(p.db).LiveRuns(ctx)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("prune: %w", err))
		case live == 0:
			// p.files is held and no run is live: no download is between
			// renaming its file into place and recording it.
			res.Deferred = false
			n, err := p.removeStrayLayerFiles(ctx)
			res.StrayFiles = n
			if err != nil {
				errs = append(errs, fmt.Errorf("prune: %w", err))
			}
		}
	}
	if res.Chains+res.Images+res.Objects+len(res.LayerPaths)+res.StrayFiles > 0 {
		log.G(ctx).WithField("chains", res.Chains).WithField("images", res.Images).WithField("objects", res.Objects).
			WithField("layer_files", len(res.LayerPaths)).WithField("stray_files", res.StrayFiles).
			WithField("deferred", res.Deferred).Info("pruned records of removed snapshots")
	}
	return res, errors.Join(errs...)
}

// removeLayerFile removes the file at path of a layer row just deleted,
// unless it is not the file that row recorded (stamp, when recorded): a
// download of the same content, under another key, renames its own file
// onto that path before it records it, and that one is not stray.
func removeLayerFile(path string, stamp fileID) error {
	ours, err := recordedAt(path, stamp)
	if err != nil || !ours {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove layer file %s: %w", path, err)
	}
	return nil
}

// recordedAt reports whether the file at path is the one stamp recorded
// (any file, for a row that recorded none), or is gone: nothing another
// download put there.
func recordedAt(path string, stamp fileID) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("layer file %s: %w", path, err)
	}
	return stamp == (fileID{}) || stampOf(fi) == stamp, nil
}

// Recorded reports whether the file at f.Path is the one f's row recorded
// (its size, modification time and inode), or is gone: a file a download
// of the same content renamed onto that path since is not the row's to
// remove.
func (f *LayerFile) Recorded() (bool, error) {
	return recordedAt(f.Path, fileID{f.StatSize, f.StatMtimeNs, f.StatIno})
}

// removeStrayLayerFiles removes the files in blobs/sha256 that no layer row
// names (Records.strayLayerFiles) and returns how many it removed. The
// caller holds p.files exclusively and has seen no run live: a download
// renames its file into place before it records it, so a file of a live
// download would look stray.
func (p *Pipelines) removeStrayLayerFiles(ctx context.Context) (int, error) {
	stray, err := RecordsOf(p.db).strayLayerFiles(ctx, p.opts.blobDir())
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, path := range stray {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove layer file %s that no layer row names: %w", path, err))
			continue
		}
		n++
		log.G(ctx).WithField("file", path).Warn("removed a layer file no layer row names (a download that did not complete)")
	}
	return n, errors.Join(errs...)
}
