//go:build dm

package pullbench

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// markerPath is the file the top layer of every bench image adds; a
// container run on a pulled image prints it (markerContent).
const markerPath = "/etc/pullbench-marker"

// applets are the busybox applets linked into /bin of the base layer.
var applets = []string{"sh", "cat", "ls", "echo", "true"}

// fixedTime keeps every timestamp, so every digest, the same across runs.
var fixedTime = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// imageSpec describes one bench image: its name (the registry repository
// pullbench/<name> and the S3 prefix images/<name>/) and the unpacked
// size of each layer in MB, lowest first. The first layer holds busybox
// and the directories the daemon wants on top of an image (etc, usr,
// var); the last adds markerPath.
type imageSpec struct {
	name     string
	layersMB []int
}

// layerFile is one generated layer: the tar and its gzip, side by side.
type layerFile struct {
	tarPath, gzPath string
	tarSize, gzSize int64
	diffID, digest  digest.Digest
	files           int // regular files in the tar
}

// benchImage is a generated image: its layers, config and manifest.
type benchImage struct {
	spec     imageSpec
	layers   []layerFile
	config   []byte
	manifest []byte
}

// markerContent is what markerPath holds in img.
func markerContent(name string, layers int) string {
	return fmt.Sprintf("pullbench image %s: %d layers applied\n", name, layers)
}

func (i *benchImage) tarBytes() (n int64) {
	for _, l := range i.layers {
		n += l.tarSize
	}
	return n
}

func (i *benchImage) gzBytes() (n int64) {
	for _, l := range i.layers {
		n += l.gzSize
	}
	return n
}

func (i *benchImage) files() (n int) {
	for _, l := range i.layers {
		n += l.files
	}
	return n
}

// s3Key is the object key of layer n (0-based) of the image: in key
// order, as pull takes a prefix's layers.
func (i *benchImage) s3Key(n int) string {
	return fmt.Sprintf("images/%s/%d.tar.gz", i.spec.name, n+1)
}

// corpus is the material files are cut from: a run of text-like lines
// (words of a made-up vocabulary, so gzip finds what it finds in source
// code and configuration) and a run of random bytes (compiled code and
// compressed assets, which gzip cannot shrink). Cutting files from
// pregenerated runs keeps the generator cheap under emulation; gzip's
// 32 KiB window never sees the repetition between files.
type corpus struct {
	text, random []byte
}

func newCorpus(seed uint64) corpus {
	rng := rand.New(rand.NewPCG(seed, 1))
	words := make([]string, 400)
	const letters = "abcdefghijklmnopqrstuvwxyz_"
	for i := range words {
		b := make([]byte, 2+rng.IntN(9))
		for j := range b {
			b[j] = letters[rng.IntN(len(letters))]
		}
		words[i] = string(b)
	}
	punct := []string{" ", " ", " ", " = ", "(", ") ", ", ", ".", ": ", "/"}
	text := make([]byte, 0, 4<<20)
	for len(text) < 4<<20 {
		text = append(text, "    "[:rng.IntN(5)]...)
		for n := 3 + rng.IntN(10); n > 0; n-- {
			// A Zipf-like choice: a few words are very common.
			w := words[int(float64(len(words))*rng.Float64()*rng.Float64()*rng.Float64())]
			text = append(text, w...)
			text = append(text, punct[rng.IntN(len(punct))]...)
		}
		text = append(text, '\n')
	}
	random := make([]byte, 4<<20)
	cc := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 'p', 'b'})
	_, _ = cc.Read(random)
	return corpus{text: text, random: random}
}

// fileSize draws a file size: mostly small files, some medium, a few large
// ones (about 35 KB on average, so 100 MB is about 3,000 files).
func fileSize(rng *rand.Rand) int {
	switch p := rng.IntN(100); {
	case p < 75:
		return 256 + rng.IntN(16<<10)
	case p < 97:
		return 16<<10 + rng.IntN(80<<10)
	default:
		return 96<<10 + rng.IntN(928<<10)
	}
}

// hashCount counts and hashes what is written through it.
type hashCount struct {
	h hash.Hash
	n int64
}

func (c *hashCount) Write(p []byte) (int, error) {
	c.h.Write(p)
	c.n += int64(len(p))
	return len(p), nil
}

// writeLayer writes layer n of img into dir as <n>.tar and, for the S3
// prefix, s3dir/<s3Key>: about mb MB of files (deterministic for the
// image's name and n), plus busybox when base and markerPath when top.
func writeLayer(img imageSpec, n int, mb int, base, top bool, dir, s3dir string, c corpus) (layerFile, error) {
	lf := layerFile{tarPath: filepath.Join(dir, fmt.Sprintf("%s-%d.tar", img.name, n+1))}
	lf.gzPath = filepath.Join(s3dir, "images", img.name, fmt.Sprintf("%d.tar.gz", n+1))
	for _, d := range []string{dir, filepath.Dir(lf.gzPath)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return lf, err
		}
	}
	tf, err := os.Create(lf.tarPath)
	if err != nil {
		return lf, err
	}
	defer tf.Close()
	gf, err := os.Create(lf.gzPath)
	if err != nil {
		return lf, err
	}
	defer gf.Close()
	gzSum := &hashCount{h: sha256.New()}
	gw := gzip.NewWriter(io.MultiWriter(gf, gzSum))
	tarSum := &hashCount{h: sha256.New()}
	tw := tar.NewWriter(io.MultiWriter(tf, tarSum, gw))

	hdr := func(h *tar.Header) error {
		h.ModTime, h.Format = fixedTime, tar.FormatPAX
		return tw.WriteHeader(h)
	}
	dirEntry := func(name string) error {
		return hdr(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			return err
		}
		lf.files++
		_, err := tw.Write(data)
		return err
	}
	if base {
		bb, err := os.ReadFile("/bin/busybox")
		if err != nil {
			return lf, fmt.Errorf("the static busybox of the containers: %w", err)
		}
		for _, d := range []string{"bin", "etc", "tmp", "usr", "usr/share", "var", "var/lib"} {
			if err := dirEntry(d); err != nil {
				return lf, err
			}
		}
		if err := file("bin/busybox", 0o755, bb); err != nil {
			return lf, err
		}
		for _, a := range applets {
			if err := hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}); err != nil {
				return lf, err
			}
		}
	}
	rng := rand.New(rand.NewPCG(uint64(len(img.name))<<32|uint64(img.name[0])<<16|uint64(n), 7))
	root := fmt.Sprintf("usr/share/pb%d", n+1)
	if err := dirEntry(root); err != nil {
		return lf, err
	}
	var written int64
	for i := 0; written < int64(mb)*1_000_000; i++ {
		if i%40 == 0 {
			if err := dirEntry(fmt.Sprintf("%s/d%03d", root, i/40)); err != nil {
				return lf, err
			}
		}
		size := fileSize(rng)
		src, ext := c.text, "txt"
		if rng.IntN(100) < 6 {
			src, ext = c.random, "bin"
		}
		off := rng.IntN(len(src) - size)
		if err := file(fmt.Sprintf("%s/d%03d/f%05d.%s", root, i/40, i, ext), 0o644, src[off:off+size]); err != nil {
			return lf, err
		}
		written += int64(size)
	}
	if top {
		if err := file(markerPath[1:], 0o644, []byte(markerContent(img.name, len(img.layersMB)))); err != nil {
			return lf, err
		}
	}
	if err := tw.Close(); err != nil {
		return lf, err
	}
	if err := gw.Close(); err != nil {
		return lf, err
	}
	if err := tf.Close(); err != nil {
		return lf, err
	}
	if err := gf.Close(); err != nil {
		return lf, err
	}
	lf.tarSize, lf.gzSize = tarSum.n, gzSum.n
	lf.diffID = digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(tarSum.h.Sum(nil)))
	lf.digest = digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(gzSum.h.Sum(nil)))
	return lf, nil
}

// writeImage generates spec's layers (the tars under dir, the gzips under
// s3dir/images/<name>/) and its OCI config and manifest.
func writeImage(spec imageSpec, dir, s3dir string, c corpus) (*benchImage, error) {
	img := &benchImage{spec: spec}
	for n, mb := range spec.layersMB {
		lf, err := writeLayer(spec, n, mb, n == 0, n == len(spec.layersMB)-1, dir, s3dir, c)
		if err != nil {
			return nil, fmt.Errorf("image %s layer %d: %w", spec.name, n+1, err)
		}
		img.layers = append(img.layers, lf)
	}
	created := fixedTime
	cfg := ocispec.Image{
		Created:  &created,
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Config:   ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"/bin/sh"}, WorkingDir: "/"},
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	for _, l := range img.layers {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.diffID)
	}
	var err error
	if img.config, err = json.Marshal(cfg); err != nil {
		return nil, err
	}
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(img.config), Size: int64(len(img.config))},
	}
	for _, l := range img.layers {
		m.Layers = append(m.Layers, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: l.digest, Size: l.gzSize})
	}
	if img.manifest, err = json.Marshal(m); err != nil {
		return nil, err
	}
	return img, nil
}
