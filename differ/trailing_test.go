package differ

import (
	"bytes"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestApplyTrailingDataAsContainerd: containerd's applier reads a layer's
// tar stream up to its end-of-archive marker, then reads whatever follows
// and hashes it into the diff ID. A layer with bytes after its marker is
// applied by it; Apply must take it too and give the same diff ID.
func TestApplyTrailingDataAsContainerd(t *testing.T) {
	layer := tarOf(t, entry{"etc/new", "new"})
	for name, b := range map[string][]byte{
		"non-zero bytes":   append(append([]byte(nil), layer...), []byte("trailing bytes after the marker")...),
		"5 MiB of padding": append(append([]byte(nil), layer...), bytes.Repeat([]byte{0}, 5<<20)...),
	} {
		t.Run(name, func(t *testing.T) {
			applyBothAs(t, images.MediaTypeDockerSchema2Layer, b, noPrepare)
		})
		t.Run(name+", gzip", func(t *testing.T) {
			applyBothAs(t, ocispec.MediaTypeImageLayerGzip, s3test.Gzip(t, b), noPrepare)
		})
	}
}
