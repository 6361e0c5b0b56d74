package pipeline

import (
	"context"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// LayerNeed is a layer a pull is about to unpack on a new device.
type LayerNeed struct {
	Position int    // 1 for the bottom layer
	Key      string // the object's key
	Bytes    int64  // the tarball's size
}

// PoolGuard keeps the pool from filling up under the pulls (package
// gc's Collector): Pull tells it which images are being pulled,
// asks it for room before it makes any device, and tells it when a pull is
// done.
type PoolGuard interface {
	// Begin marks image imageID as being pulled until end is called: it is
	// in use and never collected meanwhile.
	Begin(imageID string) (end func())
	// MakeRoom makes room in the pool for needs (collecting unused images
	// when it must) and returns an error naming the pool's free space and
	// the first layer that does not fit when there is not enough. The room
	// it makes is the pull's until release is called (once its layers are
	// written, or it gave up): later calls do not count it as free. Release
	// is never nil.
	MakeRoom(ctx context.Context, source string, needs []LayerNeed) (release func(), err error)
	// Pulled is called after a pull of imageID succeeded.
	Pulled(ctx context.Context, imageID string)
	// Preparing is called after containerd prepared active snapshot key
	// in the pool to write a layer into (its unpacker's, for a registry
	// image): the layer's blocks come while containerd applies it, with no
	// lock held, until Committed or Dropped names key. It must not block,
	// like Committed.
	Preparing(ctx context.Context, key string)
	// Committed is called after containerd committed active snapshot key
	// as name in the pool (a layer its unpacker applied: a registry
	// image's). It must not block: containerd calls under its own
	// database's lock, and a collection asks containerd to remove images.
	Committed(ctx context.Context, name, key string)
	// Dropped is called after containerd removed snapshot key from the
	// pool (among others, a layer's write given up). It must not block,
	// like Committed.
	Dropped(ctx context.Context, key string)
}

// SetPoolGuard makes every later Pull consult g. Call it before the first
// Pull.
func (p *Pipelines) SetPoolGuard(g PoolGuard) { p.guard = g }

// beginPull marks imageID as being pulled (see PoolGuard.Begin).
func (p *Pipelines) beginPull(imageID string) (end func()) {
	if p.guard == nil {
		return func() {}
	}
	return p.guard.Begin(imageID)
}

// used records that image imageID was used now and, after a pull, lets the
// guard collect.
func (p *Pipelines) used(ctx context.Context, imageID string, pulled bool) {
	if err := RecordsOf(p.db).TouchImage(context.WithoutCancel(ctx), imageID); err != nil {
		log.G(ctx).WithError(err).WithField("image", imageID).Warn("recording the image's last use")
	}
	if pulled && p.guard != nil {
		p.guard.Pulled(ctx, imageID)
	}
}

// makeRoom asks the guard for room for the layers of a pull that are not
// unpacked yet: the bottom layers unpackedPrefix finds need no new device.
// Those are held (Guard) until release is called, from before the room is
// made: the collection that makes it must not remove the chains it
// counted as there (another image's), which the pull would then unpack
// again on room never made. The caller releases them, and the room made,
// once the pull's layers are written (runPipelines returned) or it gave
// up.
func (p *Pipelines) makeRoom(ctx context.Context, bucket, source string, layers []api.Layer) (release func(), err error) {
	if p.guard == nil {
		return func() {}, nil
	}
	known, err := p.unpackedPrefix(ctx, bucket, layers)
	if err != nil {
		return func() {}, err
	}
	var releases []func()
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	for _, l := range known {
		releases = append(releases, p.building.hold(l.ChainID))
	}
	var needs []LayerNeed
	for i, l := range layers[len(known):] {
		needs = append(needs, LayerNeed{Position: len(known) + i + 1, Key: l.Key, Bytes: l.Size})
	}
	if len(needs) == 0 {
		return release, nil
	}
	room, err := p.guard.MakeRoom(ctx, source, needs)
	if room != nil {
		releases = append(releases, room)
	}
	return release, err
}

// unpackedPrefix returns the bottom layers of a pull that are unpacked as
// recorded, with their diff and chain IDs: each one's object is recorded
// with the listed ETag and size, and the chain its content makes on the
// layers below is recorded. They need neither a new device nor their
// tarball, which may have left the download cache.
func (p *Pipelines) unpackedPrefix(ctx context.Context, bucket string, layers []api.Layer) ([]api.Layer, error) {
	var (
		out  []api.Layer
		prev string
	)
	for _, l := range layers {
		o, err := RecordsOf(p.db).ObjectRecord(ctx, bucket, l.Key)
		if err != nil {
			return nil, err
		}
		if o == nil || l.ETag == "" || o.ETag != l.ETag || o.SizeBytes != l.Size || o.DiffID == "" {
			break
		}
		chain := ChainID(prev, o.DiffID)
		c, err := RecordsOf(p.db).GetChain(ctx, chain)
		if err != nil {
			return nil, err
		}
		if c == nil {
			break
		}
		l.DiffID, l.ChainID = o.DiffID, chain
		out = append(out, l)
		prev = chain
	}
	return out, nil
}
