package pipeline

import (
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
)

// TestChainIDMatchesOCI checks our chain IDs against the image-spec's
// identity.ChainID, which containerd uses to find unpacked snapshots.
func TestChainIDMatchesOCI(t *testing.T) {
	diffs := []digest.Digest{
		digest.FromString("layer one"), digest.FromString("layer two"), digest.FromString("layer three"),
	}
	prev := ""
	for n := range diffs {
		prev = ChainID(prev, diffs[n].String())
		if want := identity.ChainID(diffs[:n+1]).String(); prev != want {
			t.Errorf("chain ID of %d layers = %s, image-spec says %s", n+1, prev, want)
		}
	}
}
