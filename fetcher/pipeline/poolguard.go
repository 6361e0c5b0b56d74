package pipeline

import (
	"context"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// LayerNeed is a layer a pull is about to unpack on a new device.
type LayerNeed struct {
	Position int    // 1 for the bottom layer
	Key      string // the object's key
	Bytes    int64  // the tarball's size
}

// PoolGuard keeps the pool from filling up under the pulls (package
// fetcher/gc's Collector): Pull tells it which images are being pulled,
// asks it for room before it makes any device, and tells it when a pull is
// done.
type PoolGuard interface {
	// Begin marks image imageID as being pulled until end is called: it is
	// in use and never collected meanwhile.
	Begin(imageID string) (end func())
	// MakeRoom makes room in the pool for needs (collecting unused images
	// when it must) and returns an error naming the pool's free space and
	// the first layer that does not fit when there is not enough.
	MakeRoom(ctx context.Context, source string, needs []LayerNeed) error
	// Pulled is called after a pull of imageID succeeded.
	Pulled(ctx context.Context, imageID string)
}

// SetPoolGuard makes every later Pull consult g. Call it before the first
// Pull.
func (p *Pipelines) SetPoolGuard(g PoolGuard) { p.guard = g }

// GuardChain refuses, inside the transaction that removes a chain's
// snapshot, the removal of chain while a live run uses it.
func GuardChain(chain string) snapshotter.RemoveGuard { return chainGuard(chain) }

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
	if err := p.db.TouchImage(context.WithoutCancel(ctx), imageID); err != nil {
		log.G(ctx).WithError(err).WithField("image", imageID).Warn("recording the image's last use")
	}
	if pulled && p.guard != nil {
		p.guard.Pulled(ctx, imageID)
	}
}

// makeRoom asks the guard for room for the layers of a pull that are not
// unpacked yet: a layer whose object is recorded with the listed ETag and
// size and whose chain is recorded needs no new device, nor do the layers
// below it.
func (p *Pipelines) makeRoom(ctx context.Context, bucket, source string, layers []Layer) error {
	if p.guard == nil {
		return nil
	}
	var (
		needs []LayerNeed
		prev  string
		known = true
	)
	for i, l := range layers {
		if known {
			known = false
			o, err := p.db.ObjectRecord(ctx, bucket, l.Key)
			if err != nil {
				return err
			}
			if o != nil && o.ETag == l.ETag && o.SizeBytes == l.Size && o.DiffID != "" {
				chain := ChainID(prev, o.DiffID)
				c, err := p.db.GetChain(ctx, chain)
				if err != nil {
					return err
				}
				if c != nil {
					prev, known = chain, true
					continue
				}
			}
		}
		needs = append(needs, LayerNeed{Position: i + 1, Key: l.Key, Bytes: l.Size})
	}
	if len(needs) == 0 {
		return nil
	}
	return p.guard.MakeRoom(ctx, source, needs)
}
