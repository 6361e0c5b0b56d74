package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// LabelPinned is the containerd image label that keeps an image from
// garbage collection when its value is "pinned": the label by which the
// kubelet's images are pinned through containerd's CRI.
const LabelPinned = "io.cri-containerd.pinned"

// client connects to containerd, or returns nil (and no error) when its
// socket does not exist (no containerd on this host).
func (c *ContainerdRegistrar) client(ctx context.Context, ref string) (*containerd.Client, error) {
	addr := strings.TrimPrefix(c.Address, "unix://")
	if _, err := os.Stat(addr); errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithField("address", addr).WithField("ref", ref).Debug("containerd socket absent")
		return nil, nil
	}
	cl, err := containerd.New(addr, containerd.WithDefaultNamespace(c.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("containerd at %s: %w", addr, err)
	}
	return cl, nil
}

// Unregister removes image ref from containerd and waits for containerd's
// garbage collection to drop what only it referred to, so that containerd
// never lists a name whose snapshots are gone. An image containerd does not
// have, or no containerd, is not an error.
func (c *ContainerdRegistrar) Unregister(ctx context.Context, ref string) error {
	cl, err := c.client(ctx, ref)
	if err != nil || cl == nil {
		return err
	}
	defer cl.Close()
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	if err := cl.ImageService().Delete(ctx, ref, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove image %s from containerd: %w", ref, err)
	}
	return nil
}

// Pinned reports whether containerd's image ref carries LabelPinned =
// "pinned". An image containerd does not have, or no containerd, is not
// pinned.
func (c *ContainerdRegistrar) Pinned(ctx context.Context, ref string) (bool, error) {
	cl, err := c.client(ctx, ref)
	if err != nil || cl == nil {
		return false, err
	}
	defer cl.Close()
	ctx = namespaces.WithNamespace(ctx, c.Namespace)
	img, err := cl.ImageService().Get(ctx, ref)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("image %s in containerd: %w", ref, err)
	}
	return img.Labels[LabelPinned] == "pinned", nil
}
