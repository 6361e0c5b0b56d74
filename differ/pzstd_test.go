package differ

import (
	"encoding/binary"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// pzstdOf compresses layer as pzstd (zstd's parallel compressor) writes
// it: each zstd frame preceded by a skippable frame (magic 0x184D2A50)
// holding the frame's compressed size, so that the stream's first bytes
// are a skippable frame's, not a zstd frame's.
func pzstdOf(t *testing.T, layer []byte) []byte {
	t.Helper()
	var out []byte
	for _, part := range [][]byte{layer[:len(layer)/2], layer[len(layer)/2:]} {
		frame := s3test.Zstd(t, part)
		skip := make([]byte, 12)
		binary.LittleEndian.PutUint32(skip, 0x184D2A50)
		binary.LittleEndian.PutUint32(skip[4:], 4)
		binary.LittleEndian.PutUint32(skip[8:], uint32(len(frame)))
		out = append(append(out, skip...), frame...)
	}
	return out
}

// TestApplyZstdStartingWithSkippableFrame: containerd's applier tells
// zstd by a zstd frame's magic or a skippable frame's, so a layer pzstd
// compressed applies under the zstd, gzip and Docker plain media types
// alike. Apply takes it too, with the same diff ID and tree.
func TestApplyZstdStartingWithSkippableFrame(t *testing.T) {
	layer := pzstdOf(t, tarOf(t, entry{"etc/", ""}, entry{"etc/new", "new"}, entry{"usr/bin/tool", "#!/bin/sh\n"}))
	for _, mt := range []string{ocispec.MediaTypeImageLayerZstd, images.MediaTypeDockerSchema2LayerZstd, ocispec.MediaTypeImageLayerGzip, images.MediaTypeDockerSchema2Layer} {
		t.Run(mt, func(t *testing.T) {
			f := applyBothAs(t, mt, layer, noPrepare)
			if got := f.read(t, "etc/new"); got != "new" {
				t.Errorf("etc/new = %q, want %q", got, "new")
			}
		})
	}
}

// TestApplyRefusesSkippableFrameUnderOCIPlainType: under OCI's plain tar
// type containerd's applier reads the bytes as a tar stream, whatever
// they are; a zstd stream opening with a skippable frame is no tar, and
// Apply refuses it as containerd's applier does.
func TestApplyRefusesSkippableFrameUnderOCIPlainType(t *testing.T) {
	layer := pzstdOf(t, tarOf(t, entry{"etc/new", "new"}))
	ctrd, f := newFixture(t), newFixture(t)
	_, cerr := ctrd.applyContainerd(ctrd.blob(t, ocispec.MediaTypeImageLayer, layer))
	if cerr == nil {
		t.Fatalf("containerd's applier took a zstd stream under %s", ocispec.MediaTypeImageLayer)
	}
	if got, err := f.apply(f.blob(t, ocispec.MediaTypeImageLayer, layer)); err == nil {
		t.Errorf("Apply took a zstd stream under %s (diff ID %s); containerd's applier refuses it: %v", ocispec.MediaTypeImageLayer, got.Digest, cerr)
	}
}
