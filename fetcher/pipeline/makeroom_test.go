package pipeline

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

// roomGuard is a fake PoolGuard whose MakeRoom checks, as a collection
// does before it removes an image (gc's inUse), whether the pipelines'
// Guard refuses the removal of chain.
type roomGuard struct {
	holdingGuard
	p     *Pipelines
	chain string

	mu       sync.Mutex
	asked    int
	released int
	guarded  []error
}

func (g *roomGuard) MakeRoom(ctx context.Context, _ string, _ []LayerNeed) (func(), error) {
	err := g.p.db.WithTx(ctx, func(tx *sql.Tx) error { return g.p.Guard(g.chain)(ctx, tx) })
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked++
	g.guarded = append(g.guarded, err)
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.released++
	}, nil
}

// TestMakeRoomKeepsTheChainsThePullCountsAsUnpacked: the room a pull asks
// for leaves out its bottom layers already unpacked (another image's
// chains); the collection that makes the room must not remove those
// chains, or the pull downloads and unpacks them again on room never made.
func TestMakeRoomKeepsTheChainsThePullCountsAsUnpacked(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "app/1.tar", layerTar(t, "base", 100))
	base := e.mustPull("app/1.tar", "base:1") // an image of the bottom layer alone
	g := &roomGuard{holdingGuard: holdingGuard{held: map[string]int{}}, p: e.p, chain: base.TopChainID}
	e.p.SetPoolGuard(g)
	e.srv.Put(t, "app/2.tar", layerTar(t, "top", 100))
	e.mustPull("app/", "app:1") // app/1.tar is unpacked: only app/2.tar needs room
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.asked != 1 {
		t.Fatalf("MakeRoom asked %d times, want 1", g.asked)
	}
	if g.released != 1 {
		t.Errorf("the room made for the pull released %d times once it ended, want 1", g.released)
	}
	if err := g.guarded[0]; !errdefs.IsFailedPrecondition(err) {
		t.Errorf("during MakeRoom, the removal of chain %s, which the pull counted as unpacked, is not refused (guard: %v)", base.TopChainID, err)
	}
}
