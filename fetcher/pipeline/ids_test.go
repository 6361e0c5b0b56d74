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

func TestParseS3URL(t *testing.T) {
	for _, c := range []struct{ in, bucket, key string }{
		{"s3://images/debian/", "images", "debian/"},
		{"s3://images/a/b.tar", "images", "a/b.tar"},
	} {
		b, k, err := ParseS3URL(c.in)
		if err != nil || b != c.bucket || k != c.key {
			t.Errorf("ParseS3URL(%q) = %q, %q, %v", c.in, b, k, err)
		}
	}
	for _, bad := range []string{"images/a.tar", "s3://", "s3://bucket", "s3:///key"} {
		if _, _, err := ParseS3URL(bad); err == nil {
			t.Errorf("ParseS3URL(%q) accepted", bad)
		}
	}
}
