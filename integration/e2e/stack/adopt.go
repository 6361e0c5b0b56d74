package stack

import (
	"context"
	"fmt"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
)

// Unpacked reports whether containerd sees family's image as unpacked in
// the flyio snapshotter: what `ctr run` checks before it would unpack the
// image's layers itself (and fail: an S3 image has no layer blobs in
// containerd's content store).
func (e *E2E) Unpacked(ctx context.Context, family string) (bool, error) {
	cl, err := containerd.New(e.Ctrd.Socket, containerd.WithDefaultNamespace(Namespace), containerd.WithTimeout(time.Minute))
	if err != nil {
		return false, fmt.Errorf("containerd at %s: %w", e.Ctrd.Socket, err)
	}
	defer cl.Close()
	img, err := cl.GetImage(ctx, Ref(family))
	if err != nil {
		return false, fmt.Errorf("image %s in containerd: %w", Ref(family), err)
	}
	return img.IsUnpacked(ctx, "flyio")
}

// Adopt makes containerd's metadata store record family's chain of
// committed snapshots, which `pull` made in our daemon behind containerd's
// back, and ties them to the image for garbage collection: for each layer's
// chain ID a Prepare through containerd's snapshot service carrying the
// label containerd.io/snapshot.ref (our snapshotter answers AlreadyExists
// and containerd records the committed snapshot), then the label
// containerd.io/gc.ref.snapshot.flyio on the image's config blob.
//
// It is the step fetcher/pipeline's containerd registrar lacks at the time
// of writing; the demo runs it only when Unpacked says the registrar did
// not, and says so.
func (e *E2E) Adopt(ctx context.Context, family string) error {
	cl, err := containerd.New(e.Ctrd.Socket, containerd.WithDefaultNamespace(Namespace), containerd.WithTimeout(time.Minute))
	if err != nil {
		return fmt.Errorf("containerd at %s: %w", e.Ctrd.Socket, err)
	}
	defer cl.Close()
	img, err := cl.GetImage(ctx, Ref(family))
	if err != nil {
		return fmt.Errorf("image %s in containerd: %w", Ref(family), err)
	}
	diffs, err := img.RootFS(ctx)
	if err != nil {
		return fmt.Errorf("image %s: diff ids: %w", Ref(family), err)
	}
	sn := cl.SnapshotService("flyio")
	chain := identity.ChainIDs(diffs)
	parent := ""
	for i, c := range chain {
		key := fmt.Sprintf("flyio-e2e-adopt-%d-%s", time.Now().UnixNano(), c.Encoded())
		_, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(map[string]string{"containerd.io/snapshot.ref": c.String()}))
		if err == nil {
			_ = sn.Remove(ctx, key)
			return fmt.Errorf("image %s layer %d: chain %s is not a committed snapshot of ours (Prepare succeeded)", Ref(family), i+1, c)
		}
		if !errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("image %s layer %d: adopt chain %s: %w", Ref(family), i+1, c, err)
		}
		parent = c.String()
	}
	conf, err := img.Config(ctx)
	if err != nil {
		return fmt.Errorf("image %s: config: %w", Ref(family), err)
	}
	info, err := cl.ContentStore().Info(ctx, conf.Digest)
	if err != nil {
		return fmt.Errorf("image %s: config blob: %w", Ref(family), err)
	}
	if info.Labels == nil {
		info.Labels = map[string]string{}
	}
	const gcLabel = "containerd.io/gc.ref.snapshot.flyio"
	info.Labels[gcLabel] = chain[len(chain)-1].String()
	if _, err := cl.ContentStore().Update(ctx, info, "labels."+gcLabel); err != nil {
		return fmt.Errorf("image %s: label config blob: %w", Ref(family), err)
	}
	return nil
}
