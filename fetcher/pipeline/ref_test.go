package pipeline

import (
	"strings"
	"testing"

	"github.com/distribution/reference"
)

// TestDefaultRef: an image pulled without --name gets a name containerd,
// nerdctl and the CRI accept, derived from its bucket and key: a prefix
// already spelled as a reference path keeps the name it always had; any
// other source is tagged with its image id.
func TestDefaultRef(t *testing.T) {
	id := func(bucket, key string) string { _, id := imageSource(bucket, key); return id }
	cases := []struct{ bucket, key, want string }{
		{"flyio-images", "images/debian/", "s3.local/flyio-images/images/debian:latest"},
		{"flyio-images", "images/debian", "s3.local/flyio-images/images/debian:latest"},
		{"my.bucket", "a_b/c.d-e/", "s3.local/my.bucket/a_b/c.d-e:latest"},
		{"flyio-images", "images/single.tar", "s3.local/flyio-images/images/single:" + id("flyio-images", "images/single.tar")},
		{"my.bucket", "Images/App v2/", "s3.local/my.bucket/images/app-v2:" + id("my.bucket", "Images/App v2/")},
		{"b", "a//__x..y--z/__/", "s3.local/b/a/x-y-z:" + id("b", "a//__x..y--z/__/")},
		{"b", "layers/1.tar", "s3.local/b/layers/1:" + id("b", "layers/1.tar")},
		{"b", "layers/app.tar.gz", "s3.local/b/layers/app:" + id("b", "layers/app.tar.gz")},
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
	// A path too long for a reference is cut; the tag still tells it.
	long := strings.Repeat("abcdefghij/", 30)
	got, err := DefaultRef("b", long)
	if err != nil || !strings.HasSuffix(got, ":"+id("b", long)) {
		t.Errorf("DefaultRef of a %d-character prefix = %q, %v; want a name tagged with its image id", len(long), got, err)
	}
	if _, err := reference.ParseNormalizedNamed(got); err != nil {
		t.Errorf("%q: %v", got, err)
	}
}

// TestDefaultRefUnique: sources the readable form confuses (case,
// separators, empty components, a layer key and its prefix, one key
// stored plain and compressed) get distinct default names, and no default
// name of one source is the default name of another.
func TestDefaultRefUnique(t *testing.T) {
	keys := []string{"app/", "App/", "APP/", "app.tar", "app.tar.gz", "app.tar.zst", "App.tar", "a-pp/", "a_pp/", "a--pp/",
		"x/app/", "x//app/", "x/app.tar", "X/app/", "app-s3/", "app/app/"}
	by := map[string]string{}
	for _, k := range keys {
		name, err := DefaultRef("b", k)
		if err != nil {
			t.Fatalf("DefaultRef(b, %q): %v", k, err)
		}
		if other, ok := by[name]; ok {
			t.Errorf("s3://b/%s and s3://b/%s are both named %s", other, k, name)
		}
		by[name] = k
	}
	// One source spelled two ways (a prefix with or without its '/') is one
	// image, so one name.
	a, _ := DefaultRef("b", "app")
	b, _ := DefaultRef("b", "app/")
	if a != b {
		t.Errorf("s3://b/app and s3://b/app/ (one prefix) are named %s and %s", a, b)
	}
}

// TestCheckName: an explicit name must be a reference without digest; the
// error names the name and the rule.
func TestCheckName(t *testing.T) {
	for _, ok := range []string{"app", "app:v1", "docker.io/library/app:latest", "registry.example:5000/a/b:1.0", "s3.local/b/x:latest", "localhost/app"} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q): %v", ok, err)
		}
	}
	for _, c := range []struct{ name, rule string }{
		{"", "must not be empty"},
		{"App", "must be lowercase"},
		{"app v2", "invalid reference format"},
		{"s3://b/app/", "invalid reference format"},
		{"app:", "invalid reference format"},
		{"app:-x", "invalid reference format"},
		{"a/" + strings.Repeat("x", 260), "repository name must not be more than 255 characters"},
		{"app@sha256:" + strings.Repeat("a", 64), "must not carry a digest"},
		{strings.Repeat("a", 64), "64-byte hexadecimal"},
	} {
		err := CheckName(c.name)
		if err == nil || !strings.Contains(err.Error(), c.rule) || !strings.Contains(err.Error(), "image name \""+c.name+"\"") {
			t.Errorf("CheckName(%q) = %v; want an error naming it and %q", c.name, err, c.rule)
		}
	}
}
