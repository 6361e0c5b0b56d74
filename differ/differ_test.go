package differ

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/diff/apply"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// entry is one member of a test layer: a file with body, a directory (name
// ending in /) or a whiteout (.wh. name, empty body).
type entry struct{ name, body string }

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1.7e9, 0)}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// fixture is a real content store (containerd's local store on disk)
// holding the layers, and a lower layer's tree that Apply writes over
// through a bind mount, as it writes over a snapshot's device mount.
type fixture struct {
	ctx    context.Context
	cs     content.Store
	parent string // holds lower and nothing else
	lower  string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("Apply mounts the snapshot it writes: run the tests as root")
	}
	dir := t.TempDir()
	cs, err := local.NewStore(filepath.Join(dir, "content"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ctx: context.Background(), cs: cs, parent: filepath.Join(dir, "snapshot"), lower: filepath.Join(dir, "snapshot", "fs")}
	if err := os.MkdirAll(filepath.Join(f.lower, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"etc/old": "old", "etc/keep": "keep"} {
		if err := os.WriteFile(filepath.Join(f.lower, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// blob stores b under mediaType and returns its descriptor.
func (f *fixture) blob(t *testing.T, mediaType string, b []byte) ocispec.Descriptor {
	t.Helper()
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := content.WriteBlob(f.ctx, f.cs, desc.Digest.String(), bytes.NewReader(b), desc); err != nil {
		t.Fatal(err)
	}
	return desc
}

// apply applies desc with the [differ] defaults.
func (f *fixture) apply(desc ocispec.Descriptor, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	return f.applyWith(DefaultConfig(), desc, opts...)
}

func (f *fixture) applyWith(c Config, desc ocispec.Descriptor, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	a := &Applier{Content: f.cs, Limits: c.Limits()}
	return a.Apply(f.ctx, desc, []mount.Mount{{Type: "bind", Source: f.lower, Options: []string{"rbind", "rw"}}}, opts...)
}

func (f *fixture) read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.lower, name))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// TestApply: a gzip layer and a plain one, in OCI's and Docker's media
// types, land on the lower tree (whiteouts removing what they name), and
// the descriptor returned names the uncompressed layer: the digest
// containerd checks against the image config's diff ID, and its size.
func TestApply(t *testing.T) {
	layer := tarOf(t, entry{"etc/", ""}, entry{"etc/new", "new"}, entry{"etc/.wh.old", ""}, entry{"usr/", ""}, entry{"usr/bin/tool", "#!/bin/sh\n"})
	want := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromBytes(layer), Size: int64(len(layer))}
	cases := []struct {
		name, mediaType string
		blob            []byte
	}{
		{"oci-gzip", ocispec.MediaTypeImageLayerGzip, s3test.Gzip(t, layer)},
		{"oci-plain", ocispec.MediaTypeImageLayer, layer},
		{"oci-zstd", ocispec.MediaTypeImageLayerZstd, s3test.Zstd(t, layer)},
		{"docker-gzip", images.MediaTypeDockerSchema2LayerGzip, s3test.Gzip(t, layer)},
		// Docker's plain type is also used for compressed layers, and
		// what the bytes are decides, as for containerd's own applier.
		{"docker-plain-name-gzip-bytes", images.MediaTypeDockerSchema2Layer, s3test.Gzip(t, layer)},
		{"oci-gzip-name-plain-bytes", ocispec.MediaTypeImageLayerGzip, layer},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			got, err := f.apply(f.blob(t, c.mediaType, c.blob), diff.WithSyncFs(true))
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if got.Digest != want.Digest || got.Size != want.Size || got.MediaType != want.MediaType {
				t.Errorf("Apply returned %+v, want %+v", got, want)
			}
			for name, body := range map[string]string{"etc/new": "new", "etc/keep": "keep", "usr/bin/tool": "#!/bin/sh\n"} {
				if got := f.read(t, name); got != body {
					t.Errorf("%s = %q, want %q", name, got, body)
				}
			}
			if _, err := os.Lstat(filepath.Join(f.lower, "etc/old")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("etc/old, whited out by the layer, is still there (%v)", err)
			}
		})
	}
}

// TestApplyRefuses: what Apply will not apply fails with an error that
// says why, and writes nothing outside the snapshot.
func TestApplyRefuses(t *testing.T) {
	f := newFixture(t)
	layer := tarOf(t, entry{"etc/new", "new"})
	for _, mt := range []string{images.MediaTypeImageLayerGzipEncrypted, "application/vnd.example.unknown"} {
		_, err := f.apply(f.blob(t, mt, s3test.Gzip(t, layer)))
		if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), mt) {
			t.Errorf("media type %s: %v, want a not-implemented error naming it", mt, err)
		}
	}
	_, err := f.apply(f.blob(t, ocispec.MediaTypeImageLayerGzip, s3test.Gzip(t, tarOf(t, entry{"etc/ok", "ok"}, entry{"../escaped", "x"}))))
	if !errors.Is(err, tarball.ErrTraversal) || !strings.Contains(err.Error(), "../escaped") {
		t.Errorf("a layer with ../escaped: %v, want %v naming the entry", err, tarball.ErrTraversal)
	}
	_, err = f.applyWith(Config{AllowDeviceNodes: false, MaxEntries: 10, MaxFileSize: 1 << 20, MaxTotalSize: 1 << 20},
		f.blob(t, ocispec.MediaTypeImageLayer, deviceLayer(t)))
	if !errors.Is(err, tarball.ErrDeviceNode) || !strings.Contains(err.Error(), "dev/console") {
		t.Errorf("a layer with a device node, differ.allow_device_nodes off: %v, want %v naming the entry", err, tarball.ErrDeviceNode)
	}
	t.Logf("a device node refused: %v", err)
	if es, err := os.ReadDir(f.parent); err != nil || len(es) != 1 {
		t.Errorf("the snapshot's parent folder holds %v (%v), want only the snapshot", es, err)
	}
	if got := f.read(t, "etc/new"); !strings.HasPrefix(got, "<") {
		t.Errorf("etc/new = %q: a layer of a refused media type was applied", got)
	}
}

// deviceLayer is a layer holding the character device dev/console (5:1).
func deviceLayer(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: "dev/console", Typeflag: tar.TypeChar, Devmajor: 5, Devminor: 1, Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestApplyTakesWhatContainerdTakes: with the [differ] defaults a registry
// layer may carry a device node and a hard link to a lower layer's file,
// as containerd's own applier takes them; both land in the snapshot.
func TestApplyTakesWhatContainerdTakes(t *testing.T) {
	f := newFixture(t)
	if _, err := f.apply(f.blob(t, ocispec.MediaTypeImageLayer, deviceLayer(t))); err != nil {
		t.Fatalf("a layer with a device node: %v", err)
	}
	var sb unix.Stat_t
	if err := unix.Lstat(filepath.Join(f.lower, "dev/console"), &sb); err != nil || sb.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(sb.Rdev) != 5 || unix.Minor(sb.Rdev) != 1 {
		t.Errorf("dev/console: mode %o rdev %d:%d (%v), want the character device 5:1", sb.Mode, unix.Major(sb.Rdev), unix.Minor(sb.Rdev), err)
	}

	var link bytes.Buffer
	tw := tar.NewWriter(&link)
	if err := tw.WriteHeader(&tar.Header{Name: "etc/keep.bak", Typeflag: tar.TypeLink, Linkname: "etc/keep", Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.apply(f.blob(t, ocispec.MediaTypeImageLayerGzip, s3test.Gzip(t, link.Bytes()))); err != nil {
		t.Fatalf("a layer linking a lower layer's file: %v", err)
	}
	a, errA := os.Lstat(filepath.Join(f.lower, "etc/keep.bak"))
	b, errB := os.Lstat(filepath.Join(f.lower, "etc/keep"))
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		t.Errorf("etc/keep.bak: %v %v, want a second name of the lower layer's etc/keep", errA, errB)
	}
}

// TestSetMountDir: what a killed run left in the mount folder (a snapshot
// still mounted, an empty mount point) is unmounted and removed, and the
// mounted tree itself is left as it was.
func TestSetMountDir(t *testing.T) {
	f := newFixture(t)
	dir := filepath.Join(t.TempDir(), "tmpmounts")
	t.Cleanup(func() { _ = mount.SetTempMountLocation(os.TempDir()) })
	mounted, empty := filepath.Join(dir, "containerd-mount1"), filepath.Join(dir, "containerd-mount2")
	for _, d := range []string{mounted, empty} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := mount.All([]mount.Mount{{Type: "bind", Source: f.lower, Options: []string{"rbind", "rw"}}}, mounted); err != nil {
		t.Fatal(err)
	}
	if err := SetMountDir(f.ctx, dir); err != nil {
		t.Fatalf("SetMountDir: %v", err)
	}
	if es, err := os.ReadDir(dir); err != nil || len(es) != 0 {
		t.Errorf("the mount folder holds %v (%v), want nothing", es, err)
	}
	if got := f.read(t, "etc/keep"); got != "keep" {
		t.Errorf("the tree that was mounted: etc/keep = %q, want it untouched", got)
	}
	// Apply mounts under the folder now, and leaves nothing there.
	if _, err := f.apply(f.blob(t, ocispec.MediaTypeImageLayer, tarOf(t, entry{"etc/new", "new"}))); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if es, err := os.ReadDir(dir); err != nil || len(es) != 0 {
		t.Errorf("after an Apply the mount folder holds %v (%v), want nothing", es, err)
	}
}

// TestApplyFollowsLowerSymlinks: a layer naming lib/x.so over a lower
// layer's lib -> usr/lib (a merged /usr) writes usr/lib/x.so, as
// containerd's applier does; a lower symlink to an absolute path leads
// inside the snapshot, not to the host's directory of that name.
func TestApplyFollowsLowerSymlinks(t *testing.T) {
	f := newFixture(t)
	if err := os.MkdirAll(filepath.Join(f.lower, "usr/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	host := t.TempDir()
	for name, target := range map[string]string{"lib": "usr/lib", "hostdir": host} {
		if err := os.Symlink(target, filepath.Join(f.lower, name)); err != nil {
			t.Fatal(err)
		}
	}
	layer := tarOf(t, entry{"lib/x.so", "x"}, entry{"hostdir/planted", "p"})
	if _, err := f.apply(f.blob(t, ocispec.MediaTypeImageLayerGzip, s3test.Gzip(t, layer))); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if got := f.read(t, "usr/lib/x.so"); got != "x" {
		t.Errorf("usr/lib/x.so = %q, want the layer's lib/x.so", got)
	}
	if got := f.read(t, filepath.Join(host, "planted")); got != "p" {
		t.Errorf("%s/planted inside the snapshot = %q, want the layer's hostdir/planted", host, got)
	}
	if es, err := os.ReadDir(host); err != nil || len(es) != 0 {
		t.Errorf("the host's %s holds %v (%v), want it untouched", host, es, err)
	}
}

// layerOf is a plain layer of the headers hdrs, each with an empty body:
// entries of any type, as builders other than archive/tar's users write.
func layerOf(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1.7e9, 0)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// applyContainerd applies desc with containerd's own applier (the one
// containerd uses without the flyio differ) onto f's lower tree.
func (f *fixture) applyContainerd(desc ocispec.Descriptor) (ocispec.Descriptor, error) {
	return apply.NewFileSystemApplier(f.cs).Apply(f.ctx, desc, []mount.Mount{{Type: "bind", Source: f.lower, Options: []string{"rbind", "rw"}}})
}

// tree describes every name under root, root included: type, mode,
// owner, link count, and a file's content or a symlink's target. Times
// are left out: those of the directories an apply writes in are the
// time of the apply.
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		d := fmt.Sprintf("%07o %d:%d nlink=%d", st.Mode, st.Uid, st.Gid, st.Nlink)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			d += fmt.Sprintf(" %q", b)
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			d += " -> " + target
		case unix.S_IFDIR:
			d = fmt.Sprintf("%07o %d:%d", st.Mode, st.Uid, st.Gid)
		}
		out[rel] = d
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// applyBoth applies layer with containerd's applier onto one fixture and
// with the daemon's onto another, both from the same lower tree; it fails
// the test unless both take it, give the same diff ID and leave the same
// tree. It returns the daemon's fixture.
func applyBoth(t *testing.T, layer []byte, prepare func(lower string)) *fixture {
	t.Helper()
	return applyBothAs(t, ocispec.MediaTypeImageLayer, layer, prepare)
}

// applyBothAs is applyBoth of a layer of media type mediaType.
func applyBothAs(t *testing.T, mediaType string, layer []byte, prepare func(lower string)) *fixture {
	t.Helper()
	ctrd, f := newFixture(t), newFixture(t)
	prepare(ctrd.lower)
	prepare(f.lower)
	want, err := ctrd.applyContainerd(ctrd.blob(t, mediaType, layer))
	if err != nil {
		t.Fatalf("containerd's applier: %v", err)
	}
	got, err := f.apply(f.blob(t, mediaType, layer))
	if err != nil {
		t.Fatalf("Apply of a layer containerd's applier takes: %v", err)
	}
	if got.Digest != want.Digest {
		t.Errorf("diff ID %s, containerd's applier %s", got.Digest, want.Digest)
	}
	w, g := tree(t, ctrd.lower), tree(t, f.lower)
	for name, d := range w {
		if g[name] != d {
			t.Errorf("%s: %q after Apply, %q after containerd's applier", name, g[name], d)
		}
	}
	for name, d := range g {
		if _, ok := w[name]; !ok {
			t.Errorf("%s: %q after Apply, absent after containerd's applier", name, d)
		}
	}
	return f
}

func noPrepare(string) {}

// TestApplyHardlinkedWhiteouts: Docker on aufs wrote the second and later
// whiteouts of a layer as hard links to the first (aufs makes every
// whiteout a hard link of one inode), and a whiteout may be of any other
// type. Each removes the name it whites out, as with containerd's applier,
// and nothing of them is created: no link, whatever its target.
func TestApplyHardlinkedWhiteouts(t *testing.T) {
	layer := layerOf(t,
		&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "etc/.wh.old", Typeflag: tar.TypeReg, Mode: 0o444},
		&tar.Header{Name: "etc/.wh.keep", Typeflag: tar.TypeLink, Linkname: "etc/.wh.old", Mode: 0o444},
		&tar.Header{Name: "etc/.wh.gone", Typeflag: tar.TypeLink, Linkname: "../../outside", Mode: 0o444},
		&tar.Header{Name: "etc/.wh.sub/", Typeflag: tar.TypeDir, Mode: 0o755},
	)
	f := applyBoth(t, layer, func(lower string) {
		if err := os.MkdirAll(filepath.Join(lower, "etc/sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(lower, "etc/gone"), []byte("gone"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if es, err := os.ReadDir(filepath.Join(f.lower, "etc")); err != nil || len(es) != 0 {
		t.Errorf("etc holds %v (%v), want every lower file whited out and no whiteout made", es, err)
	}
}

// TestApplyAufsMetadata: layers Docker made on aufs carry aufs's metadata
// directory .wh..wh.plnk/, and may hold a file there that another of the
// layer's entries is a hard link to. As with containerd's applier, the
// .wh..wh. entries themselves create nothing, and what is below them is
// written like any entry, so the hard link finds its target.
func TestApplyAufsMetadata(t *testing.T) {
	layer := layerOf(t,
		&tar.Header{Name: ".wh..wh.aufs", Typeflag: tar.TypeReg, Mode: 0o444},
		&tar.Header{Name: ".wh..wh.orph/", Typeflag: tar.TypeDir, Mode: 0o700},
		&tar.Header{Name: ".wh..wh.plnk/", Typeflag: tar.TypeDir, Mode: 0o700},
		&tar.Header{Name: ".wh..wh.plnk/262.1234", Typeflag: tar.TypeReg, Mode: 0o755},
		&tar.Header{Name: "usr/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "usr/bin/tool", Typeflag: tar.TypeLink, Linkname: ".wh..wh.plnk/262.1234", Mode: 0o755},
		&tar.Header{Name: "etc/new", Typeflag: tar.TypeReg, Mode: 0o644},
	)
	f := applyBoth(t, layer, noPrepare)
	a, errA := os.Lstat(filepath.Join(f.lower, "usr/bin/tool"))
	b, errB := os.Lstat(filepath.Join(f.lower, ".wh..wh.plnk/262.1234"))
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		t.Errorf("usr/bin/tool: %v %v, want the file kept under .wh..wh.plnk", errA, errB)
	}
	for _, n := range []string{".wh..wh.aufs", ".wh..wh.orph"} {
		if _, err := os.Lstat(filepath.Join(f.lower, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want nothing made of aufs's metadata", n, err)
		}
	}
}

// TestApplyKeepsRootMetadata: a layer made with `tar -C dir -c .` by a
// build user lists ./ with the user's owner and mode 0700. containerd's
// applier ignores an entry that resolves to the snapshot's root; so does
// Apply, so the container's / stays 0755 and root's instead of locking
// every other user out and handing / to uid 1000. The root's times stay
// too.
func TestApplyKeepsRootMetadata(t *testing.T) {
	lowerTime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	layer := layerOf(t,
		&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 1000, Gid: 1000, Format: tar.FormatPAX,
			PAXRecords: map[string]string{"SCHILY.xattr.user.root": "layer"}},
		&tar.Header{Name: "./etc/new", Typeflag: tar.TypeReg, Mode: 0o644},
	)
	f := applyBoth(t, layer, func(lower string) {
		if err := os.Chmod(lower, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(lower, lowerTime, lowerTime); err != nil {
			t.Fatal(err)
		}
	})
	var st unix.Stat_t
	if err := unix.Stat(f.lower, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o755 || st.Uid != 0 || st.Gid != 0 || !time.Unix(st.Mtim.Unix()).Equal(lowerTime) {
		t.Errorf("the snapshot's root: mode %04o owner %d:%d mtime %v, want 0755 0:0 %v as before the layer",
			st.Mode&0o7777, st.Uid, st.Gid, time.Unix(st.Mtim.Unix()).UTC(), lowerTime)
	}
	if n, err := unix.Getxattr(f.lower, "user.root", make([]byte, 16)); !errors.Is(err, unix.ENODATA) {
		t.Errorf("the snapshot's root has the layer's user.root (%d bytes, %v), want none", n, err)
	}
	if got := f.read(t, "etc/new"); got != "" {
		t.Errorf("etc/new = %q, want the layer's empty file", got)
	}
}

// TestApplyKoImage: ko (github.com/ko-build/ko) writes every Go image it
// builds with absolute entry names: the binary layer /ko-app/<name>, the
// kodata layer /var, /var/run, /var/run/ko and the files below. Such a
// layer, with a root entry "/" of another mode and a hard link to an
// absolute /etc/<file> (and to a lower layer's), is applied as
// containerd's applier applies it: every name taken from the snapshot's
// root, the root's mode kept.
func TestApplyKoImage(t *testing.T) {
	t.Run("binary layer", func(t *testing.T) {
		layer := layerOf(t,
			&tar.Header{Name: "ko-app", Typeflag: tar.TypeDir, Mode: 0o555},
			&tar.Header{Name: "/ko-app/app", Typeflag: tar.TypeReg, Mode: 0o555},
		)
		f := applyBoth(t, layer, noPrepare)
		if _, err := os.Lstat(filepath.Join(f.lower, "ko-app/app")); err != nil {
			t.Errorf("ko-app/app: %v", err)
		}
	})
	t.Run("kodata layer", func(t *testing.T) {
		layer := layerOf(t,
			&tar.Header{Name: "/var", Typeflag: tar.TypeDir, Mode: 0o555},
			&tar.Header{Name: "/var/run", Typeflag: tar.TypeDir, Mode: 0o555},
			&tar.Header{Name: "/var/run/ko", Typeflag: tar.TypeDir, Mode: 0o555},
			&tar.Header{Name: "/var/run/ko/index.html", Typeflag: tar.TypeReg, Mode: 0o555},
		)
		applyBoth(t, layer, noPrepare)
	})
	t.Run("root entry and hard links", func(t *testing.T) {
		layer := layerOf(t,
			&tar.Header{Name: "/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 1000, Gid: 1000},
			&tar.Header{Name: "/etc/a", Typeflag: tar.TypeReg, Mode: 0o644},
			&tar.Header{Name: "/etc/b", Typeflag: tar.TypeLink, Linkname: "/etc/a", Mode: 0o644},
			&tar.Header{Name: "/etc/keep.bak", Typeflag: tar.TypeLink, Linkname: "/etc/keep", Mode: 0o644},
		)
		f := applyBoth(t, layer, noPrepare)
		a, errA := os.Lstat(filepath.Join(f.lower, "etc/a"))
		b, errB := os.Lstat(filepath.Join(f.lower, "etc/b"))
		if errA != nil || errB != nil || !os.SameFile(a, b) {
			t.Errorf("etc/b: %v %v, want a second name of etc/a", errA, errB)
		}
	})
}

// estargzZstdChunked is a zstd:chunked layer made by
// github.com/containerd/stargz-snapshotter/estargz v0.16.3 (estargz.Build
// with the zstdchunked Compressor, what `nerdctl image convert
// --zstdchunked` and `ctr-remote image optimize --zstdchunked` run) from a
// tar of etc/ and etc/hello. Its Writer copies the entries with
// tar.Writer.Flush and puts the TOC in a zstd skippable frame, so the
// decompressed tar stream has no end-of-archive marker; the layer's diff
// ID (blob.DiffID()) is that stream's SHA-256.
const estargzZstdChunked = "" +
	"KLUv/QRojAIA5AIubm8ucHJlZmV0Y2gubGFuZG1hcmsAMDAwMDEAADAxMzE2MgAgMHVzdGFyADAwDQATmhTADGCDAEBgqxqAhaEO" +
	"mjAIiRIADLoCAoddC+qaAQAAYVYedSi1L/0EaBQDAIKDCxKwNQGJ1eNkmfq0tONIymUT8A+T1leZMedfSAmDghK/A5BEYaSfu9/s" +
	"/gtK7AgSAGBAZSCzARKupgwagHwNnRRADWBDIHIQAIyhDbwx014yuMkBgGPlMk1ATGQf1WEBAQAAzZQJ8ii1L/1EAAABdQAAMGhl" +
	"bGxvAAFUBgIs9wRFvpWMUCpNGB4BAAAotS/9RACIAX0IAEKRNCBQZ+wQULiHi0etRgtK6TAQVSPckAV2SZICkG5mxoYAA4s0oGmh" +
	"mhq/ho81I4y1xZJ33BKfG90vsnC/+Ru66AzZe4R/MV9wOoey8Yy8y4udczj8wrpJB/EwEiBGfyxUU4ChIVjig/HNxV7Cls64W7ND" +
	"KRMIfZ91dNy98MmWcOv4K5/5+nMIi/0rSgVx7AukoC8wMmlDUdFDczp7wECFfxIG0aEMjyNk4wfCEqOf/yQITkNQhqIe4Y1S1aRQ" +
	"TQKGoqBnnqh5pelYQ1GNw0DPFyhNihYABoMEANzmamtntb2nQAwGNtrZFtFpINgAbIA7CLYjFTtrBwMVogc3YD2aeA41AoRRM8dR" +
	"bYwjKDO9G713UCpNGCgAAAD4AAAAAAAAAB4BAAAAAAAAiAIAAAAAAAABAAAAAAAAAEduVWxJblV4"

// TestApplyZstdChunked: a zstd:chunked layer made by estargz has no
// end-of-archive marker; containerd's applier applies it (archive/tar
// stops at a clean end), and so does Apply, returning the same diff ID
// and leaving the same etc/hello.
func TestApplyZstdChunked(t *testing.T) {
	blob, err := base64.StdEncoding.DecodeString(estargzZstdChunked)
	if err != nil {
		t.Fatal(err)
	}
	f := applyBothAs(t, ocispec.MediaTypeImageLayerZstd, blob, noPrepare)
	if g := f.read(t, "etc/hello"); g != "hello" {
		t.Errorf("etc/hello = %q, want \"hello\"", g)
	}
}
