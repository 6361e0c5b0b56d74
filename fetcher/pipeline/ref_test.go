package pipeline

import (
	"strings"
	"testing"

	"github.com/distribution/reference"
)

// TestDefaultRef: an image pulled without --name gets a name containerd,
// nerdctl and the CRI accept, derived from its bucket and key.
func TestDefaultRef(t *testing.T) {
	cases := []struct{ bucket, key, want string }{
		{"flyio-images", "images/debian/", "s3.local/flyio-images/images/debian:latest"},
		{"flyio-images", "images/single.tar", "s3.local/flyio-images/images/single:latest"},
		{"my.bucket", "Images/App v2/", "s3.local/my.bucket/images/app-v2:latest"},
		{"b", "a//__x..y--z/__/", "s3.local/b/a/x-y-z:latest"},
		{"b", "layers/1.tar", "s3.local/b/layers/1:latest"},
		{"b", "layers/app.tar.gz", "s3.local/b/layers/app:latest"},
		{"b", "layers/app.tar.zst", "s3.local/b/layers/app:latest"},
	}
	for _, c := range cases {
		got, err := DefaultRef(c.bucket, c.key)
		if err != nil || got != c.want {
			t.Errorf("DefaultRef(%q, %q) = %q, %v; want %q", c.bucket, c.key, got, err, c.want)
			continue
		}
		// containerd's and the CRI's parsers, and nerdctl's normalization,
		// keep it as it is.
		n, err := reference.ParseNormalizedNamed(got)
		if err != nil || n.String() != got {
			t.Errorf("%q does not parse as itself: %v, %v", got, n, err)
		}
	}
	if _, err := DefaultRef("___", "___/"); err == nil || !strings.Contains(err.Error(), "--name") {
		t.Errorf("a key with nothing usable: %v, want an error asking for --name", err)
	}
}
