//go:build dm

package clients

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/containerd/ociimage"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

const (
	// s3Bucket is the bucket of the S3 images, served by versitygw.
	s3Bucket = "flyio-s3"
	// s3NerdctlNS is the namespace nerdctl runs the S3 image in.
	s3NerdctlNS = "flyio-s3-nerdctl"
	// s3LayerPath is a file of the S3 images' own third layer.
	s3LayerPath    = "/etc/s3-layer"
	s3LayerContent = "stored in S3\n"
	// cappedPath is a file of the third layer carrying a file capability.
	cappedPath = "/usr/bin/capped"
	// cappedCapability is cap_net_raw+ep as setcap writes it (the kernel's
	// VFS_CAP_REVISION_2 format).
	cappedCapability = "\x01\x00\x00\x02" + "\x00\x20\x00\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00"
)

// s3Image is one image of the bucket: its prefix and how its layers are
// stored.
type s3Image struct {
	prefix string // under images/
	suffix string // .tar, .tar.gz, .tar.zst
}

var s3Images = []s3Image{{"s3img-gz", ".tar.gz"}, {"s3img-zst", ".tar.zst"}, {"s3img-plain", ".tar"}}

func (i s3Image) source() string { return "s3://" + s3Bucket + "/images/" + i.prefix + "/" }

// defaultRef is the name pull gives the image without --name.
func (i s3Image) defaultRef() string {
	return "s3.local/" + s3Bucket + "/images/" + i.prefix + ":latest"
}

// plainLayers returns the uncompressed layer tarballs of an OCI archive as
// ociimage.Write makes it, lowest first.
func plainLayers(archive []byte) ([][]byte, error) {
	files, index, err := stack.ReadOCIArchive(archive)
	if err != nil {
		return nil, err
	}
	blob := func(d ocispec.Descriptor) []byte { return files["blobs/sha256/"+d.Digest.Encoded()] }
	var m ocispec.Manifest
	if err := json.Unmarshal(blob(index.Manifests[0]), &m); err != nil {
		return nil, fmt.Errorf("OCI archive manifest: %w", err)
	}
	var out [][]byte
	for _, l := range m.Layers {
		b := blob(l)
		if strings.HasSuffix(l.MediaType, "+gzip") {
			zr, err := gzip.NewReader(bytes.NewReader(b))
			if err != nil {
				return nil, err
			}
			if b, err = io.ReadAll(zr); err != nil {
				return nil, err
			}
		}
		out = append(out, b)
	}
	return out, nil
}

// s3ThirdLayer is the S3 images' own top layer: the directories the
// daemon's layout check wants (usr, var), a file naming where the image
// came from, and a file with a capability.
func s3ThirdLayer() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "usr/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "usr/bin/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "var/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: s3LayerPath[1:], Mode: 0o644, Size: int64(len(s3LayerContent))},
		{Typeflag: tar.TypeReg, Name: cappedPath[1:], Mode: 0o755, Size: 3, Format: tar.FormatPAX,
			PAXRecords: map[string]string{"SCHILY.xattr.security.capability": cappedCapability}},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		switch h.Name {
		case s3LayerPath[1:]:
			io.WriteString(tw, s3LayerContent)
		case cappedPath[1:]:
			io.WriteString(tw, "cap")
		}
	}
	err := tw.Close()
	return buf.Bytes(), err
}

// writeS3Images writes the three S3 images under root/images: the same
// three layers (the registry image's two, uncompressed, and s3ThirdLayer)
// stored gzip-compressed, zstd-compressed and plain.
func writeS3Images(root string, archive []byte) (diffIDs []string, err error) {
	layers, err := plainLayers(archive)
	if err != nil {
		return nil, err
	}
	third, err := s3ThirdLayer()
	if err != nil {
		return nil, err
	}
	layers = append(layers, third)
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		return nil, err
	}
	defer zw.Close()
	for _, l := range layers {
		sum := sha256.Sum256(l)
		diffIDs = append(diffIDs, "sha256:"+hex.EncodeToString(sum[:]))
	}
	for _, img := range s3Images {
		dir := filepath.Join(root, "images", img.prefix)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		for i, l := range layers {
			b := l
			switch img.suffix {
			case ".tar.gz":
				var buf bytes.Buffer
				gw := gzip.NewWriter(&buf)
				gw.Write(l)
				gw.Close()
				b = buf.Bytes()
			case ".tar.zst":
				b = zw.EncodeAll(l, nil)
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d%s", i+1, img.suffix)), b, 0o644); err != nil {
				return nil, err
			}
		}
	}
	return diffIDs, nil
}

// startS3 starts versitygw with the bucket of the S3 images; our daemon
// reads it anonymously (public-read policy).
func (e *env) startS3(ctx context.Context, archive []byte) error {
	vgw, err := stack.Versitygw(e.repo)
	if err != nil {
		return err
	}
	if e.s3, err = stack.StartS3(ctx, vgw, filepath.Join(e.scratch, "s3"), filepath.Join(e.scratch, "s3-log"), s3Bucket, "", ""); err != nil {
		return err
	}
	src := filepath.Join(e.scratch, "s3-src")
	if e.s3DiffIDs, err = writeS3Images(src, archive); err != nil {
		return fmt.Errorf("S3 images: %w", err)
	}
	_, err = e.s3.Seed(ctx, src)
	return err
}

// pullS3 runs our CLI's pull with --format json and returns its result.
func (e *env) pullS3(ctx context.Context, args ...string) (*api.PullResult, error) {
	out, err := e.daemon.CLI(ctx, []string{"pull"}, append([]string{"--format", "json"}, args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last control.Line
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &last); jerr != nil || last.Result == nil {
		return nil, fmt.Errorf("pull %v: %v (%v): %s", args, err, jerr, lastLines(out, 3))
	}
	return last.Result, err
}

// countRows is how many rows `ls KIND --format json` lists.
func (e *env) countRows(ctx context.Context, kind string) (int, error) {
	out, err := e.daemon.CLI(ctx, []string{"ls", kind}, "--format", "json")
	if err != nil {
		return 0, err
	}
	var rows []json.RawMessage
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		return 0, fmt.Errorf("ls %s --format json: %w: %s", kind, err, out)
	}
	return len(rows), nil
}

// testS3 pulls the S3 images (stored gzip, zstd and plain) by their
// default names: the first registered for nerdctl and for the CRI, the
// others in the daemon's namespace. The three share their chains, unpacked
// once; nerdctl and ctr run containers on them; the capability of the
// third layer is on the unpacked file. The CRI subtest runs a container on
// the first and removes it; this one removes the others.
func (e *env) testS3(t *testing.T, ctx context.Context) {
	var res []*api.PullResult
	for i, img := range s3Images {
		args := []string{img.source()}
		if i == 0 {
			args = append(args, "--namespace", s3NerdctlNS, "--namespace", criNamespace)
		}
		var r *api.PullResult
		e.timed(t, "pull "+img.source(), func() error {
			var err error
			r, err = e.pullS3(ctx, args...)
			return err
		})
		t.Logf("pull %s: %s, downloaded %d, unpacked %d, top chain %s", img.source(), r.Ref, r.Downloaded, r.Unpacked, r.TopChainID)
		if r.Ref != img.defaultRef() || r.Downloaded != 3 {
			t.Errorf("pull %s: name %q, downloaded %d; want %s, 3 layers downloaded", img.source(), r.Ref, r.Downloaded, img.defaultRef())
		}
		for j, l := range r.Layers {
			if l.DiffID != e.s3DiffIDs[j] {
				t.Errorf("%s layer %d: diff ID %s, want the uncompressed tar's %s", img.source(), j+1, l.DiffID, e.s3DiffIDs[j])
			}
		}
		if want := map[bool]int{true: 3, false: 0}[i == 0]; r.Unpacked != want {
			t.Errorf("pull %s unpacked %d layers, want %d (the same layers stored otherwise were unpacked by the first pull)", img.source(), r.Unpacked, want)
		}
		if i > 0 && r.TopChainID != res[0].TopChainID {
			t.Errorf("%s: top chain %s, want %s as for %s", img.source(), r.TopChainID, res[0].TopChainID, s3Images[0].source())
		}
		res = append(res, r)
	}
	e.s3Ref = res[0].Ref
	chains, err := e.countRows(ctx, "chains")
	if err != nil {
		t.Fatal(err)
	}
	activations, err := e.countRows(ctx, "snapshots")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("three images of three layers stored as gzip, zstd and plain: %d chains, %d activations", chains, activations)
	if chains != 3 || activations != 3 {
		t.Errorf("ls chains: %d, ls snapshots: %d; want 3 chains (each layer unpacked once) and 3 activations", chains, activations)
	}

	want := s3LayerContent + ociimage.MarkerContent
	var out string
	e.timed(t, "nerdctl --snapshotter flyio run of the S3 image (.tar.gz) by its default name", func() error {
		out, err = e.containerOutput(ctx, e.nerdctlArgv(s3NerdctlNS, "run", "--rm", "--net", "none", res[0].Ref, "/bin/cat", s3LayerPath, ociimage.MarkerPath))
		return err
	})
	if out != want {
		t.Errorf("nerdctl run %s printed %q, want %q", res[0].Ref, out, want)
	}
	t.Logf("nerdctl run %s printed %q", res[0].Ref, out)
	e.timed(t, "ctr run of the S3 image (.tar.zst)", func() error {
		out, err = e.containerOutput(ctx, e.ctrArgv(stack.Namespace, "run", "--rm", "--snapshotter", "flyio", res[1].Ref, "s3-zst", "/bin/cat", s3LayerPath, ociimage.MarkerPath))
		return err
	})
	if out != want {
		t.Errorf("ctr run %s printed %q, want %q", res[1].Ref, out, want)
	}
	t.Logf("ctr run %s printed %q", res[1].Ref, out)

	if got, how, err := capabilityOf(ctx, res[0].Snapshot.DevicePath, filepath.Join(e.scratch, "activation"), cappedPath); err != nil {
		t.Error(err)
	} else {
		t.Logf("%s in %s (%s): %q", cappedPath, res[0].Snapshot.DevicePath, how, got)
		if !strings.Contains(got, "cap_net_raw") {
			t.Errorf("%s carries %q, want cap_net_raw=ep", cappedPath, got)
		}
	}

	e.timed(t, "nerdctl rmi and ctr image rm of the S3 images", func() error {
		if _, err := e.nerdctlRun(ctx, s3NerdctlNS, "rmi", res[0].Ref); err != nil {
			return err
		}
		_, err := e.ctr(ctx, stack.Namespace, "image", "rm", "--sync", res[1].Ref, res[2].Ref)
		return err
	})
}

// capabilityOf mounts the ext4 device dev read-only on dir and reads the
// file capability of path in it: with getcap when the VM has it, else the
// raw xattr (decoded enough to name cap_net_raw).
func capabilityOf(ctx context.Context, dev, dir, path string) (string, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	if err := unix.Mount(dev, dir, "ext4", unix.MS_RDONLY, "noload"); err != nil {
		return "", "", fmt.Errorf("mount %s read-only on %s: %w", dev, dir, err)
	}
	defer unix.Unmount(dir, 0)
	file := filepath.Join(dir, path)
	if getcap, err := exec.LookPath("getcap"); err == nil {
		out, err := exec.CommandContext(ctx, getcap, file).CombinedOutput()
		return strings.TrimSpace(string(out)), "getcap", err
	}
	buf := make([]byte, 64)
	n, err := unix.Getxattr(file, "security.capability", buf)
	if err != nil {
		return "", "", fmt.Errorf("security.capability of %s: %w", file, err)
	}
	got := buf[:n]
	desc := fmt.Sprintf("%x", got)
	if string(got) == cappedCapability {
		desc += " = cap_net_raw+ep"
	}
	return desc, "getxattr", nil
}
