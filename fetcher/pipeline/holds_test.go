package pipeline

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
)

// TestPullKeepsTheChainItBuildsOn: image b's bottom layer is image a's,
// so b's first unpack run finds a's chain made and ends at once; b's
// second layer is still downloading, and no run names that chain. A
// collection that removes image a then (its activation, then the chain,
// guarded as gc guards it) is refused the chain, and b's pull ends well.
// Once b's pull has ended, nothing of it holds the chain any more.
func TestPullKeepsTheChainItBuildsOn(t *testing.T) {
	e := newPullEnv(t, nil)
	base := layerTar(t, "base", 3000)
	e.srv.Put(t, "a/1.tar", base)
	e.srv.Put(t, "b/1.tar", base)
	e.srv.Put(t, "b/2.tar", layerTar(t, "app", 3000))
	a := e.mustPull("a/", "a")
	c1 := a.TopChainID
	ctx := context.Background()

	var n atomic.Int32
	var removeErr error
	e.p.hooks = map[string]func(){"download:awaited": func() {
		if n.Add(1) != 2 { // b's layer 2 is in; its layer 1's unpack run has ended
			return
		}
		if err := e.p.opts.Snapshots.Remove(ctx, ActivationKey(a.Snapshot.ImageID)); err != nil {
			t.Errorf("remove a's activation: %v", err)
		}
		removeErr = e.sn.RemoveIf(ctx, c1, e.p.Guard(c1))
	}}
	if _, err := e.pull("b/", "b"); err != nil {
		t.Fatalf("pull of b while a collection removed image a, whose chain b builds on: %v", err)
	}
	if n.Load() < 2 {
		t.Fatalf("the hook ran %d times, want the second layer's download awaited", n.Load())
	}
	if !errdefs.IsFailedPrecondition(removeErr) {
		t.Errorf("removal of chain %s while b's pull built on it: %v, want FailedPrecondition", c1, removeErr)
	}
	if err := e.p.db.WithTx(ctx, func(tx *sql.Tx) error { return e.p.Guard(c1)(ctx, tx) }); err != nil {
		t.Errorf("the guard of chain %s after b's pull ended: %v, want no pull or run holding it", c1, err)
	}
}

// TestRepullKeepsTheLayersItFindsUnpacked: a re-pull of an image whose
// top layer changed finds its bottom layer unpacked as recorded, and
// starts no download for it: its unpack run could not rebuild the chain.
// A collection removing the chain once the pull has checked its device
// is refused, and the pull ends well.
func TestRepullKeepsTheLayersItFindsUnpacked(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "a/1.tar", layerTar(t, "base", 3000))
	e.srv.Put(t, "a/2.tar", layerTar(t, "app", 3000))
	first := e.mustPull("a/", "a")
	c1 := first.Layers[0].ChainID
	e.srv.Put(t, "a/2.tar", layerTar(t, "app-v2", 3000))
	ctx := context.Background()

	var removeErr error
	ran := false
	e.p.hooks = map[string]func(){"pull:known-checked": func() {
		ran = true
		if err := e.p.opts.Snapshots.Remove(ctx, ActivationKey(first.Snapshot.ImageID)); err != nil {
			t.Errorf("remove the image's activation: %v", err)
		}
		// Top first, as a collection removes an image's chains.
		if err := e.sn.RemoveIf(ctx, first.TopChainID, e.p.Guard(first.TopChainID)); err != nil {
			t.Errorf("remove the image's old top chain: %v", err)
		}
		removeErr = e.sn.RemoveIf(ctx, c1, e.p.Guard(c1))
	}}
	if _, err := e.pull("a/", "a"); err != nil {
		t.Fatalf("re-pull while a collection removed the bottom chain it found unpacked: %v", err)
	}
	if !ran {
		t.Fatal("the hook did not run: the re-pull found no layer unpacked")
	}
	if !errdefs.IsFailedPrecondition(removeErr) {
		t.Errorf("removal of chain %s the re-pull builds on: %v, want FailedPrecondition", c1, removeErr)
	}
}
