package gc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// chainKept fails unless chain's committed snapshot is still recorded.
func (h *harness) chainKept(chain, why string) {
	h.t.Helper()
	if _, ok, err := snapshotter.ReadRecords(h.db).Snapshot(context.Background(), chain); err != nil || !ok {
		h.t.Errorf("chain %s was removed (%v): %s", chain, err, why)
	}
}

// TestRemoveKeepsChainsARegistryImageAdopted: containerd pulled a
// registry image whose only layer is an S3 image's bottom layer; its
// unpacker found that chain committed here and took it as is, so nothing
// of containerd's sits on it. Removing the S3 image, by rm or by a
// collection, keeps the chain the registry image runs on.
func TestRemoveKeepsChainsARegistryImageAdopted(t *testing.T) {
	ctx := context.Background()
	t.Run("rm", func(t *testing.T) {
		h := newHarness(t, 1000*mib, Options{})
		h.image("s3-app", "s3/app", layer{"base", 300 * mib}, layer{"app", 100 * mib})
		h.registry("a", "reg/base", time.Now(), map[string]bool{"base": true}, layer{"base", 0})
		if removed, err := h.c.Remove(ctx, []string{"s3/app"}); err != nil || len(removed) != 1 {
			t.Fatalf("rm s3/app: %+v, %v", removed, err)
		}
		h.snapshotGone("app")
		h.chainKept("base", "containerd's image reg/base has it as its layer")
	})
	t.Run("collection", func(t *testing.T) {
		h := newHarness(t, 1000*mib, Options{})
		h.image("s3-app", "s3/app", layer{"base", 400 * mib}, layer{"app", 100 * mib})
		h.registry("a", "reg/base", time.Now().Add(time.Hour), map[string]bool{"base": true}, layer{"base", 0})
		h.registry("a", "reg/other", time.Now().Add(2*time.Hour), nil, layer{"other", 400 * mib}) // 90%
		rep, err := h.c.Collect(ctx, "test", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Removed) == 0 || rep.Removed[0].ImageID != "s3-app" {
			t.Fatalf("removed %+v, want s3-app first (the least recently used)", rep.Removed)
		}
		h.snapshotGone("app")
		h.chainKept("base", "containerd's image reg/base has it as its layer, and was not removed")
	})
}

// TestCollectWhileContainerdDoesNotAnswer: with containerd's socket
// absent (containerd starting after the daemon at boot, or restarting),
// nothing says which chains its registry images have or which of our
// names its containers and pins use. A collection then keeps the chains
// no S3 image has and the S3 images containerd has names of, and says
// why; it still removes an image whose names containerd was never told
// of. rm refuses the same way. Once containerd answers, both work as
// before.
func TestCollectWhileContainerdDoesNotAnswer(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	// A pull that failed after its unpack left chain f1, which
	// containerd's registry image has adopted.
	h.failedPull("failed", "s3://bucket/distroless/", layer{"f1", 300 * mib})
	h.registry("a", "reg/distroless", time.Now().Add(time.Hour), map[string]bool{"f1": true}, layer{"f1", 0})
	// An image registered in containerd, pinned there by the CRI, and an
	// image pulled while containerd was down (its name pending).
	h.image("known", "registered", layer{"k1", 300 * mib})
	h.names.images = append(h.names.images, pipeline.PoolImage{Namespace: "k8s.io", Name: "registered", Ours: true, Chains: []string{"k1"}, Pinned: true})
	h.image("unknown", "pending", layer{"u1", 300 * mib}) // 90.2%
	if _, err := h.db.Statements().ExecContext(ctx, `INSERT INTO containerd_pending (name, namespace, replace, since_ns) VALUES ('pending', '', 0, 1)`); err != nil {
		t.Fatal(err)
	}
	h.names.absent = true

	rep, err := h.c.Collect(ctx, "timer", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := removedKinds(rep); len(got) != 1 || got[0] != "s3:pending" {
		t.Errorf("removed %v, want only the image containerd has no name of (s3:pending)", got)
	}
	h.chainKept("f1", "no S3 image has it, but containerd, not answering, has it as a registry image's layer")
	h.chainKept("k1", "containerd has a name of its image (pinned there)")
	if why := rep.Kept["known"]; !strings.Contains(why, `containerd has its name "registered"`) || !strings.Contains(why, "containerd.sock") {
		t.Errorf("why image known was kept: %q, want it to name the name and containerd's socket", why)
	}

	_, err = h.c.Remove(ctx, []string{"registered"})
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "cannot be checked while containerd does not answer") {
		t.Errorf("rm of an image containerd has the name of, containerd not answering: %v, want ErrInUse saying why", err)
	}
	h.chainKept("k1", "rm was refused")

	// containerd answers again: the pin is seen, the orphan is known to
	// be the registry image's, and an unpinned image goes.
	h.names.absent = false
	h.names.images = h.names.images[:1] // reg/distroless only: the pin is gone
	if _, err := h.c.Remove(ctx, []string{"registered"}); err != nil {
		t.Fatalf("rm with containerd answering, nothing using the image: %v", err)
	}
	h.snapshotGone("k1")
	h.chainKept("f1", "containerd's image reg/distroless has it")
}
