// Package ociimage writes a small, deterministic OCI image archive (an OCI
// image layout packed in a tar stream) that `ctr image import` and
// containerd's transfer service accept. The integration tests build their
// test image with it at test time: no registry, no network, no committed
// blobs.
//
// The image's root filesystem is a static busybox with applet symlinks, in
// two layers: the first (gzip) holds busybox and the directory skeleton, the
// second (plain tar) adds a marker file, an optional deterministic payload,
// and an OCI whiteout removing a file of the first layer.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Paths inside the image that tests can check from a running container.
const (
	// MarkerPath is a file added by the second layer; its content is
	// MarkerContent.
	MarkerPath = "/etc/flyio-marker"
	// MarkerContent is the exact content of MarkerPath.
	MarkerContent = "layer two was applied\n"
	// WhiteoutVictim is a file of the first layer that the second layer
	// deletes with an OCI whiteout: it must not exist in a container.
	WhiteoutVictim = "/etc/deleted-by-layer-two"
	// PayloadPath holds Options.PayloadBytes of deterministic bytes when
	// PayloadBytes > 0.
	PayloadPath = "/opt/payload.bin"
)

// DefaultApplets are the busybox applets linked into /bin when
// Options.Applets is empty.
var DefaultApplets = []string{"sh", "echo", "cat", "ls", "test", "mkdir", "sleep", "rm", "sync", "true", "wc", "md5sum"}

// Options describe the image to write.
type Options struct {
	// Name is the full image reference recorded in index.json (annotation
	// io.containerd.image.name), e.g. "docker.io/flyio-test/busybox:v1".
	// Required.
	Name string
	// BusyboxPath is a statically linked busybox on the host; default
	// /bin/busybox.
	BusyboxPath string
	// Applets are the names symlinked to busybox in /bin; default
	// DefaultApplets.
	Applets []string
	// PayloadBytes, when > 0, adds PayloadPath with this many bytes from a
	// fixed-seed generator (same bytes every run) to the second layer, to
	// make the image bigger.
	PayloadBytes int64
	// PayloadSeed, when set, seeds the payload's generator in place of the
	// fixed seed, which then writes a block at a time (many times faster
	// under emulation than the default's byte at a time): images of
	// different seeds differ in their second layer, so each has its own
	// chain.
	PayloadSeed string
	// Platform is recorded in the config; default linux/amd64.
	Platform ocispec.Platform
	// Cmd is the image's default command; default ["/bin/sh"]. A pod's
	// sandbox ("pause") image needs one that does not exit, such as
	// ["/bin/sleep", "86400"] with the sleep applet.
	Cmd []string
	// Specials adds to the second layer a character device at DevicePath
	// (1:3, as /dev/null), a hard link at LowerLinkPath to the first
	// layer's /bin/busybox, and a file written as lib/ThroughSymlinkFile
	// over the first layer's symlink lib -> usr/lib (a merged /usr), so
	// that it lands in ThroughSymlinkPath: entries containerd's own applier
	// takes and the extraction policy of S3 images refuses.
	Specials bool
}

// Where Options.Specials puts its entries.
const (
	DevicePath         = "/opt/null"
	LowerLinkPath      = "/bin/busybox.link"
	ThroughSymlinkFile = "specials.txt"
	ThroughSymlinkPath = "/usr/lib/" + ThroughSymlinkFile
)

// Image describes what Write wrote.
type Image struct {
	// Name is Options.Name.
	Name string
	// Index, Manifest and Config are the descriptors written.
	Index, Manifest, Config ocispec.Descriptor
	// Layers are the layer descriptors, lowest first.
	Layers []ocispec.Descriptor
	// DiffIDs are the uncompressed layer digests, lowest first.
	DiffIDs []digest.Digest
	// ChainIDs are the OCI chain ids of the layers, lowest first: the
	// names containerd's unpacker gives the committed snapshots.
	ChainIDs []digest.Digest
}

// fixedTime keeps every timestamp, and so every digest, stable across runs.
var fixedTime = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Write writes the OCI archive of the image described by opts to w.
func Write(w io.Writer, opts Options) (Image, error) {
	if opts.Name == "" {
		return Image{}, fmt.Errorf("ociimage: Options.Name is required (a full reference such as docker.io/x/y:tag)")
	}
	if opts.BusyboxPath == "" {
		opts.BusyboxPath = "/bin/busybox"
	}
	if len(opts.Applets) == 0 {
		opts.Applets = DefaultApplets
	}
	if len(opts.Cmd) == 0 {
		opts.Cmd = []string{"/bin/sh"}
	}
	if opts.Platform.OS == "" {
		opts.Platform = ocispec.Platform{OS: "linux", Architecture: "amd64"}
	}
	busybox, err := os.ReadFile(opts.BusyboxPath)
	if err != nil {
		return Image{}, fmt.Errorf("ociimage: read busybox %q: %w", opts.BusyboxPath, err)
	}

	lower, err := layerOne(busybox, opts.Applets, opts.Specials)
	if err != nil {
		return Image{}, err
	}
	upper, err := layerTwo(opts.PayloadBytes, opts.PayloadSeed, opts.Specials)
	if err != nil {
		return Image{}, err
	}
	gzLower, err := gzipBytes(lower)
	if err != nil {
		return Image{}, err
	}

	img := Image{Name: opts.Name}
	blobs := map[digest.Digest][]byte{}
	addBlob := func(mediaType string, b []byte) ocispec.Descriptor {
		d := digest.FromBytes(b)
		blobs[d] = b
		return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
	}
	img.Layers = []ocispec.Descriptor{
		addBlob(ocispec.MediaTypeImageLayerGzip, gzLower),
		addBlob(ocispec.MediaTypeImageLayer, upper),
	}
	// The upper layer is stored uncompressed: its diff ID is its digest
	// (hashing its payload again costs seconds under emulation).
	img.DiffIDs = []digest.Digest{digest.FromBytes(lower), img.Layers[1].Digest}
	img.ChainIDs = chainIDs(img.DiffIDs)

	created := fixedTime
	cfg := ocispec.Image{
		Created:  &created,
		Platform: opts.Platform,
		Config: ocispec.ImageConfig{
			Env:        []string{"PATH=/bin"},
			Cmd:        opts.Cmd,
			WorkingDir: "/",
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: img.DiffIDs},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return Image{}, fmt.Errorf("ociimage: marshal config: %w", err)
	}
	img.Config = addBlob(ocispec.MediaTypeImageConfig, cfgJSON)

	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    img.Config,
		Layers:    img.Layers,
	}
	manJSON, err := json.Marshal(manifest)
	if err != nil {
		return Image{}, fmt.Errorf("ociimage: marshal manifest: %w", err)
	}
	img.Manifest = addBlob(ocispec.MediaTypeImageManifest, manJSON)
	platform := opts.Platform
	img.Manifest.Platform = &platform
	img.Manifest.Annotations = map[string]string{
		"io.containerd.image.name": opts.Name,
		ocispec.AnnotationRefName:  refTag(opts.Name),
	}

	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{img.Manifest},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return Image{}, fmt.Errorf("ociimage: marshal index: %w", err)
	}
	img.Index = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(indexJSON), Size: int64(len(indexJSON))}
	layoutJSON, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return Image{}, fmt.Errorf("ociimage: marshal oci-layout: %w", err)
	}

	tw := tar.NewWriter(w)
	if err := writeDir(tw, "blobs/"); err != nil {
		return Image{}, err
	}
	if err := writeDir(tw, "blobs/sha256/"); err != nil {
		return Image{}, err
	}
	// Blobs first, in a fixed order, then the layout files.
	for _, d := range []ocispec.Descriptor{img.Layers[0], img.Layers[1], img.Config, img.Manifest} {
		if err := writeFile(tw, "blobs/sha256/"+d.Digest.Encoded(), blobs[d.Digest], 0o644); err != nil {
			return Image{}, err
		}
	}
	if err := writeFile(tw, ocispec.ImageLayoutFile, layoutJSON, 0o644); err != nil {
		return Image{}, err
	}
	if err := writeFile(tw, ocispec.ImageIndexFile, indexJSON, 0o644); err != nil {
		return Image{}, err
	}
	if err := tw.Close(); err != nil {
		return Image{}, fmt.Errorf("ociimage: close archive: %w", err)
	}
	return img, nil
}

// refTag returns the tag of a reference ("latest" when it has none), the
// value OCI layouts carry in org.opencontainers.image.ref.name.
func refTag(name string) string {
	for i := len(name) - 1; i >= 0; i-- {
		switch name[i] {
		case ':':
			return name[i+1:]
		case '/':
			return "latest"
		}
	}
	return "latest"
}

// chainIDs computes the OCI chain ids of diffIDs.
func chainIDs(diffIDs []digest.Digest) []digest.Digest {
	out := make([]digest.Digest, len(diffIDs))
	for i, d := range diffIDs {
		if i == 0 {
			out[i] = d
			continue
		}
		out[i] = digest.FromString(out[i-1].String() + " " + d.String())
	}
	return out
}

func layerOne(busybox []byte, applets []string, specials bool) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"bin/", "dev/", "etc/", "proc/", "sys/", "tmp/", "opt/", "root/", "run/"} {
		if err := writeDir(tw, d); err != nil {
			return nil, err
		}
	}
	if err := writeFile(tw, "bin/busybox", busybox, 0o755); err != nil {
		return nil, err
	}
	for _, a := range applets {
		hdr := &tar.Header{Typeflag: tar.TypeSymlink, Name: path.Join("bin", a), Linkname: "busybox", Mode: 0o777, ModTime: fixedTime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("ociimage: layer one: applet %q: %w", a, err)
		}
	}
	if err := writeFile(tw, "etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		return nil, err
	}
	if err := writeFile(tw, "etc/group", []byte("root:x:0:\n"), 0o644); err != nil {
		return nil, err
	}
	if err := writeFile(tw, WhiteoutVictim[1:], []byte("the second layer deletes this file\n"), 0o644); err != nil {
		return nil, err
	}
	if specials {
		if err := writeDir(tw, "usr/"); err != nil {
			return nil, err
		}
		if err := writeDir(tw, "usr/lib/"); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "lib", Linkname: "usr/lib", Mode: 0o777, ModTime: fixedTime, Format: tar.FormatPAX}); err != nil {
			return nil, fmt.Errorf("ociimage: layer one: lib: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: layer one: %w", err)
	}
	return buf.Bytes(), nil
}

func layerTwo(payload int64, seed string, specials bool) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := writeDir(tw, "etc/"); err != nil {
		return nil, err
	}
	if specials {
		for _, hdr := range []*tar.Header{
			{Typeflag: tar.TypeChar, Name: DevicePath[1:], Devmajor: 1, Devminor: 3, Mode: 0o666, ModTime: fixedTime, Format: tar.FormatPAX},
			{Typeflag: tar.TypeLink, Name: LowerLinkPath[1:], Linkname: "bin/busybox", Mode: 0o755, ModTime: fixedTime, Format: tar.FormatPAX},
		} {
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, fmt.Errorf("ociimage: layer two: %s: %w", hdr.Name, err)
			}
		}
		if err := writeFile(tw, "lib/"+ThroughSymlinkFile, []byte(ThroughSymlinkFile+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	if err := writeFile(tw, MarkerPath[1:], []byte(MarkerContent), 0o644); err != nil {
		return nil, err
	}
	dir, base := path.Split(WhiteoutVictim[1:])
	if err := writeFile(tw, dir+".wh."+base, nil, 0o644); err != nil {
		return nil, err
	}
	if payload > 0 {
		if err := writeDir(tw, "opt/"); err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: PayloadPath[1:], Size: payload, Mode: 0o644, ModTime: fixedTime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("ociimage: layer two: payload header: %w", err)
		}
		var src io.Reader
		if seed == "" {
			rng := rand.New(rand.NewChaCha8([32]byte{'f', 'l', 'y', 'i', 'o'}))
			src = readerFunc(func(p []byte) (int, error) {
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				return len(p), nil
			})
		} else {
			var key [32]byte
			copy(key[:], seed)
			src = rand.NewChaCha8(key)
		}
		if _, err := io.CopyN(tw, src, payload); err != nil {
			return nil, fmt.Errorf("ociimage: layer two: payload: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: layer two: %w", err)
	}
	return buf.Bytes(), nil
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func writeDir(tw *tar.Writer, name string) error {
	hdr := &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: fixedTime, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("ociimage: directory %q: %w", name, err)
	}
	return nil
}

func writeFile(tw *tar.Writer, name string, data []byte, mode int64) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: mode, ModTime: fixedTime, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("ociimage: file %q: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("ociimage: file %q: %w", name, err)
	}
	return nil
}

func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return nil, fmt.Errorf("ociimage: gzip: %w", err)
	}
	zw.ModTime = fixedTime
	if _, err := zw.Write(b); err != nil {
		return nil, fmt.Errorf("ociimage: gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: gzip: %w", err)
	}
	return buf.Bytes(), nil
}
