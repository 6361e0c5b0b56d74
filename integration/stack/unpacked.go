package stack

import (
	"context"
	"fmt"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
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
