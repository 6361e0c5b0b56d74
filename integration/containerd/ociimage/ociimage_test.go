package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

const testName = "docker.io/flyio-test/busybox:v1"

func writeImage(t *testing.T, opts Options) ([]byte, Image) {
	t.Helper()
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Fatalf("this test builds its image from a static busybox at /bin/busybox (Debian package busybox-static): %v", err)
	}
	var buf bytes.Buffer
	img, err := Write(&buf, opts)
	if err != nil {
		t.Fatalf("Write(%+v): %v", opts, err)
	}
	return buf.Bytes(), img
}

// TestContainerdImportsArchive checks the archive the way containerd reads
// it: its own OCI archive importer into a real content store, then the
// image's manifest, config and layers resolved through containerd's images
// package for linux/amd64.
func TestContainerdImportsArchive(t *testing.T) {
	ctx := context.Background()
	data, img := writeImage(t, Options{Name: testName, PayloadBytes: 4096})

	store, err := local.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	idx, err := archive.ImportIndex(ctx, store, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("containerd's ImportIndex rejected the archive: %v", err)
	}
	ib, err := content.ReadBlob(ctx, store, idx)
	if err != nil {
		t.Fatalf("read imported index: %v", err)
	}
	var index ocispec.Index
	if err := json.Unmarshal(ib, &index); err != nil {
		t.Fatalf("imported index: %v", err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("imported index has %d manifests, want 1", len(index.Manifests))
	}
	got := index.Manifests[0]
	if got.Digest != img.Manifest.Digest {
		t.Errorf("manifest digest %s, Write reported %s", got.Digest, img.Manifest.Digest)
	}
	if name := got.Annotations[images.AnnotationImageName]; name != testName {
		t.Errorf("image name annotation %q, want %q", name, testName)
	}

	m, err := images.Manifest(ctx, store, got, platforms.Only(platforms.MustParse("linux/amd64")))
	if err != nil {
		t.Fatalf("containerd cannot resolve the linux/amd64 manifest: %v", err)
	}
	diffIDs, err := images.RootFS(ctx, store, m.Config)
	if err != nil {
		t.Fatalf("containerd cannot read the config's diff ids: %v", err)
	}
	if len(diffIDs) != 2 || len(m.Layers) != 2 {
		t.Fatalf("got %d diff ids and %d layers, want 2 and 2", len(diffIDs), len(m.Layers))
	}
	// Each layer blob, decompressed, must hash to its diff id.
	for i, l := range m.Layers {
		blob, err := content.ReadBlob(ctx, store, l)
		if err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		raw := blob
		if l.MediaType == ocispec.MediaTypeImageLayerGzip {
			zr, err := gzip.NewReader(bytes.NewReader(blob))
			if err != nil {
				t.Fatalf("layer %d: gzip: %v", i, err)
			}
			if raw, err = io.ReadAll(zr); err != nil {
				t.Fatalf("layer %d: gunzip: %v", i, err)
			}
		}
		if d := digest.FromBytes(raw); d != diffIDs[i] {
			t.Errorf("layer %d uncompressed digest %s, config diff id %s", i, d, diffIDs[i])
		}
	}
	if img.ChainIDs[0] != diffIDs[0] || img.ChainIDs[1] == diffIDs[1] {
		t.Errorf("chain ids %v look wrong for diff ids %v", img.ChainIDs, diffIDs)
	}
}

// TestLayerContents checks the files a container relies on: busybox and its
// applets in the first layer, the marker and the whiteout in the second.
func TestLayerContents(t *testing.T) {
	lower, err := layerOne([]byte("not really busybox"), []string{"sh", "echo"}, true)
	if err != nil {
		t.Fatal(err)
	}
	upper, err := layerTwo(10, "", true)
	if err != nil {
		t.Fatal(err)
	}
	lowerNames := tarNames(t, lower)
	for _, want := range []string{"bin/busybox", "bin/sh", "bin/echo", "etc/deleted-by-layer-two"} {
		if _, ok := lowerNames[want]; !ok {
			t.Errorf("layer one lacks %q (has %v)", want, lowerNames)
		}
	}
	if h := lowerNames["bin/sh"]; h != nil && (h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox") {
		t.Errorf("bin/sh is %c -> %q, want a symlink to busybox", h.Typeflag, h.Linkname)
	}
	if h := lowerNames["lib"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/lib" {
		t.Errorf("layer one's lib is %+v, want a symlink to usr/lib", h)
	}
	upperNames := tarNames(t, upper)
	for _, want := range []string{"etc/flyio-marker", "etc/.wh.deleted-by-layer-two", "opt/payload.bin"} {
		if _, ok := upperNames[want]; !ok {
			t.Errorf("layer two lacks %q (has %v)", want, upperNames)
		}
	}
	if h := upperNames[DevicePath[1:]]; h == nil || h.Typeflag != tar.TypeChar || h.Devmajor != 1 || h.Devminor != 3 {
		t.Errorf("layer two's %s is %+v, want the character device 1:3", DevicePath, h)
	}
	if _, ok := upperNames["lib/"+ThroughSymlinkFile]; !ok {
		t.Errorf("layer two lacks lib/%s", ThroughSymlinkFile)
	}
	if h := upperNames[LowerLinkPath[1:]]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "bin/busybox" {
		t.Errorf("layer two's %s is %+v, want a hard link to layer one's bin/busybox", LowerLinkPath, h)
	}
	if plain, err := layerTwo(10, "", false); err != nil || bytes.Equal(plain, upper) {
		t.Errorf("layer two without Specials: %v, or the same bytes as with them", err)
	}
}

// TestDeterministic checks that two writes of the same options are byte for
// byte identical, so repeated imports in a benchmark import the same blobs.
func TestDeterministic(t *testing.T) {
	a, ia := writeImage(t, Options{Name: testName, PayloadBytes: 1 << 16})
	b, ib := writeImage(t, Options{Name: testName, PayloadBytes: 1 << 16})
	if !bytes.Equal(a, b) || ia.Manifest.Digest != ib.Manifest.Digest {
		t.Fatalf("two writes differ: manifests %s and %s", ia.Manifest.Digest, ib.Manifest.Digest)
	}
}

func TestNameRequired(t *testing.T) {
	if _, err := Write(io.Discard, Options{}); err == nil {
		t.Fatal("Write without a name succeeded")
	}
}

func tarNames(t *testing.T, b []byte) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		out[h.Name] = h
	}
}

// TestCmd checks the default command recorded in the image config, as
// containerd reads it: /bin/sh unless Options.Cmd says otherwise.
func TestCmd(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cmd, want []string
	}{
		{nil, []string{"/bin/sh"}},
		{[]string{"/bin/sleep", "86400"}, []string{"/bin/sleep", "86400"}},
	} {
		data, img := writeImage(t, Options{Name: testName, Applets: []string{"sh", "sleep"}, Cmd: tc.cmd})
		store, err := local.NewStore(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := archive.ImportIndex(ctx, store, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		b, err := content.ReadBlob(ctx, store, img.Config)
		if err != nil {
			t.Fatal(err)
		}
		var cfg ocispec.Image
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		if got := cfg.Config.Cmd; !slices.Equal(got, tc.want) {
			t.Errorf("Options.Cmd %q: config Cmd %q, want %q", tc.cmd, got, tc.want)
		}
	}
}

// TestPayloadSeed: a seed makes the payload, and so layer two, its own
// (the same seed, the same bytes; another seed, other bytes), and leaves
// the default payload as it was.
func TestPayloadSeed(t *testing.T) {
	layer := func(seed string) []byte {
		t.Helper()
		b, err := layerTwo(4096, seed, false)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !bytes.Equal(layer("a"), layer("a")) || !bytes.Equal(layer(""), layer("")) {
		t.Error("the same seed made two different layers")
	}
	if bytes.Equal(layer("a"), layer("b")) || bytes.Equal(layer("a"), layer("")) {
		t.Error("two seeds made the same layer")
	}
}
