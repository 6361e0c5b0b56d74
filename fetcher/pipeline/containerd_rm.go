package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// LabelPinned is the containerd image label that keeps an image from
// garbage collection when its value is "pinned": the label by which the
// kubelet's images are pinned through containerd's CRI.
const LabelPinned = "io.cri-containerd.pinned"

// ErrContainerdAbsent is wrapped by Register when containerd's socket does
// not exist (containerd not started yet, restarting, or not on this host):
// the name is then pending, and registered once containerd answers
// (Pipelines.RegisterPending).
var ErrContainerdAbsent = errors.New("containerd socket absent")

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
	nss, err := c.namespaces(ctx, cl, ref)
	if err != nil {
		return err
	}
	return unregister(ctx, cl.ImageService(), nss, ref)
}

// Namespaces implements Registrar: the containerd namespaces where ref is
// an image this daemon created, none without containerd.
func (c *ContainerdRegistrar) Namespaces(ctx context.Context, ref string) ([]string, error) {
	cl, err := c.client(ctx, ref)
	if err != nil || cl == nil {
		return nil, err
	}
	defer cl.Close()
	nss, err := c.namespaces(ctx, cl, ref)
	if err != nil {
		return nil, err
	}
	return ourNamespaces(ctx, cl.ImageService(), nss, ref)
}

// ourNamespaces lists the namespaces of nss where is has ref as an image
// this daemon created.
func ourNamespaces(ctx context.Context, is images.Store, nss []string, ref string) ([]string, error) {
	var ours []string
	err := eachOurs(ctx, is, nss, ref, func(_ context.Context, ns string, _ images.Image) error {
		ours = append(ours, ns)
		return nil
	})
	return ours, err
}

// unregister deletes image ref from is in each namespace of nss where it
// is an image this daemon created, waiting for containerd's garbage
// collection; an image of that name someone else made stays as it is.
func unregister(ctx context.Context, is images.Store, nss []string, ref string) error {
	return eachOurs(ctx, is, nss, ref, func(ctx context.Context, ns string, _ images.Image) error {
		if err := is.Delete(ctx, ref, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove image %s from containerd namespace %s: %w", ref, ns, err)
		}
		return nil
	})
}

// namespaces lists containerd's namespaces, c.Namespace first (also when
// containerd has no such namespace yet).
func (c *ContainerdRegistrar) namespaces(ctx context.Context, cl *containerd.Client, ref string) ([]string, error) {
	nss, err := cl.NamespaceService().List(namespaces.WithNamespace(ctx, c.Namespace))
	if err != nil {
		return nil, fmt.Errorf("image %s: list containerd namespaces: %w", ref, err)
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
	return nss, nil
}

// eachOurs calls f, in each containerd namespace of nss in turn, for the
// image named ref there that this daemon created (ownImage).
func eachOurs(ctx context.Context, is images.Store, nss []string, ref string, f func(context.Context, string, images.Image) error) error {
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		img, err := is.Get(nctx, ref)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("image %s in containerd namespace %s: %w", ref, ns, err)
		}
		if !ownImage(img) {
			continue
		}
		if err := f(nctx, ns, img); err != nil {
			return err
		}
	}
	return nil
}

// ErrForeignImage is wrapped by the refusal to register a name under which
// containerd has an image this daemon did not create (a registry image, an
// import, another tool's): it stays as it is unless a pull says --replace.
var ErrForeignImage = errors.New("containerd image not created by this daemon")

// imageLabel is the value of LabelSource on the images this daemon
// creates: its presence is what makes an image ours (ownImage).
const imageLabel = "pipeline"

// ownImage reports whether containerd's image img is one this daemon
// created: it carries LabelSource.
func ownImage(img images.Image) bool {
	_, ok := img.Labels[LabelSource]
	return ok
}

// checkOwner is nil when ref can be registered in namespace ns of is: no
// image has that name, or one this daemon created, or replace. Otherwise
// it names the image, what it points at and its labels (who made it).
func checkOwner(ctx context.Context, is images.Store, ns, ref string, replace bool) error {
	img, err := is.Get(ctx, ref)
	switch {
	case errdefs.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("register %s: image in containerd namespace %s: %w", ref, ns, err)
	case ownImage(img) || replace:
		return nil
	}
	return fmt.Errorf("register %s: containerd namespace %s has image %s pointing at %s %s, labels %s, updated %s: %w (pull with --replace to repoint it, or choose another --name)",
		ref, ns, ref, img.Target.MediaType, img.Target.Digest, labelList(img.Labels), img.UpdatedAt.UTC().Format(time.RFC3339), ErrForeignImage)
}

// labelList prints labels sorted, each key and value quoted.
func labelList(labels map[string]string) string {
	if len(labels) == 0 {
		return "none"
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		out = append(out, fmt.Sprintf("%q=%q", k, labels[k]))
	}
	return strings.Join(out, ", ")
}

// putImage makes image ref in is point at target, labelled ours: created
// when absent; when present, only its target and LabelSource are written
// (containerd's field paths), so every other label it carries (a CRI pin,
// another tool's) stays. A present image this daemon did not create is
// refused unless replace (checkOwner).
func putImage(ctx context.Context, is images.Store, ns, ref string, target ocispec.Descriptor, replace bool) error {
	img := images.Image{Name: ref, Target: target, Labels: map[string]string{LabelSource: imageLabel}}
	_, err := is.Create(ctx, img)
	if err == nil {
		return nil
	}
	if !errdefs.IsAlreadyExists(err) {
		return fmt.Errorf("register %s: create image in containerd namespace %s: %w", ref, ns, err)
	}
	if err := checkOwner(ctx, is, ns, ref, replace); err != nil {
		return err
	}
	if _, err := is.Update(ctx, img, "target", "labels."+LabelSource); err != nil {
		return fmt.Errorf("register %s: update image in containerd namespace %s: %w", ref, ns, err)
	}
	return nil
}
