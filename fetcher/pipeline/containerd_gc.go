package pipeline

import (
	"context"
	"fmt"
	"slices"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/opencontainers/image-spec/identity"
)

// PoolImage is a containerd image, in one namespace, whose snapshots are
// in our pool: its top chain is unpacked in our snapshotter there. Garbage
// collection weighs it with what containerd knows of its use.
type PoolImage struct {
	Namespace, Name string
	// Ours says this daemon created the image (an S3 image's name).
	Ours bool
	// Chains are the chain IDs of its layers, bottom first.
	Chains []string
	// UsedAt is the image record's last change (its last pull) or the
	// creation of the newest container made on it, whichever is later.
	UsedAt time.Time
	// Containers are the IDs of the containers made on it.
	Containers []string
	// Pinned says it carries LabelPinned = "pinned".
	Pinned bool
	// Lease is the ID of a lease holding the image, its content or its
	// chains (a pull or an unpack under way), "" when none does.
	Lease string
}

// PoolImages lists, in every containerd namespace, the images unpacked in
// our snapshotter (c.Snapshotter), whoever made them, with their
// containers, pins and leases. An image whose content is incomplete
// (a pull under way, a platform not pulled) is not listed: it cannot be
// unpacked here. When containerd's socket is absent it returns an error
// wrapping ErrContainerdAbsent: containerd not answering is not containerd
// having no image.
func (c *ContainerdRegistrar) PoolImages(ctx context.Context) ([]PoolImage, error) {
	cl, err := c.client(ctx, "")
	if err != nil {
		return nil, err
	}
	if cl == nil {
		return nil, fmt.Errorf("containerd at %s: %w", c.Address, ErrContainerdAbsent)
	}
	defer cl.Close()
	nss, err := c.namespaces(ctx, cl, "(every image)")
	if err != nil {
		return nil, err
	}
	var out []PoolImage
	for _, ns := range nss {
		imgs, err := c.poolImagesIn(namespaces.WithNamespace(ctx, ns), cl, ns)
		if err != nil {
			return nil, err
		}
		out = append(out, imgs...)
	}
	return out, nil
}

// poolImagesIn is PoolImages in namespace ns (ctx names it).
func (c *ContainerdRegistrar) poolImagesIn(ctx context.Context, cl *containerd.Client, ns string) ([]PoolImage, error) {
	imgs, err := cl.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containerd images in namespace %s: %w", ns, err)
	}
	if len(imgs) == 0 {
		return nil, nil
	}
	ctrs, err := cl.ContainerService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containerd containers in namespace %s: %w", ns, err)
	}
	held, err := leased(ctx, cl.LeasesService(), ns)
	if err != nil {
		return nil, err
	}
	cs, sn := cl.ContentStore(), cl.SnapshotService(c.snapshotter())
	platform := platforms.Default()
	var out []PoolImage
	for _, img := range imgs {
		lg := log.G(ctx).WithField("namespace", ns).WithField("image", img.Name)
		diffIDs, err := img.RootFS(ctx, cs, platform)
		if err != nil {
			lg.WithError(err).Debug("gc: containerd image without its config for this platform: not in our pool")
			continue
		}
		chains := identity.ChainIDs(slices.Clone(diffIDs))
		if len(chains) == 0 {
			continue
		}
		if _, err := sn.Stat(ctx, chains[len(chains)-1].String()); errdefs.IsNotFound(err) {
			continue
		} else if err != nil {
			// One image's trouble must not keep the others from
			// collection: this one is left out, so kept.
			lg.WithError(err).Warn("gc: stat of a containerd image's top chain in our snapshotter failed: image left out of collection")
			continue
		}
		pi := PoolImage{Namespace: ns, Name: img.Name, Ours: ownImage(img), UsedAt: img.UpdatedAt, Pinned: img.Labels[LabelPinned] == "pinned"}
		if img.CreatedAt.After(pi.UsedAt) {
			pi.UsedAt = img.CreatedAt
		}
		for _, ch := range chains {
			pi.Chains = append(pi.Chains, ch.String())
		}
		for _, ct := range ctrs {
			if ct.Image == img.Name {
				pi.Containers = append(pi.Containers, ct.ID)
				if ct.CreatedAt.After(pi.UsedAt) {
					pi.UsedAt = ct.CreatedAt
				}
			}
		}
		keys := []string{"images/" + img.Name, "content/" + img.Target.Digest.String()}
		if m, err := images.Manifest(ctx, cs, img.Target, platform); err == nil {
			keys = append(keys, "content/"+m.Config.Digest.String())
			for _, l := range m.Layers {
				keys = append(keys, "content/"+l.Digest.String())
			}
		}
		for _, ch := range pi.Chains {
			keys = append(keys, "snapshots/"+c.snapshotter()+"/"+ch)
		}
		for _, k := range keys {
			if id := held[k]; id != "" {
				pi.Lease = id
				break
			}
		}
		out = append(out, pi)
	}
	return out, nil
}

// leased maps what the leases of a namespace hold ("TYPE/ID": content/
// DIGEST, images/NAME, snapshots/SNAPSHOTTER/KEY) to a lease holding it.
func leased(ctx context.Context, lm leases.Manager, ns string) (map[string]string, error) {
	ls, err := lm.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containerd leases in namespace %s: %w", ns, err)
	}
	held := map[string]string{}
	for _, l := range ls {
		rs, err := lm.ListResources(ctx, l)
		if errdefs.IsNotFound(err) {
			continue // ended since it was listed
		}
		if err != nil {
			return nil, fmt.Errorf("resources of containerd lease %s in namespace %s: %w", l.ID, ns, err)
		}
		for _, r := range rs {
			held[r.Type+"/"+r.ID] = l.ID
		}
	}
	return held, nil
}

// RemoveImage removes image name from containerd namespace ns the way
// containerd removes one (`ctr image rm --sync`): the image record is
// deleted and containerd's garbage collection, waited for, removes the
// content and the snapshots nothing else holds, through our proxy plugin.
// An image already gone is not an error.
func (c *ContainerdRegistrar) RemoveImage(ctx context.Context, ns, name string) error {
	cl, err := c.client(ctx, name)
	if err != nil || cl == nil {
		return err
	}
	defer cl.Close()
	if err := cl.ImageService().Delete(namespaces.WithNamespace(ctx, ns), name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove image %s from containerd namespace %s: %w", name, ns, err)
	}
	return nil
}
