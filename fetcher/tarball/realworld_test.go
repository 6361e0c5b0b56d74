package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// describeTree lists every name under dir with what a user would compare:
// type, permission and special bits, owner, content digest, link target,
// modification time (directories' too), and which names share an inode.
func describeTree(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	inodes := map[uint64]string{}
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	sort.Strings(names)
	for _, p := range names {
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v uid=%d gid=%d mtime=%d", fi.Mode(), st.Uid, st.Gid, fi.ModTime().UnixNano())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(b)
			desc += fmt.Sprintf(" size=%d sha=%s", len(b), hex.EncodeToString(sum[:8]))
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					desc += " linked-to=" + first
				} else {
					inodes[st.Ino] = rel
				}
			}
		}
		out[rel] = desc
	}
	return out
}

func diffTrees(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("%s: %s missing (want %s)", what, k, w)
		} else if g != w {
			t.Errorf("%s: %s\n  got  %s\n  want %s", what, k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected %s (%s)", what, k, g)
		}
	}
}

func TestRealWorldArchives(t *testing.T) {
	formats := map[string]tar.Format{"pax": tar.FormatPAX, "gnu": tar.FormatGNU, "default": tar.FormatUnknown}
	for fname, format := range formats {
		for _, layout := range []string{"plain", "rootfs", "dot-rootfs"} {
			t.Run(fname+"/"+layout, func(t *testing.T) {
				ents := realWorld()
				if format == tar.FormatGNU {
					// GNU headers carry no PAX records: drop the xattr entry's records.
					for i := range ents {
						if ents[i].hdr.PAXRecords != nil {
							ents[i].hdr.PAXRecords = nil
						}
						ents[i].hdr.Format = format
					}
				}
				switch layout {
				case "rootfs":
					ents = append([]ent{dir("rootfs/")}, prefixed("rootfs/", ents)...)
				case "dot-rootfs":
					ents = append([]ent{dir("./"), dir("./rootfs/")}, prefixed("./rootfs/", ents)...)
				}
				b := build(t, ents...)
				rep, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
				if err != nil {
					t.Fatalf("Validate rejected a real-world archive: %v", err)
				}
				if want := layout != "plain"; rep.HasRootfs != want {
					t.Errorf("HasRootfs = %v, want %v", rep.HasRootfs, want)
				}
				if rep.Symlinks != 6 || rep.Hardlinks != 1 || rep.Files != 6 || rep.Fifos != 1 {
					t.Errorf("report %+v: want 6 symlinks, 1 hard link, 6 files, 1 fifo", rep)
				}
				if rep.ArchiveBytes != int64(len(b)) {
					t.Errorf("ArchiveBytes = %d, want %d", rep.ArchiveBytes, len(b))
				}
				s := newSandbox(t)
				var last Progress
				st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target,
					ExtractOptions{StripRootfs: rep.HasRootfs, Progress: func(p Progress) { last = p }})
				if err != nil {
					t.Fatalf("Extract: %v", err)
				}
				s.intact(t)
				if st.Files != rep.Files || st.Bytes != rep.TotalBytes || last.Bytes != st.Bytes || last.Entries != st.Entries {
					t.Errorf("stats %+v, last progress %+v, report %+v disagree", st, last, rep)
				}
				checkRealWorldTree(t, s.target, format != tar.FormatGNU)
			})
		}
	}
}

func checkRealWorldTree(t *testing.T, root string, xattrs bool) {
	t.Helper()
	link := func(name, want string) {
		t.Helper()
		got, err := os.Readlink(filepath.Join(root, name))
		if err != nil || got != want {
			t.Errorf("symlink %s -> %q (%v), want %q", name, got, err, want)
		}
	}
	link("etc/alternatives/vi", "/usr/bin/vim.basic") // absolute: kept as written
	link("usr/bin/vi", "/etc/alternatives/vi")
	link("bin", "usr/bin")
	link("usr/lib/os-release", "../../etc/os-release")

	a, errA := os.Stat(filepath.Join(root, "usr/bin/perl"))
	b, errB := os.Stat(filepath.Join(root, "usr/bin/perl5.36"))
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		t.Errorf("usr/bin/perl5.36 is not a hard link of usr/bin/perl (%v, %v)", errA, errB)
	}
	if fi, err := os.Lstat(filepath.Join(root, "var/mail")); err != nil || fi.Mode()&fs.ModeSetgid == 0 || fi.Sys().(*syscall.Stat_t).Gid != 8 {
		t.Errorf("var/mail: %v %v, want setgid, group 8", fi.Mode(), err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&fs.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp: %v %v, want sticky 777", fi.Mode(), err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "var/run-fifo")); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		t.Errorf("var/run-fifo: %v %v, want a fifo", fi, err)
	}
	motd := filepath.Join(root, "etc/motd")
	if fi, err := os.Lstat(motd); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 || !fi.ModTime().Equal(testTime) {
		t.Errorf("etc/motd: %v %v, want uid 1000 and mtime %v", fi, err, testTime)
	}
	if fi, err := os.Lstat(filepath.Join(root, "usr")); err != nil || !fi.ModTime().Equal(testTime) {
		t.Errorf("usr: directory mtime not preserved: %v %v", fi, err)
	}
	if xattrs {
		buf := make([]byte, 64)
		n, err := unix.Lgetxattr(motd, "user.comment", buf)
		if err != nil || string(buf[:n]) != "kept" {
			t.Errorf("etc/motd user.comment = %q (%v), want kept", buf[:max(n, 0)], err)
		}
	}
	found := 0
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if strings.HasSuffix(p, strings.Repeat("x", 200)+".txt") || strings.HasSuffix(p, "ü-名前.txt") {
			found++
		}
		return nil
	})
	if found != 2 {
		t.Errorf("found %d of the 2 long / non-ASCII names", found)
	}
	if err := VerifyLayoutDir(root); err != nil {
		t.Errorf("VerifyLayout: %v", err)
	}
}

// requireGNUTar fails tb unless GNU tar is on PATH: the tests and
// benchmarks that call it compare this package's extraction with GNU tar's.
func requireGNUTar(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("tar"); err != nil {
		tb.Fatal("GNU tar, the extraction compared with, is needed (apt-get install tar)")
	}
}

// TestGNUTarArchive extracts archives made by GNU tar from a tree on disk
// and compares the result with GNU tar's own extraction of the same
// archive, and with the source tree.
func TestGNUTarArchive(t *testing.T) {
	requireGNUTar(t)
	src := t.TempDir()
	mk := func(p string, mode fs.FileMode, body string) {
		full := filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(full, mode)
	}
	mk("etc/hostname", 0o644, "box\n")
	mk("usr/bin/tool", 0o755, strings.Repeat("binary", 5000))
	mk("usr/share/"+strings.Repeat("d", 120)+"/"+strings.Repeat("n", 180), 0o600, "long")
	mk("var/lib/empty", 0o644, "")
	mk("home/user/.profile", 0o640, "PATH=/bin")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Lchown(filepath.Join(src, "home/user/.profile"), 1000, 1000))
	must(os.Chown(filepath.Join(src, "home/user"), 1000, 1000))
	must(os.Symlink("/usr/bin/tool", filepath.Join(src, "etc/tool-abs")))
	must(os.Symlink("../usr/bin/tool", filepath.Join(src, "etc/tool-rel")))
	must(os.Link(filepath.Join(src, "usr/bin/tool"), filepath.Join(src, "usr/bin/tool-hard")))
	must(os.Mkdir(filepath.Join(src, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(src, "tmp"), 0o1777))
	must(os.Chmod(filepath.Join(src, "var/lib"), 0o2775))
	must(unix.Mkfifo(filepath.Join(src, "var/fifo"), 0o600))
	old := time.Date(2020, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	must(os.Chtimes(filepath.Join(src, "etc/hostname"), old, old))
	must(os.Chtimes(filepath.Join(src, "var"), old, old))

	for _, format := range []string{"gnu", "posix"} {
		t.Run(format, func(t *testing.T) {
			archive := filepath.Join(t.TempDir(), "image.tar")
			if out, err := exec.Command("tar", "--format="+format, "-C", src, "-cf", archive, ".").CombinedOutput(); err != nil {
				t.Fatalf("tar -c: %v: %s", err, out)
			}
			b, err := os.ReadFile(archive)
			must(err)
			rep, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
			if err != nil {
				t.Fatalf("Validate of GNU tar's archive: %v", err)
			}
			if rep.HasRootfs || rep.Hardlinks != 1 || rep.Symlinks != 2 || rep.Fifos != 1 {
				t.Errorf("report %+v: want no rootfs, 1 hard link, 2 symlinks, 1 fifo", rep)
			}
			ours, theirs := t.TempDir(), t.TempDir()
			if _, err := ExtractDir(context.Background(), bytes.NewReader(b), ours, ExtractOptions{}); err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if out, err := exec.Command("tar", "-C", theirs, "-xf", archive).CombinedOutput(); err != nil {
				t.Fatalf("tar -x: %v: %s", err, out)
			}
			diffTrees(t, "ours vs GNU tar -x", describeTree(t, ours), describeTree(t, theirs))
			// Against the source, mtimes aside (GNU format keeps whole
			// seconds), and the root directory (TempDir's own mode).
			strip := func(m map[string]string) map[string]string {
				out := map[string]string{}
				for k, v := range m {
					if k == "." {
						continue
					}
					i := strings.Index(v, " mtime=")
					j := strings.Index(v[i+1:], " ")
					if j < 0 {
						out[k] = v[:i]
					} else {
						out[k] = v[:i] + v[i+1+j:]
					}
				}
				return out
			}
			diffTrees(t, "ours vs source tree", strip(describeTree(t, ours)), strip(describeTree(t, src)))
		})
	}
}

// TestWhiteoutsAcrossLayers extracts layer 2 over layer 1, as the Unpack
// pipeline does into a snapshot of the layer below.
func TestWhiteoutsAcrossLayers(t *testing.T) {
	layer1 := build(t,
		dir("a/"), file("a/keep", "k"), file("a/gone", "g"),
		dir("b/"), file("b/x", "x"), dir("b/sub/"), file("b/sub/y", "y"),
		dir("c/"), file("c/old", "o"), dir("c/deep/"), file("c/deep/old", "o"),
		file("f", "file"), dir("d/"), file("d/z", "z"),
		dir("e/"), file("e/lower", "l"),
	)
	layer2 := build(t,
		file(".wh.f", ""),          // a whited-out file
		file("a/.wh.gone", ""),     // a whited-out file in a directory
		file(".wh.d", ""),          // a whited-out directory, with its content
		dir("b/"),                  // an opaque directory: lower content hidden,
		file("b/.wh..wh..opq", ""), // this layer's entries kept, before or after
		file("b/new", "n"),
		file("c/deep/mine", "m"), // written before the opaque marker of c
		file("c/.wh..wh..opq", ""),
		file("e/.wh.never-existed", ""),
		file(".wh.missing-dir", ""),
		file("zz/.wh.nothing", ""), // a whiteout in a directory that does not exist: made, empty
		file("y/.wh..wh..opq", ""), // an opaque marker of one that does not exist: made, empty
	)
	s := newSandbox(t)
	for i, l := range [][]byte{layer1, layer2} {
		if _, err := Validate(context.Background(), bytes.NewReader(l), Limits{}); err != nil {
			t.Fatalf("Validate layer %d: %v", i+1, err)
		}
		if _, err := ExtractDir(context.Background(), bytes.NewReader(l), s.target, ExtractOptions{}); err != nil {
			t.Fatalf("Extract layer %d: %v", i+1, err)
		}
	}
	s.intact(t)
	var got []string
	filepath.WalkDir(s.target, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(s.target, p)
		got = append(got, rel)
		return nil
	})
	want := []string{".", "a", "a/keep", "b", "b/new", "c", "c/deep", "c/deep/mine", "e", "e/lower", "y", "zz"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("tree after two layers:\n got  %v\n want %v", got, want)
	}
}

// TestLowerLayerSymlinkNotFollowed: a symlink already in the target (from a
// lower layer) is never followed, neither to write, nor to link, nor to
// remove; Validate cannot see it, Extract must.
func TestLowerLayerSymlinkNotFollowed(t *testing.T) {
	cases := []struct {
		name  string
		ents  []ent
		entry string
	}{
		{"write", []ent{file("abs/pwned", "x")}, "abs/pwned"},
		{"mkdir", []ent{dir("abs/d/")}, "abs/d/"},
		{"whiteout", []ent{file("abs/.wh.secret", "")}, "abs/.wh.secret"},
		{"opaque", []ent{file("abs/.wh..wh..opq", "")}, "abs/.wh..wh..opq"},
		{"relative-write", []ent{file("rel/pwned", "x")}, "rel/pwned"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t)
			if err := os.Symlink(s.canary, filepath.Join(s.target, "abs")); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(s.target, "real"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("real", filepath.Join(s.target, "rel")); err != nil {
				t.Fatal(err)
			}
			b := build(t, c.ents...)
			if _, err := Validate(context.Background(), bytes.NewReader(b), Limits{}); err != nil {
				t.Fatalf("Validate (which sees no lower layer): %v", err)
			}
			_, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{})
			checkRejection(t, "Extract", err, hostile{rule: ErrThroughSymlink, entry: c.entry})
			s.intact(t)
			if es, _ := os.ReadDir(filepath.Join(s.target, "real")); len(es) != 0 {
				t.Errorf("wrote through the relative symlink: real/ holds %v", es)
			}
		})
	}
	// Replacing a lower symlink by a directory is not following it.
	s := newSandbox(t)
	if err := os.Symlink(s.canary, filepath.Join(s.target, "abs")); err != nil {
		t.Fatal(err)
	}
	b := build(t, dir("abs/"), file("abs/mine", "m"))
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{}); err != nil {
		t.Fatalf("replacing a lower symlink by a directory: %v", err)
	}
	s.intact(t)
	if fi, err := os.Lstat(filepath.Join(s.target, "abs/mine")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("abs/mine: %v %v", fi, err)
	}
}

// TestReplacements: later entries replace earlier ones as tar -x does.
func TestReplacements(t *testing.T) {
	b := build(t,
		file("x", "first"), file("x", "second"),
		dir("d/"), file("d/f", "f"), file("d", "now a file"),
		symlink("l", "/etc"), dir("l/"), file("l/in", "i"),
		file("t", "target"), hardlink("h", "t"), file("h", "own content"),
	)
	if _, err := Validate(context.Background(), bytes.NewReader(b), Limits{}); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	s := newSandbox(t)
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	for name, want := range map[string]string{"x": "second", "d": "now a file", "l/in": "i", "t": "target", "h": "own content"} {
		if got, err := os.ReadFile(filepath.Join(s.target, name)); err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
	// A stale hard link target (its directory replaced since) is refused.
	b = build(t, dir("d/"), file("d/f", "f"), file("d", "x"), dir("d/"), hardlink("h", "d/f"))
	_, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
	checkRejection(t, "Validate", err, hostile{rule: ErrHardlinkTarget, entry: "h"})
}

// TestReplacingLowerNames: a file or symlink whose name a lower layer
// already holds (a symlink to outside the target, one left dangling, a
// file, a directory) replaces that name and nothing else: the old symlink
// is not followed, and what it pointed at is left as it was.
func TestReplacingLowerNames(t *testing.T) {
	s := newSandbox(t)
	lower := func(name string, make func(string) error) {
		if err := make(filepath.Join(s.target, name)); err != nil {
			t.Fatal(err)
		}
	}
	secret := filepath.Join(s.canary, "secret")
	lower("to-secret", func(p string) error { return os.Symlink(secret, p) })
	lower("dangling", func(p string) error { return os.Symlink(filepath.Join(s.canary, "new"), p) })
	lower("to-canary", func(p string) error { return os.Symlink(s.canary, p) })
	lower("was-file", func(p string) error { return os.WriteFile(p, []byte("lower"), 0o644) })
	lower("was-dir", func(p string) error { return os.MkdirAll(filepath.Join(p, "sub"), 0o755) })
	b := build(t,
		file("to-secret", "mine"), file("dangling", "mine too"),
		symlink("to-canary", "elsewhere"), symlink("was-file", "t"), symlink("was-dir", "t"),
	)
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	s.intact(t)
	for name, want := range map[string]string{"to-secret": "mine", "dangling": "mine too"} {
		p := filepath.Join(s.target, name)
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v %v, want the archive's regular file", name, fi, err)
			continue
		}
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
	for name, want := range map[string]string{"to-canary": "elsewhere", "was-file": "t", "was-dir": "t"} {
		if got, err := os.Readlink(filepath.Join(s.target, name)); err != nil || got != want {
			t.Errorf("%s -> %q (%v), want a symlink to %q", name, got, err, want)
		}
	}
}

func TestRootfsDetection(t *testing.T) {
	cases := []struct {
		name string
		ents []ent
		want bool
	}{
		{"plain", []ent{dir("etc/")}, false},
		{"rootfs", []ent{dir("rootfs/"), dir("rootfs/etc/")}, true},
		{"rootfs-implicit", []ent{file("rootfs/etc/hostname", "h")}, true},
		{"dot-slash", []ent{dir("./"), dir("./rootfs/"), file("./rootfs/a", "")}, true},
		{"rootfs-plus-other", []ent{dir("rootfs/"), file("README", "")}, false},
		{"rootfs-is-a-file", []ent{file("rootfs", "")}, false},
		{"rootfs-is-a-symlink", []ent{symlink("rootfs", "/"), dir("etc/")}, false},
		{"rootfs-whiteout", []ent{dir("rootfs/"), file(".wh.rootfs2", "")}, false},
		{"rootfsx", []ent{dir("rootfsx/")}, false},
		{"empty", nil, false},
	}
	for _, c := range cases {
		rep, err := Validate(context.Background(), bytes.NewReader(build(t, c.ents...)), Limits{})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		} else if rep.HasRootfs != c.want {
			t.Errorf("%s: HasRootfs = %v, want %v", c.name, rep.HasRootfs, c.want)
		}
	}
	// A relative symlink that stays in the archive but climbs above rootfs/
	// would escape once rootfs/ is stripped.
	b := build(t, dir("rootfs/"), dir("rootfs/etc/"), symlink("rootfs/etc/up", "../../outside"))
	_, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
	checkRejection(t, "Validate", err, hostile{rule: ErrSymlinkEscape, entry: "rootfs/etc/up"})
	s := newSandbox(t)
	_, err = ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{StripRootfs: true})
	checkRejection(t, "Extract", err, hostile{rule: ErrSymlinkEscape, entry: "rootfs/etc/up"})
	// Stripping refuses anything outside rootfs/.
	b = build(t, dir("rootfs/"), file("other", ""))
	_, err = ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{StripRootfs: true})
	checkRejection(t, "Extract", err, hostile{rule: ErrOutsideRootfs, entry: "other"})
}

// pingCapability is cap_net_raw+ep in the kernel's VFS_CAP_REVISION_2
// format, as setcap writes it: magic and the effective flag, then the
// permitted and inheritable sets of two 32-bit words each.
const pingCapability = "\x01\x00\x00\x02" + "\x00\x20\x00\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00"

// TestAllowSetID: with AllowSetID, a setuid file keeps its bit and a file
// capability is applied: reading the xattr back gives the archive's value
// (run as root, which setting one needs; the test fails otherwise).
func TestAllowSetID(t *testing.T) {
	b := build(t, file("su", "x").mode(0o4755), file("ping", "y").mode(0o755).pax("SCHILY.xattr.security.capability", pingCapability))
	if _, err := Validate(context.Background(), bytes.NewReader(b), Limits{AllowSetID: true}); err != nil {
		t.Fatalf("Validate with AllowSetID: %v", err)
	}
	s := newSandbox(t)
	st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: Limits{AllowSetID: true}})
	if err != nil {
		t.Fatalf("Extract with AllowSetID: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(s.target, "su")); err != nil || fi.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("su: %v %v, want setuid kept", fi, err)
	}
	buf := make([]byte, 64)
	n, err := unix.Getxattr(filepath.Join(s.target, "ping"), "security.capability", buf)
	if err != nil || string(buf[:n]) != pingCapability || st.Capabilities != 1 {
		t.Errorf("ping's security.capability = %x, %v (%d applied); want %x (cap_net_raw+ep)", buf[:max(n, 0)], err, st.Capabilities, pingCapability)
	}

	// A value the kernel refuses is a rejection naming the entry.
	bad := build(t, file("ping", "y").pax("SCHILY.xattr.security.capability", "\x01"))
	_, err = ExtractDir(context.Background(), bytes.NewReader(bad), newSandbox(t).target, ExtractOptions{Limits: Limits{AllowSetID: true}})
	checkRejection(t, "Extract", err, hostile{rule: ErrFileCapability, entry: "ping"})
}

func TestVerifyLayout(t *testing.T) {
	mk := func(t *testing.T, setup func(root string)) error {
		root := t.TempDir()
		for _, d := range RequiredDirs {
			if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		setup(root)
		return VerifyLayoutDir(root)
	}
	if err := mk(t, func(string) {}); err != nil {
		t.Errorf("complete layout: %v", err)
	}
	cases := []struct {
		name  string
		setup func(root string)
		path  string
		rule  error
	}{
		{"missing-var", func(r string) { os.Remove(filepath.Join(r, "var")) }, "var", ErrLayoutMissing},
		{"etc-symlink", func(r string) {
			os.Remove(filepath.Join(r, "etc"))
			os.Symlink("/etc", filepath.Join(r, "etc"))
		}, "etc", ErrLayoutNotDir},
		{"usr-file", func(r string) {
			os.Remove(filepath.Join(r, "usr"))
			os.WriteFile(filepath.Join(r, "usr"), nil, 0o644)
		}, "usr", ErrLayoutNotDir},
		{"usr-world-writable", func(r string) { os.Chmod(filepath.Join(r, "usr"), 0o777) }, "usr", ErrLayoutWorldWritable},
		{"etc-world-writable-sticky", func(r string) { os.Chmod(filepath.Join(r, "etc"), 0o1777) }, "etc", ErrLayoutWorldWritable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := mk(t, c.setup)
			var le *LayoutError
			if !errors.As(err, &le) || !errors.Is(err, c.rule) || le.Path != c.path {
				t.Fatalf("VerifyLayout: %v, want %v on %s", err, c.rule, c.path)
			}
			if !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), c.rule.Error()) {
				t.Errorf("message %q does not name path and rule", err)
			}
		})
	}
}

// TestRemovalsUnderTheCursor: entries that remove or replace the directory
// the extractor is working in, then write there again.
func TestRemovalsUnderTheCursor(t *testing.T) {
	b := build(t,
		dir("d/"), dir("d/sub/"), file("d/sub/a", "a"),
		file(".wh.d", ""), file("d/sub/b", "b"), // d removed, then re-created implicitly
		dir("x/"), dir("x/y/"), file("x/y/old", "o"),
		file("x", "a file now"), dir("x/"), file("x/y/new", "n"), // replaced by a file, then a directory again
		dir("o/"), dir("o/p/"), file("o/p/q", "q"),
		file("o/.wh..wh..opq", ""), file("o/p/r", "r"), // opaque after this layer's own content
	)
	if _, err := Validate(context.Background(), bytes.NewReader(b), Limits{}); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	s := newSandbox(t)
	if err := os.MkdirAll(filepath.Join(s.target, "o/lower"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	var got []string
	filepath.WalkDir(s.target, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(s.target, p)
		got = append(got, rel)
		return nil
	})
	want := ". d d/sub d/sub/b o o/p o/p/q o/p/r x x/y x/y/new"
	if strings.Join(got, " ") != want {
		t.Errorf("tree:\n got  %v\n want %s", got, want)
	}
}

// TestDeepPath: a path of 1,000 directories extracts (and is checked
// component by component) like any other.
func TestDeepPath(t *testing.T) {
	deep := strings.Repeat("a/", 1000) + "f"
	b := build(t, file(deep, "deep"), file(strings.Repeat("a/", 999)+"g", "g"), symlink(strings.Repeat("a/", 500)+"l", "/etc"))
	if _, err := Validate(context.Background(), bytes.NewReader(b), Limits{}); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	s := newSandbox(t)
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	root, err := os.OpenRoot(s.target)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if got, err := root.ReadFile(deep); err != nil || string(got) != "deep" {
		t.Errorf("deep file: %q %v", got, err)
	}
	// Too deep for a name: more than 4095 bytes.
	b = build(t, file(strings.Repeat("a/", 2048)+"f", "x"))
	_, err = Validate(context.Background(), bytes.NewReader(b), Limits{})
	checkRejection(t, "Validate", err, hostile{rule: ErrNameTooLong})
}

// TestImplicitDirsMode: the parent directories an archive implies but
// does not list (ko's kodata, Bazel and Nix layers omit them) are 0755,
// as containerd's applier makes them, whatever the daemon's umask (a
// hardened unit's UMask=0077 would make them 0700, root's, out of reach
// of a container's non-root user), and not setgid below a setgid
// directory the archive lists.
func TestImplicitDirsMode(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	s := newSandbox(t)
	b := build(t, file("var/run/ko/static/app.css", "body{}"), dir("srv/").mode(0o2775), file("srv/data/x", "x"))
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: Limits{AllowSetID: true}}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	for _, d := range []string{"var", "var/run", "var/run/ko", "var/run/ko/static", "srv/data"} {
		fi, err := os.Lstat(filepath.Join(s.target, d))
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSetgid | fs.ModeSetuid | fs.ModeSticky); m != fs.ModeDir|0o755 {
			t.Errorf("%s: mode %v, want drwxr-xr-x", d, fi.Mode())
		}
	}
	if fi, err := os.Lstat(filepath.Join(s.target, "srv")); err != nil || fi.Mode()&(fs.ModePerm|fs.ModeSetgid) != fs.ModeSetgid|0o775 {
		t.Errorf("srv, listed with mode 2775: %v (%v)", fi.Mode(), err)
	}
}
