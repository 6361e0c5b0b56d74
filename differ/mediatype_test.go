package differ

import (
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestApplyRefusesCompressedBytesUnderOCIPlainType: containerd's applier
// decompresses a layer only when its media type says compressed (or is
// Docker's plain type, which old builders used for compressed layers):
// under OCI's plain type gzip bytes are read as a tar stream, and refused.
func TestApplyRefusesCompressedBytesUnderOCIPlainType(t *testing.T) {
	layer := s3test.Gzip(t, tarOf(t, entry{"etc/new", "new"}))
	ctrd, f := newFixture(t), newFixture(t)
	_, cerr := ctrd.applyContainerd(ctrd.blob(t, ocispec.MediaTypeImageLayer, layer))
	got, err := f.apply(f.blob(t, ocispec.MediaTypeImageLayer, layer))
	if cerr != nil && err == nil {
		t.Errorf("Apply took gzip bytes under %s (diff ID %s); containerd's applier refuses them: %v", ocispec.MediaTypeImageLayer, got.Digest, cerr)
	}
}
