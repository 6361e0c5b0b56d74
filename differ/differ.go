// Package differ applies registry layers for containerd with the daemon's
// extractor. containerd unpacks a pulled layer by handing it to a diff
// plugin, the one its transfer service's unpack configuration names for
// the snapshotter (`differ`). Served on the daemon's socket as a proxy diff
// plugin, Applier extracts each layer onto the snapshot containerd
// prepared, decompressing, hashing the diff ID and writing on goroutines
// of their own (fetcher/tarball), where containerd's own applier does the
// three one after another on one. The layer is held to Config's rules,
// which take what containerd's applier takes, confined to the snapshot.
package differ

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// Applier is a diff.Applier that extracts layers with fetcher/tarball.
type Applier struct {
	// Content is where the layers' blobs are read from: containerd's
	// content store.
	Content content.Provider
	// Limits are the extraction rules every layer is held to.
	Limits tarball.Limits
	// GzipCommand is tarball.ExtractOptions.GzipCommand: the program gzip
	// layers are inflated with, "" for the built-in inflater.
	GzipCommand string
}

// layerTypes are the media types Apply takes: a tar layer, plain, gzip or
// zstd, in OCI's and Docker's names. What the bytes are is told by their
// first bytes, as for S3 layers, and as containerd's applier tells them
// for every type but OCI's plain ones, whose bytes it reads as a tar
// stream: compressed bytes under those are refused, as it refuses them. An
// encrypted layer, or any other wrapped type, is not.
var layerTypes = map[string]bool{
	ocispec.MediaTypeImageLayer:                     true,
	ocispec.MediaTypeImageLayerGzip:                 true,
	ocispec.MediaTypeImageLayerZstd:                 true,
	images.MediaTypeDockerSchema2Layer:              true,
	images.MediaTypeDockerSchema2LayerGzip:          true,
	images.MediaTypeDockerSchema2LayerZstd:          true,
	images.MediaTypeDockerSchema2LayerForeign:       true,
	images.MediaTypeDockerSchema2LayerForeignGzip:   true,
	ocispec.MediaTypeImageLayerNonDistributable:     true, //nolint:staticcheck // still found in older images
	ocispec.MediaTypeImageLayerNonDistributableGzip: true, //nolint:staticcheck
	ocispec.MediaTypeImageLayerNonDistributableZstd: true, //nolint:staticcheck
}

// Apply implements diff.Applier. It reads the layer desc from a.Content,
// extracts it onto the filesystem mounts describes (mounted for the call
// and unmounted before it returns) and returns the uncompressed layer's
// descriptor, whose digest is the diff ID containerd then checks against
// the image's config. The layer's entry for its root ("./") is checked but
// not applied (tarball.ExtractOptions.KeepRootMetadata): the snapshot's
// root keeps its mode, owner, extended attributes and times, as with
// containerd's applier, which ignores that entry. A media type other than
// a tar layer's (an encrypted layer, say) or a layer that needs stream
// processors' payloads is refused as not implemented, before anything is
// read; a layer the extraction rules refuse fails naming its entry and the
// rule, and what it wrote is left to containerd, which removes the
// snapshot it prepared.
func (a *Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	var cfg diff.ApplyConfig
	for _, o := range opts {
		if err := o(ctx, desc, &cfg); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("apply layer %s: %w", desc.Digest, err)
		}
	}
	if !layerTypes[desc.MediaType] {
		return ocispec.Descriptor{}, fmt.Errorf("apply layer %s: media type %q is not a tar layer the flyio differ applies: %w", desc.Digest, desc.MediaType, errdefs.ErrNotImplemented)
	}
	if len(cfg.ProcessorPayloads) > 0 {
		return ocispec.Descriptor{}, fmt.Errorf("apply layer %s: stream processor payloads are not supported: %w", desc.Digest, errdefs.ErrNotImplemented)
	}
	start := time.Now()
	// containerd names the namespace in the call's metadata; the content
	// store wants it in the calls made to it.
	if ns, ok := namespaces.Namespace(ctx); ok {
		ctx = namespaces.WithNamespace(ctx, ns)
	}
	ra, err := a.Content.ReaderAt(ctx, desc)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("apply layer %s: open its blob: %w", desc.Digest, err)
	}
	defer ra.Close()
	// A compressed layer's diff ID the extractor computes beside the
	// decompression; a plain layer's is the hash of the bytes read, which
	// it leaves to its caller. The bytes are hashed here only when the
	// media type says, or may say, plain: hashing a compressed blob too
	// would cost as much again as the diff ID's hash.
	var r io.Reader = io.NewSectionReader(ra, 0, ra.Size())
	var rawHash hash.Hash
	comp, err := images.DiffCompression(ctx, desc.MediaType)
	if err == nil && comp == "" {
		// OCI's plain types: containerd's applier reads the bytes as a
		// tar stream as they are, so bytes the extractor would
		// decompress are no tar layer.
		var magic [4]byte
		n, _ := ra.ReadAt(magic[:], 0)
		if tarball.DetectCompression(magic[:n]) != tarball.Plain {
			return ocispec.Descriptor{}, fmt.Errorf("apply layer %s: media type %q says a plain tar, but the blob is compressed: %w", desc.Digest, desc.MediaType, errdefs.ErrInvalidArgument)
		}
	}
	if err == nil && (comp == "" || comp == "unknown") {
		rawHash = sha256.New()
		r = io.TeeReader(r, rawHash)
	}
	var (
		st         tarball.Stats
		extractErr error // kept apart: WithTempMount's wrapping names its temporary folder
	)
	err = mount.WithTempMount(ctx, mounts, func(root string) error {
		st, extractErr = tarball.ExtractDir(ctx, r, root, tarball.ExtractOptions{Limits: a.Limits, HashStream: true, KeepRootMetadata: true, GzipCommand: a.GzipCommand})
		if extractErr == nil && cfg.SyncFs {
			extractErr = tarball.SyncFS(root)
		}
		return extractErr
	})
	if extractErr != nil {
		return ocispec.Descriptor{}, fmt.Errorf("apply layer %s: %w", desc.Digest, extractErr)
	}
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("apply layer %s: %w", desc.Digest, err)
	}
	applied := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.Digest(st.DiffID), Size: st.StreamBytes}
	if st.Compression == tarball.Plain {
		if rawHash == nil {
			// Named compressed, stored plain: containerd's own applier
			// takes such a layer too, so it is hashed now, once more.
			rawHash = sha256.New()
			if _, err := io.Copy(rawHash, io.NewSectionReader(ra, 0, ra.Size())); err != nil {
				return ocispec.Descriptor{}, fmt.Errorf("apply layer %s: hash the plain tar stored under %q: %w", desc.Digest, desc.MediaType, err)
			}
		}
		applied.Digest = digest.NewDigestFromBytes(digest.SHA256, rawHash.Sum(nil))
	}
	log.G(ctx).WithFields(log.Fields{"layer": desc.Digest, "diff_id": applied.Digest, "compression": st.Compression,
		"entries": st.Entries, "took": time.Since(start).Round(time.Millisecond)}).Info("differ: layer applied")
	return applied, nil
}

// SetMountDir makes dir the folder Apply mounts snapshots under, and
// unmounts and removes what an earlier run of the daemon left there. A run
// killed during an apply leaves its mount behind, and that mount holds the
// snapshot's device open: containerd could never remove the snapshot. The
// daemon calls it once, before serving; it sets the location for every
// temporary mount of containerd's mount package in the process, as
// containerd does for its own under its root.
func SetMountDir(ctx context.Context, dir string) error {
	if err := mount.SetTempMountLocation(dir); err != nil {
		return fmt.Errorf("differ: mount folder %s: %w", dir, err)
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("differ: mount folder %s: %w", dir, err)
	}
	warnings, err := mount.CleanupTempMounts(0)
	if err != nil {
		return fmt.Errorf("differ: unmount what an earlier run left in %s: %w", dir, err)
	}
	for _, w := range warnings {
		log.G(ctx).WithError(w).WithField("dir", dir).Warn("differ: a mount an earlier run left stays")
	}
	// A run killed between making a mount point and mounting it, or
	// between unmounting and removing it, leaves it empty; Remove takes
	// only an empty folder.
	for _, e := range left {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.G(ctx).WithError(err).WithField("dir", dir).Warn("differ: a mount point an earlier run left stays")
		}
	}
	if len(left) > 0 {
		log.G(ctx).WithFields(log.Fields{"dir": dir, "mounts": len(left)}).Info("differ: cleared the mounts an earlier run left")
	}
	return nil
}
