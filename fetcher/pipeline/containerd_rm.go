package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
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

// Unregister removes image ref from containerd, in every namespace where
// it is an image we registered (a pull may have registered it in several),
// and waits for containerd's garbage collection to drop what only it
// referred to, so that containerd never lists a name whose snapshots are
// gone. An image containerd does not have, or no containerd, is not an
// error.
func (c *ContainerdRegistrar) Unregister(ctx context.Context, ref string) error {
	cl, err := c.client(ctx, ref)
	if err != nil || cl == nil {
		return err
	}
	defer cl.Close()
	return c.eachOurs(ctx, cl, ref, func(ctx context.Context, ns string, _ images.Image) error {
		if err := cl.ImageService().Delete(ctx, ref, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove image %s from containerd namespace %s: %w", ref, ns, err)
		}
		return nil
	})
}

// Pinned reports whether containerd's image ref carries LabelPinned =
// "pinned" in any namespace where it is an image we registered. An image
// containerd does not have, or no containerd, is not pinned.
func (c *ContainerdRegistrar) Pinned(ctx context.Context, ref string) (bool, error) {
	cl, err := c.client(ctx, ref)
	if err != nil || cl == nil {
		return false, err
	}
	defer cl.Close()
	pinned := false
	err = c.eachOurs(ctx, cl, ref, func(_ context.Context, _ string, img images.Image) error {
		pinned = pinned || img.Labels[LabelPinned] == "pinned"
		return nil
	})
	return pinned, err
}

// eachOurs calls f, in each containerd namespace (c.Namespace first), for
// the image named ref there that we registered (labelled LabelSource).
func (c *ContainerdRegistrar) eachOurs(ctx context.Context, cl *containerd.Client, ref string, f func(context.Context, string, images.Image) error) error {
	nss, err := cl.NamespaceService().List(namespaces.WithNamespace(ctx, c.Namespace))
	if err != nil {
		return fmt.Errorf("image %s: list containerd namespaces: %w", ref, err)
	}
	if !slices.Contains(nss, c.Namespace) {
		nss = append(nss, c.Namespace)
	}
	slices.SortStableFunc(nss, func(a, b string) int {
		switch {
		case a == c.Namespace:
			return -1
		case b == c.Namespace:
			return 1
		}
		return 0
	})
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		img, err := cl.ImageService().Get(nctx, ref)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("image %s in containerd namespace %s: %w", ref, ns, err)
		}
		if _, ours := img.Labels[LabelSource]; !ours {
			continue
		}
		if err := f(nctx, ns, img); err != nil {
			return err
		}
	}
	return nil
}
