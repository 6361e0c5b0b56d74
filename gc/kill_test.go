package gc

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// killingSnapshots is a fake at the collector's snapshotter boundary: the
// real snapshotter, except that the call named by killBefore or killAfter
// (a RemoveIf of that key) never returns, which stands for the daemon
// killed there. The collector that made the call is abandoned, as a killed
// daemon's is.
type killingSnapshots struct {
	Snapshots
	killBefore, killAfter string
	killed                chan struct{}
	release               chan struct{}
	once                  sync.Once
}

func (k *killingSnapshots) kill(ctx context.Context) error {
	k.once.Do(func() { close(k.killed) })
	<-k.release
	return fmt.Errorf("killed: %w", context.Canceled)
}

func (k *killingSnapshots) RemoveIf(ctx context.Context, key string, guard snapshotter.RemoveGuard) error {
	if key == k.killBefore {
		return k.kill(ctx)
	}
	if err := k.Snapshots.RemoveIf(ctx, key, guard); err != nil {
		return err
	}
	if key == k.killAfter {
		return k.kill(ctx)
	}
	return nil
}

// TestRemoveKilledHalfWayIsFinishedByTheSameRm: an rm killed anywhere
// among the removals of its image's chains (with no containerd to
// register names in) leaves, once the daemon starts again (its start-up
// prune) and the same rm is run, nothing of the image: no chain that no
// image uses stays in the pool, as after an rm never killed.
func TestRemoveKilledHalfWayIsFinishedByTheSameRm(t *testing.T) {
	chains := []string{"low", "mid", "top"}
	for _, kp := range []struct{ before, after string }{
		{after: "top"}, {before: "mid"}, {after: "mid"}, {after: "low"},
	} {
		t.Run(fmt.Sprintf("before=%s,after=%s", kp.before, kp.after), func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t, 10000*mib, Options{})
			h.image("img1", "one", layer{"low", 10 * mib}, layer{"mid", 10 * mib}, layer{"top", 10 * mib})
			opts := h.c.opts
			opts.Names = nil
			k := &killingSnapshots{Snapshots: h.snaps, killBefore: kp.before, killAfter: kp.after,
				killed: make(chan struct{}), release: make(chan struct{})}
			opts.Snapshots = k
			first, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				first.Remove(ctx, []string{"one"}) //nolint:errcheck // the daemon is killed in it
			}()
			// The abandoned call ends before the database closes.
			t.Cleanup(func() { close(k.release); <-done })
			<-k.killed

			// The daemon starts again: its start-up prune, then the same rm.
			opts.Snapshots = h.snaps
			again, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := opts.Prune(ctx); err != nil {
				t.Fatalf("start-up prune: %v", err)
			}
			removed, err := again.Remove(ctx, []string{"one"})
			if err != nil || len(removed) != 1 || removed[0].ImageID != "img1" {
				t.Errorf("rm one again after the kill: removed %+v, %v; want img1 removed", removed, err)
			}
			h.snapshotGone(append([]string{pipeline.ActivationKey("img1")}, chains...)...)
			for _, ch := range chains {
				if c, _ := pipeline.RecordsOf(h.db).GetChain(ctx, ch); c != nil {
					t.Errorf("chain %s still recorded", ch)
				}
			}
			if im, err := pipeline.RecordsOf(h.db).GetImage(ctx, "img1"); err != nil || im != nil {
				t.Errorf("image img1 still recorded: %+v %v", im, err)
			}
		})
	}
}
