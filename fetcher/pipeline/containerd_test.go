package pipeline

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// containerdImages is containerd's own image store (its metadata package
// over a bolt file, as the daemon keeps it), for the host, where no
// containerd runs.
func containerdImages(t *testing.T) images.Store {
	t.Helper()
	st := containerdOver(t, nil)
	return st.images
}

func manifestDesc(s string) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString(s), Size: int64(len(s))}
}

// TestRegistrationOwnership, on containerd's image store: an image of the
// name that this daemon did not create (a CRI-pinned registry image) is
// refused by name, target and labels, stays as it was, and is never
// removed by unregister; --replace repoints it keeping its labels. Our own
// image, repointed, keeps a label someone else put on it, and unregister
// removes it.
func TestRegistrationOwnership(t *testing.T) {
	is := containerdImages(t)
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	nss := []string{"default", "k8s.io"}
	const ref = "registry.example/app:1"
	theirs := images.Image{Name: ref, Target: manifestDesc("registry manifest"),
		Labels: map[string]string{LabelPinned: "pinned", "io.cri-containerd.image": "managed"}}
	if _, err := is.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	unchanged := func(when string) {
		t.Helper()
		img, err := is.Get(ctx, ref)
		if err != nil || img.Target.Digest != theirs.Target.Digest || !maps.Equal(img.Labels, theirs.Labels) {
			t.Fatalf("%s: the registry image is %+v, %v; want target %s and labels %v", when, img, err, theirs.Target.Digest, theirs.Labels)
		}
	}
	ours := manifestDesc("our manifest")
	err := checkOwner(ctx, is, "k8s.io", ref, false)
	for _, want := range []string{ref, "k8s.io", theirs.Target.Digest.String(), `"io.cri-containerd.pinned"="pinned"`, "--replace"} {
		if !errors.Is(err, ErrForeignImage) || !strings.Contains(err.Error(), want) {
			t.Errorf("check of the registry image's name: %v; want ErrForeignImage naming %q", err, want)
		}
	}
	if err := putImage(ctx, is, "k8s.io", ref, ours, false); !errors.Is(err, ErrForeignImage) {
		t.Fatalf("registering over the registry image: %v; want ErrForeignImage", err)
	}
	unchanged("after a refused registration")
	if err := unregister(ctx, is, nss, ref); err != nil {
		t.Fatal(err)
	}
	unchanged("after unregister")

	if err := putImage(ctx, is, "k8s.io", ref, ours, true); err != nil {
		t.Fatalf("registering with replace: %v", err)
	}
	img, err := is.Get(ctx, ref)
	want := maps.Clone(theirs.Labels)
	want[LabelSource] = imageLabel
	if err != nil || img.Target.Digest != ours.Digest || !maps.Equal(img.Labels, want) {
		t.Errorf("after replace: %+v, %v; want target %s and labels %v", img, err, ours.Digest, want)
	}

	// Our own image: created, pinned by the CRI, repointed by a new pull.
	const mine = "s3.local/b/app:latest"
	if err := putImage(ctx, is, "k8s.io", mine, ours, false); err != nil {
		t.Fatal(err)
	}
	if _, err := is.Update(ctx, images.Image{Name: mine, Labels: map[string]string{LabelPinned: "pinned"}}, "labels."+LabelPinned); err != nil {
		t.Fatal(err)
	}
	next := manifestDesc("our next manifest")
	if err := putImage(ctx, is, "k8s.io", mine, next, false); err != nil {
		t.Fatalf("repointing our image: %v", err)
	}
	img, err = is.Get(ctx, mine)
	want = map[string]string{LabelSource: imageLabel, LabelPinned: "pinned"}
	if err != nil || img.Target.Digest != next.Digest || !maps.Equal(img.Labels, want) {
		t.Errorf("our image repointed: %+v, %v; want target %s and labels %v", img, err, next.Digest, want)
	}
	if err := unregister(ctx, is, nss, mine); err != nil {
		t.Fatal(err)
	}
	if _, err := is.Get(ctx, mine); !errdefs.IsNotFound(err) {
		t.Errorf("our image after unregister: %v; want it gone", err)
	}
}
