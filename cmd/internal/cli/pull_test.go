package cli

import (
	"strings"
	"testing"
)

// TestPullImageArgument: pull takes an s3:// URL, or a bare path that the
// daemon resolves under its s3.bucket and s3.prefix (so the CLI sends no
// bucket).
func TestPullImageArgument(t *testing.T) {
	for _, c := range []struct {
		arg, bucket, key, err string
	}{
		{"s3://my-images/debian/", "my-images", "debian/", ""},
		{"debian/", "", "debian/", ""},
		{"base/1.tar", "", "base/1.tar", ""},
		{"/debian/", "", "", "without a leading '/'"},
		{"s3://only-bucket", "", "", "must name a bucket and a key"},
		{"http://x/y", "", "", "must be s3://"},
	} {
		bucket, key, err := parseImageArg(c.arg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %q %q %v, want an error with %q", c.arg, bucket, key, err, c.err)
			}
			continue
		}
		if err != nil || bucket != c.bucket || key != c.key {
			t.Errorf("%q: %q %q %v, want %q %q", c.arg, bucket, key, err, c.bucket, c.key)
		}
	}
}
