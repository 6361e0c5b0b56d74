package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// How containerd finds our unpacked chains: its unpacker Prepares each
// layer with the label containerd.io/snapshot.ref = the layer's chain ID;
// our snapshotter answers AlreadyExists when a committed snapshot carries
// that label on the same parent, and containerd then links that committed
// snapshot into its own records (the "remote snapshot" path of its metadata
// store) instead of applying the layer. The chain snapshots are committed
// in containerd's namespace with that label (updateDB), so an image whose
// config lists the layers' diff IDs unpacks without any layer blob.

// ContainerdRegistrar writes an image's OCI config and manifest into
// containerd's content store and creates or updates the image record, so
// that `ctr run --snapshotter flyio REF` finds the unpacked chain.
type ContainerdRegistrar struct {
	Address   string // containerd's socket
	Namespace string
}

// Register implements Registrar. A containerd socket that does not exist
// is not an error (no containerd on this host): it is logged and skipped.
func (c *ContainerdRegistrar) Register(ctx context.Context, ref string, diffIDs []string) error {
	addr := strings.TrimPrefix(c.Address, "unix://")
	if _, err := os.Stat(addr); errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithField("address", addr).WithField("ref", ref).Warn("containerd socket absent: image not registered in containerd")
		return nil
	}
	cl, err := containerd.New(addr, containerd.WithDefaultNamespace(c.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("containerd at %s: %w", addr, err)
	}
	defer cl.Close()
	ctx = withNamespace(ctx, c.Namespace)

	diffs := make([]digest.Digest, len(diffIDs))
	layers := make([]ocispec.Descriptor, len(diffIDs))
	for i, d := range diffIDs {
		dg, err := digest.Parse(d)
		if err != nil {
			return fmt.Errorf("register %s: layer %d diff id %q: %w", ref, i+1, d, err)
		}
		diffs[i] = dg
		layers[i] = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: dg}
	}
	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffs},
		Config:   ocispec.ImageConfig{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
	}
	cfgRaw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfgRaw), Size: int64(len(cfgRaw))}
	man := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cfgDesc, Layers: layers}
	manRaw, err := json.Marshal(man)
	if err != nil {
		return err
	}
	manDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(manRaw), Size: int64(len(manRaw))}
	cs := cl.ContentStore()
	if err := content.WriteBlob(ctx, cs, "flyio-config-"+cfgDesc.Digest.Encoded(), bytes.NewReader(cfgRaw), cfgDesc); err != nil {
		return fmt.Errorf("register %s: write config: %w", ref, err)
	}
	gcLabels := map[string]string{"containerd.io/gc.ref.content.config": cfgDesc.Digest.String()}
	if err := content.WriteBlob(ctx, cs, "flyio-manifest-"+manDesc.Digest.Encoded(), bytes.NewReader(manRaw), manDesc, content.WithLabels(gcLabels)); err != nil {
		return fmt.Errorf("register %s: write manifest: %w", ref, err)
	}
	is := cl.ImageService()
	img := images.Image{Name: ref, Target: manDesc, Labels: map[string]string{LabelSource: "pipeline"}}
	if _, err := is.Create(ctx, img); err != nil {
		if !errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("register %s: create image: %w", ref, err)
		}
		if _, err := is.Update(ctx, img, "target", "labels"); err != nil {
			return fmt.Errorf("register %s: update image: %w", ref, err)
		}
	}
	log.G(ctx).WithField("ref", ref).WithField("manifest", manDesc.Digest).Info("image registered in containerd")
	return nil
}
