package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestDeviceNodesAdmitted: with Limits.AllowDeviceNodes, character and
// block devices are counted by Validate and made by Extract with the
// archive's numbers, mode and owner, also in place of a lower layer's file.
func TestDeviceNodesAdmitted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("making a device node takes CAP_MKNOD: run the tests as root")
	}
	limits := Limits{AllowDeviceNodes: true}
	console := special("dev/console", tar.TypeChar).mode(0o620).owner(0, 5)
	console.hdr.Devmajor, console.hdr.Devminor = 5, 1
	loop := special("dev/loop0", tar.TypeBlock).mode(0o660).owner(0, 6)
	loop.hdr.Devmajor, loop.hdr.Devminor = 7, 0
	b := build(t, dir("dev/"), console, loop)

	rep, err := Validate(context.Background(), bytes.NewReader(b), limits)
	if err != nil || rep.Devices != 2 {
		t.Fatalf("Validate: %+v, %v; want 2 devices admitted", rep, err)
	}
	s := newSandbox(t)
	if err := os.MkdirAll(filepath.Join(s.target, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.target, "dev/console"), []byte("lower"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: limits})
	if err != nil || st.Devices != 2 {
		t.Fatalf("Extract: %+v, %v; want 2 devices made", st, err)
	}
	s.intact(t)
	for _, c := range []struct {
		name       string
		typ, perm  uint32
		major, min uint32
		gid        uint32
	}{
		{"dev/console", unix.S_IFCHR, 0o620, 5, 1, 5},
		{"dev/loop0", unix.S_IFBLK, 0o660, 7, 0, 6},
	} {
		var sb unix.Stat_t
		if err := unix.Lstat(filepath.Join(s.target, c.name), &sb); err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if sb.Mode&unix.S_IFMT != c.typ || sb.Mode&0o7777 != c.perm || unix.Major(sb.Rdev) != c.major || unix.Minor(sb.Rdev) != c.min || sb.Gid != c.gid {
			t.Errorf("%s: mode %o rdev %d:%d gid %d, want type %o, mode %o, %d:%d, gid %d",
				c.name, sb.Mode, unix.Major(sb.Rdev), unix.Minor(sb.Rdev), sb.Gid, c.typ, c.perm, c.major, c.min, c.gid)
		}
	}

	// Without the limit, the same archive is refused naming its first
	// device, and nothing of it is made.
	s = newSandbox(t)
	_, err = ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{})
	var pe *PolicyError
	if !errors.As(err, &pe) || pe.Rule != ErrDeviceNode || pe.Entry != "dev/console" {
		t.Errorf("Extract without AllowDeviceNodes: %v, want %v naming dev/console", err, ErrDeviceNode)
	}
	if _, err := os.Lstat(filepath.Join(s.target, "dev/console")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dev/console after the refusal: %v, want it absent", err)
	}
}

// TestDeviceNumberOutOfRange: where device nodes are allowed, one whose
// major number does not fit 32 bits (a GNU base-256 field) is refused
// naming the entry, by Validate and by Extract, and not made as the
// device its low 32 bits name (8:0 here, a disk).
func TestDeviceNumberOutOfRange(t *testing.T) {
	limits := Limits{AllowDeviceNodes: true}
	disk := special("dev/disk", tar.TypeBlock).mode(0o600)
	disk.hdr.Devmajor, disk.hdr.Devminor, disk.hdr.Format = 1<<32+8, 0, tar.FormatGNU
	b := build(t, dir("dev/"), disk)
	tr := tar.NewReader(bytes.NewReader(b))
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	if h, err := tr.Next(); err != nil || h.Devmajor != 1<<32+8 {
		t.Fatalf("the device's header reads back as %+v, %v", h, err)
	}
	var pe *PolicyError
	if _, err := Validate(context.Background(), bytes.NewReader(b), limits); !errors.As(err, &pe) || pe.Rule != ErrDeviceNumber || pe.Entry != "dev/disk" {
		t.Errorf("Validate: %v, want %v naming dev/disk", err, ErrDeviceNumber)
	}
	s := newSandbox(t)
	_, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: limits})
	if !errors.As(err, &pe) || pe.Rule != ErrDeviceNumber || pe.Entry != "dev/disk" || !strings.Contains(err.Error(), "4294967304:0") {
		t.Errorf("Extract: %v, want %v naming dev/disk and its numbers", err, ErrDeviceNumber)
	}
	if _, err := os.Lstat(filepath.Join(s.target, "dev/disk")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dev/disk after the refusal: %v, want it absent", err)
	}
}

// TestLowerHardlinks: with Limits.LowerHardlinks a hard link may name a
// file of the tree the archive is extracted onto, and becomes that file;
// a target missing there, a directory, one reached through a symlink or
// outside the root, or one the archive itself whited out, is refused
// naming the link, and nothing outside the target changes.
func TestLowerHardlinks(t *testing.T) {
	limits := Limits{LowerHardlinks: true}
	lowerTree := func(t *testing.T) sandbox {
		s := newSandbox(t)
		if err := os.MkdirAll(filepath.Join(s.target, "usr/bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.target, "usr/bin/python3.12"), []byte("lower"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(s.canary, filepath.Join(s.target, "out")); err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("admitted", func(t *testing.T) {
		s := lowerTree(t)
		b := build(t, dir("usr/"), hardlink("usr/bin/python3", "usr/bin/python3.12"), file("usr/bin/new", "n"), hardlink("usr/bin/new2", "usr/bin/new"))
		if _, err := Validate(context.Background(), bytes.NewReader(b), limits); err != nil {
			t.Fatalf("Validate: %v", err)
		}
		st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: limits})
		if err != nil || st.Hardlinks != 2 {
			t.Fatalf("Extract: %+v, %v; want 2 hard links", st, err)
		}
		s.intact(t)
		for link, target := range map[string]string{"usr/bin/python3": "usr/bin/python3.12", "usr/bin/new2": "usr/bin/new"} {
			a, errA := os.Lstat(filepath.Join(s.target, link))
			b, errB := os.Lstat(filepath.Join(s.target, target))
			if errA != nil || errB != nil || !os.SameFile(a, b) || a.Sys().(*syscall.Stat_t).Nlink != 2 {
				t.Errorf("%s: %v %v, want a second name of %s", link, errA, errB, target)
			}
		}
	})

	refusals := []struct {
		name  string
		ents  []ent
		rule  error
		entry string
	}{
		{"missing", []ent{hardlink("h", "usr/bin/python2")}, ErrHardlinkTarget, "h"},
		{"lower-directory", []ent{hardlink("h", "usr/bin")}, ErrHardlinkTarget, "h"},
		{"through-lower-symlink", []ent{hardlink("h", "out/secret")}, ErrThroughSymlink, "h"},
		{"outside", []ent{hardlink("h", "../canary/secret")}, ErrHardlinkEscape, "h"},
		{"whited-out-here", []ent{file("usr/bin/.wh.python3.12", ""), hardlink("h", "usr/bin/python3.12")}, ErrHardlinkTarget, "h"},
		{"under-opaque-dir", []ent{file("usr/bin/.wh..wh..opq", ""), hardlink("h", "usr/bin/python3.12")}, ErrHardlinkTarget, "h"},
	}
	for _, c := range refusals {
		t.Run(c.name, func(t *testing.T) {
			s := lowerTree(t)
			_, err := ExtractDir(context.Background(), bytes.NewReader(build(t, c.ents...)), s.target, ExtractOptions{Limits: limits})
			var pe *PolicyError
			if !errors.As(err, &pe) || pe.Rule != c.rule || pe.Entry != c.entry {
				t.Fatalf("Extract: %v, want %v naming %s", err, c.rule, c.entry)
			}
			s.intact(t)
			if _, err := os.Lstat(filepath.Join(s.target, c.entry)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after the refusal: %v, want it absent", c.entry, err)
			}
		})
	}

	// Without LowerHardlinks a link to a name the archive did not write is
	// refused before the tree is looked at.
	s := lowerTree(t)
	_, err := ExtractDir(context.Background(), bytes.NewReader(build(t, hardlink("h", "usr/bin/python3.12"))), s.target, ExtractOptions{})
	if !errors.Is(err, ErrHardlinkTarget) {
		t.Errorf("Extract without LowerHardlinks: %v, want %v", err, ErrHardlinkTarget)
	}
}

// TestLowerSymlinks: with Limits.LowerSymlinks a lower layer's symlink on
// the way to an entry, a whiteout or a hard link's target is followed
// inside the root: relative, absolute (taken from the root, not the host's)
// and climbing ones all land under the target, a loop is refused, and a
// symlink the archive made is still refused.
func TestLowerSymlinks(t *testing.T) {
	limits := Limits{LowerSymlinks: true, LowerHardlinks: true}
	lowerTree := func(t *testing.T) sandbox {
		s := newSandbox(t)
		mk := func(name string, f func(p string) error) {
			p := filepath.Join(s.target, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := f(p); err != nil {
				t.Fatal(err)
			}
		}
		mk("usr/lib/old.so", func(p string) error { return os.WriteFile(p, []byte("old"), 0o644) })
		mk("lib", func(p string) error { return os.Symlink("usr/lib", p) })
		mk("abs", func(p string) error { return os.Symlink("/usr/lib", p) })
		mk("host", func(p string) error { return os.Symlink(s.canary, p) })
		mk("deep/up", func(p string) error { return os.Symlink("../../../../..", p) })
		mk("loop1", func(p string) error { return os.Symlink("loop2", p) })
		mk("loop2", func(p string) error { return os.Symlink("loop1", p) })
		return s
	}
	read := func(t *testing.T, s sandbox, name string) string {
		b, err := os.ReadFile(filepath.Join(s.target, name))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}

	s := lowerTree(t)
	b := build(t,
		file("lib/new.so", "new"), file("abs/abs.so", "abs"), file("host/secret", "mine"),
		file("deep/up/top", "top"), dir("lib/sub/"), file("lib/sub/x", "x"),
		file("lib/.wh.old.so", ""), hardlink("abs/new2.so", "lib/new.so"),
	)
	st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: limits})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	s.intact(t)
	for name, want := range map[string]string{
		"usr/lib/new.so": "new", "usr/lib/abs.so": "abs", "usr/lib/sub/x": "x", "top": "top", "usr/lib/new2.so": "new",
		strings.TrimPrefix(filepath.Join(s.canary, "secret"), "/"): "mine",
	} {
		if got := read(t, s, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(s.target, "usr/lib/old.so")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("usr/lib/old.so, whited out as lib/.wh.old.so: %v, want it gone", err)
	}
	if got, err := os.Readlink(filepath.Join(s.target, "lib")); err != nil || got != "usr/lib" {
		t.Errorf("lib -> %q (%v), want the lower symlink kept", got, err)
	}
	if st.Hardlinks != 1 || st.Whiteouts != 1 {
		t.Errorf("Stats %+v: want 1 hard link and 1 whiteout", st)
	}

	for _, c := range []struct {
		name string
		ents []ent
		rule error
	}{
		{"loop", []ent{file("loop1/x", "x")}, ErrThroughSymlink},
		{"archive-symlink", []ent{symlink("mine", "usr"), file("mine/x", "x")}, ErrThroughSymlink},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := lowerTree(t)
			_, err := ExtractDir(context.Background(), bytes.NewReader(build(t, c.ents...)), s.target, ExtractOptions{Limits: limits})
			if !errors.Is(err, c.rule) {
				t.Errorf("Extract: %v, want %v", err, c.rule)
			}
			s.intact(t)
		})
	}

	// Without LowerSymlinks the same way is refused.
	s = lowerTree(t)
	_, err = ExtractDir(context.Background(), bytes.NewReader(build(t, file("lib/new.so", "new"))), s.target, ExtractOptions{})
	if !errors.Is(err, ErrThroughSymlink) {
		t.Errorf("Extract without LowerSymlinks: %v, want %v", err, ErrThroughSymlink)
	}
}

// TestLowerSymlinksRefuseArchiveSymlinks: with Limits.LowerSymlinks, a
// symlink the archive made is not followed when it is reached through a
// lower layer's symlink, where its name in the archive differs from the
// way taken (lower lib -> usr/lib, the archive's usr/lib/evil -> /etc
// reached as lib/evil): an entry written that way is refused
// (ErrThroughSymlink) and etc/passwd is left alone, and the time of a
// directory the archive made at lib/evil, replaced since by that symlink,
// is not set on etc. The same holds for a symlink the archive made
// through a lower layer's symlink (lower l -> x; the archive's l/y ->
// /etc is x/y) and reached by its real name (x/y/passwd), and for a hard
// link the archive made to its own symlink that way.
func TestLowerSymlinksRefuseArchiveSymlinks(t *testing.T) {
	lowerEtc := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	lowerTree := func(t *testing.T) sandbox {
		s := newSandbox(t)
		for _, d := range []string{"usr/lib", "etc"} {
			if err := os.MkdirAll(filepath.Join(s.target, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for name, target := range map[string]string{"lib": "usr/lib", "l": "x"} {
			if err := os.Symlink(target, filepath.Join(s.target, name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(filepath.Join(s.target, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.target, "etc/passwd"), []byte("root:x:0:0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(s.target, "etc"), lowerEtc, lowerEtc); err != nil {
			t.Fatal(err)
		}
		return s
	}
	opts := ExtractOptions{Limits: Limits{LowerSymlinks: true}, NoChown: true}

	t.Run("entry", func(t *testing.T) {
		s := lowerTree(t)
		b := build(t, symlink("usr/lib/evil", "/etc"), file("lib/evil/passwd", "owned\n"))
		_, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, opts)
		if got, err := os.ReadFile(filepath.Join(s.target, "etc/passwd")); err != nil || string(got) != "root:x:0:0\n" {
			t.Errorf("etc/passwd = %q (%v), want the lower layer's", got, err)
		}
		s.intact(t)
		checkRejection(t, "Extract", err, hostile{rule: ErrThroughSymlink, entry: "lib/evil/passwd"})
		if !strings.Contains(err.Error(), `"usr/lib/evil" is a symlink this archive made`) {
			t.Errorf("message %q does not name the archive's symlink", err)
		}
	})
	for name, c := range map[string]struct {
		ents  []ent
		entry string
		made  string // named in the message
	}{
		"entry, symlink made through a lower symlink": {[]ent{symlink("l/y", "/etc"), file("x/y/passwd", "owned\n")}, "x/y/passwd", "x/y"},
		"entry, hard link to the archive's symlink made through a lower symlink": {
			[]ent{symlink("s", "/etc"), hardlink("l/h", "s"), file("x/h/passwd", "owned\n")}, "x/h/passwd", "x/h"},
	} {
		t.Run(name, func(t *testing.T) {
			s := lowerTree(t)
			_, err := ExtractDir(context.Background(), bytes.NewReader(build(t, c.ents...)), s.target, opts)
			if got, err := os.ReadFile(filepath.Join(s.target, "etc/passwd")); err != nil || string(got) != "root:x:0:0\n" {
				t.Errorf("etc/passwd = %q (%v), want the lower layer's", got, err)
			}
			s.intact(t)
			checkRejection(t, "Extract", err, hostile{rule: ErrThroughSymlink, entry: c.entry})
			if !strings.Contains(err.Error(), `"`+c.made+`" is a symlink this archive made`) {
				t.Errorf("message %q does not name the archive's symlink %s", err, c.made)
			}
		})
	}
	for name, ents := range map[string][]ent{
		"directory times": {dir("lib/evil/"), symlink("usr/lib/evil", "/etc")},
		"directory times, symlink made through a lower symlink": {dir("x/y/"), symlink("l/y", "/etc")},
	} {
		t.Run(name, func(t *testing.T) {
			s := lowerTree(t)
			if _, err := ExtractDir(context.Background(), bytes.NewReader(build(t, ents...)), s.target, opts); err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if fi, err := os.Stat(filepath.Join(s.target, "etc")); err != nil || !fi.ModTime().Equal(lowerEtc) {
				t.Errorf("etc: mtime %v (%v), want the lower layer's %v: a directory's time was set through the archive's symlink", fi.ModTime(), err, lowerEtc)
			}
			s.intact(t)
		})
	}
}

// TestWhiteoutsOfAnyType: a whiteout is told by its name alone, as
// containerd's applier tells it, under the S3 layers' rules and the
// registry layers' alike. Docker on aufs wrote the second and later
// whiteouts of a layer as hard links to the first, and its layers carry
// the aufs metadata directory .wh..wh.plnk/, whose files the layer's hard
// links may name. Each .wh.<name>, whatever its type, removes <name> and
// creates nothing (a hard link among them links nothing, whatever its
// target); the other .wh..wh. names are skipped whatever their type, and
// what is below them is written as any entry.
func TestWhiteoutsOfAnyType(t *testing.T) {
	removed := []string{"etc/a", "etc/b", "etc/c", "etc/d", "etc/e", "etc/f", "etc/sub"}
	lowerTree := func(t *testing.T) sandbox {
		s := newSandbox(t)
		if err := os.MkdirAll(filepath.Join(s.target, "etc/sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range append(removed[:len(removed)-1:len(removed)-1], "etc/sub/x", "etc/kept") {
			if err := os.WriteFile(filepath.Join(s.target, n), []byte("lower"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	b := build(t,
		dir("etc/"),
		file("etc/.wh.a", "").mode(0o444),
		hardlink("etc/.wh.b", "etc/.wh.a"),
		hardlink("etc/.wh.c", "../../canary/secret"), // never a link: its target is not looked at
		dir("etc/.wh.sub/"),
		symlink("etc/.wh.d", "/etc/shadow"),
		special("etc/.wh.e", tar.TypeFifo),
		special("etc/.wh.f", tar.TypeChar), // creates nothing: not a device node to refuse
		dir(".wh..wh.plnk/").mode(0o700),
		file(".wh..wh.plnk/1234.5678", "aufs"),
		hardlink("usr/bin/tool", ".wh..wh.plnk/1234.5678"),
		file(".wh..wh.aufs", ""),
		symlink(".wh..wh.orph", "/"),
	)
	for _, c := range []struct {
		name   string
		limits Limits
	}{
		{"s3", Limits{}},
		{"registry", Limits{AllowSetID: true, AllowDeviceNodes: true, LowerHardlinks: true, LowerSymlinks: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep, err := Validate(context.Background(), bytes.NewReader(b), c.limits)
			if err != nil || rep.Whiteouts != len(removed) || rep.Hardlinks != 1 {
				t.Fatalf("Validate: %+v, %v; want %d whiteouts and 1 hard link admitted", rep, err, len(removed))
			}
			s := lowerTree(t)
			st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: c.limits})
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			s.intact(t)
			if st.Whiteouts != len(removed) || st.Removed != len(removed) || st.Hardlinks != 1 {
				t.Errorf("Stats %+v: want %d whiteouts removing %d names, 1 hard link", st, len(removed), len(removed))
			}
			for _, n := range append(removed, "etc/.wh.a", "etc/.wh.b", "etc/.wh.c", "etc/.wh.sub", "etc/.wh.d", "etc/.wh.e", "etc/.wh.f", ".wh..wh.aufs", ".wh..wh.orph") {
				if _, err := os.Lstat(filepath.Join(s.target, n)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s: %v, want it absent", n, err)
				}
			}
			if got, err := os.ReadFile(filepath.Join(s.target, "etc/kept")); err != nil || string(got) != "lower" {
				t.Errorf("etc/kept = %q (%v), want the lower layer's", got, err)
			}
			a, errA := os.Lstat(filepath.Join(s.target, "usr/bin/tool"))
			p, errP := os.Lstat(filepath.Join(s.target, ".wh..wh.plnk/1234.5678"))
			if errA != nil || errP != nil || !os.SameFile(a, p) {
				t.Errorf("usr/bin/tool: %v %v, want a second name of .wh..wh.plnk/1234.5678", errA, errP)
			}
		})
	}
}

// TestKeepRootMetadata: with ExtractOptions.KeepRootMetadata an entry
// naming the archive root (./, or rootfs/ when that is the root) leaves
// the root's mode, owner, extended attributes and times as they were, as
// containerd's applier leaves them: a layer made with `tar -c .` by a
// build user does not make / private to that user. The entry is still
// checked and counted. Without the option (S3 layers, whose first layer
// gives the device's root) it is applied.
func TestKeepRootMetadata(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the root entry gives an owner: run the tests as root")
	}
	lowerTime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	root := func(name string) ent {
		return dir(name).mode(0o700).owner(1000, 1000).pax("SCHILY.xattr.user.root", "layer")
	}
	cases := []struct {
		name string
		ents []ent
		opts ExtractOptions
	}{
		{"root", []ent{root("./"), file("./etc/new", "n")}, ExtractOptions{}},
		{"detected", []ent{root("./"), file("./etc/new", "n")}, ExtractOptions{DetectRootfs: true}},
		{"rootfs", []ent{root("rootfs/"), file("rootfs/etc/new", "n")}, ExtractOptions{StripRootfs: true}},
	}
	for _, c := range cases {
		for _, keep := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/keep=%v", c.name, keep), func(t *testing.T) {
				s := newSandbox(t)
				if err := os.Mkdir(filepath.Join(s.target, "etc"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(s.target, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Chtimes(s.target, lowerTime, lowerTime); err != nil {
					t.Fatal(err)
				}
				opts := c.opts
				opts.KeepRootMetadata = keep
				st, err := ExtractDir(context.Background(), bytes.NewReader(build(t, c.ents...)), s.target, opts)
				if err != nil {
					t.Fatalf("Extract: %v", err)
				}
				s.intact(t)
				if b, err := os.ReadFile(filepath.Join(s.target, "etc/new")); err != nil || string(b) != "n" {
					t.Errorf("etc/new = %q (%v), want the layer's", b, err)
				}
				var sb unix.Stat_t
				if err := unix.Stat(s.target, &sb); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 16)
				n, xerr := unix.Getxattr(s.target, "user.root", buf)
				got := fmt.Sprintf("mode %04o uid %d gid %d mtime %v xattr %q (%v)", sb.Mode&0o7777, sb.Uid, sb.Gid,
					time.Unix(sb.Mtim.Unix()).UTC(), buf[:max(n, 0)], xerr)
				want := fmt.Sprintf("mode 0755 uid 0 gid 0 mtime %v xattr \"\" (%v)", lowerTime, unix.ENODATA)
				if !keep {
					want = fmt.Sprintf("mode 0700 uid 1000 gid 1000 mtime %v xattr \"layer\" (<nil>)", testTime)
				}
				if got != want {
					t.Errorf("root after the extraction: %s, want %s", got, want)
				}
				if wantDirs := map[bool]int{true: 0, false: 1}[keep]; st.Entries != 2 || st.Dirs != wantDirs {
					t.Errorf("Stats %+v: want 2 entries read, %d directories applied", st, wantDirs)
				}
			})
		}
	}

	// Kept or not, the root entry is held to the rules.
	for _, h := range []hostile{
		{name: "symlink", ents: func(c string) []ent { return []ent{symlink("./", c)} }, rule: ErrRootNotDir, entry: "./"},
		{name: "setuid", ents: func(string) []ent { return []ent{dir("./").mode(0o4755)} }, rule: ErrSetID, entry: "./"},
		{name: "too-many", ents: func(string) []ent { return rootEntries(MaxRootEntries+1, nil) }, rule: ErrTooManyRootEntries},
	} {
		t.Run("refused/"+h.name, func(t *testing.T) {
			s := newSandbox(t)
			_, err := ExtractDir(context.Background(), bytes.NewReader(h.archive(t, s)), s.target, ExtractOptions{KeepRootMetadata: true})
			checkRejection(t, "Extract", err, h)
			s.intact(t)
		})
	}
}

// TestRootRelativeNames: with Limits.RootRelativeNames an absolute entry
// name or hard link target is taken from the root, as containerd's
// applier takes it: ko writes /ko-app/<name> and /var/run/ko/..., and some
// builders list the root as "/" and link to /etc/<file>. ".." in such a
// name stops at the root, and "/" is the root, whose metadata
// KeepRootMetadata keeps. Without the limit (the S3 layers' rules) the
// same archive is refused (ErrAbsoluteName), and so is an absolute hard
// link target (ErrHardlinkEscape).
func TestRootRelativeNames(t *testing.T) {
	b := build(t,
		dir("/").mode(0o700).owner(1000, 1000),
		dir("ko-app/").mode(0o555),
		file("/ko-app/app", "binary").mode(0o555),
		dir("/var").mode(0o555), dir("/var/run").mode(0o555), dir("//var/run/ko/"),
		file("/var/run/ko/index.html", "<html>"),
		file("/etc/a", "a"), hardlink("/etc/b", "/etc/a"), hardlink("etc/c", "/../etc/a"),
		file("/../../up", "clamped"),
	)
	limits := Limits{RootRelativeNames: true}
	rep, err := Validate(context.Background(), bytes.NewReader(b), limits)
	if err != nil || rep.Files != 4 || rep.Hardlinks != 2 {
		t.Fatalf("Validate: %+v, %v; want 4 files and 2 hard links admitted", rep, err)
	}
	s := newSandbox(t)
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: limits, KeepRootMetadata: true}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	s.intact(t)
	for name, want := range map[string]string{"ko-app/app": "binary", "var/run/ko/index.html": "<html>", "etc/b": "a", "etc/c": "a", "up": "clamped"} {
		if got, err := os.ReadFile(filepath.Join(s.target, name)); err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
	a, errA := os.Lstat(filepath.Join(s.target, "etc/a"))
	l, errL := os.Lstat(filepath.Join(s.target, "etc/b"))
	if errA != nil || errL != nil || !os.SameFile(a, l) {
		t.Errorf("etc/b: %v %v, want a second name of etc/a", errA, errL)
	}
	if fi, err := os.Stat(s.target); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the root after an entry \"/\" of mode 0700: %v (%v), want 0755 kept", fi.Mode(), err)
	}

	for _, c := range []struct {
		ents  []ent
		rule  error
		entry string
	}{
		{[]ent{dir("ko-app/"), file("/ko-app/app", "binary")}, ErrAbsoluteName, "/ko-app/app"},
		{[]ent{dir("/")}, ErrAbsoluteName, "/"},
		{[]ent{file("etc/a", "a"), hardlink("etc/b", "/etc/a")}, ErrHardlinkEscape, "etc/b"},
	} {
		b := build(t, c.ents...)
		_, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
		checkRejection(t, "Validate without RootRelativeNames", err, hostile{rule: c.rule, entry: c.entry})
		_, err = ExtractDir(context.Background(), bytes.NewReader(b), newSandbox(t).target, ExtractOptions{})
		checkRejection(t, "Extract without RootRelativeNames", err, hostile{rule: c.rule, entry: c.entry})
	}
}

// TestAllowMissingEndMarker: with Limits.AllowMissingEndMarker an archive
// ending after an entry without its end-of-archive marker (as estargz
// writes zstd:chunked layers) is accepted, plain or compressed, with the
// diff ID of the bytes it has; one cut inside an entry's header, content
// or padding is still malformed. Without the limit (the S3 layers' rules)
// the marker is required.
func TestAllowMissingEndMarker(t *testing.T) {
	whole := build(t, file("etc/a", "a"), file("etc/hello", strings.Repeat("h", 600)))
	// etc/a: header and one padded block; etc/hello: header and two.
	noMarker := whole[:5*512]
	limits := Limits{AllowMissingEndMarker: true}
	for name, blob := range map[string][]byte{"plain": noMarker, "gzip": s3test.Gzip(t, noMarker), "zstd": s3test.Zstd(t, noMarker)} {
		t.Run(name, func(t *testing.T) {
			rep, err := Validate(context.Background(), bytes.NewReader(blob), limits)
			if err != nil || rep.Files != 2 || rep.DiffID != sha(noMarker) {
				t.Errorf("Validate: %+v, %v; want 2 files and diff ID %s", rep, err, sha(noMarker))
			}
			s := newSandbox(t)
			st, err := ExtractDir(context.Background(), bytes.NewReader(blob), s.target, ExtractOptions{Limits: limits, HashStream: true, NoChown: true})
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if name != "plain" && st.DiffID != sha(noMarker) {
				t.Errorf("Extract: diff ID %s, want %s", st.DiffID, sha(noMarker))
			}
			if got, err := os.ReadFile(filepath.Join(s.target, "etc/hello")); err != nil || len(got) != 600 {
				t.Errorf("etc/hello: %d bytes (%v), want 600", len(got), err)
			}
			_, err = Validate(context.Background(), bytes.NewReader(blob), Limits{})
			checkRejection(t, "Validate without AllowMissingEndMarker", err, hostile{rule: ErrMalformed, entry: "etc/hello"})
		})
	}
	for name, c := range map[string]struct {
		n     int
		entry string
	}{
		"in a header":  {2*512 + 300, "etc/a"},
		"in a content": {3*512 + 100, "etc/hello"},
		"in a padding": {4*512 + 100, "etc/hello"},
	} {
		t.Run("cut "+name, func(t *testing.T) {
			_, err := Validate(context.Background(), bytes.NewReader(whole[:c.n]), limits)
			checkRejection(t, "Validate", err, hostile{rule: ErrMalformed, entry: c.entry})
			_, err = ExtractDir(context.Background(), bytes.NewReader(whole[:c.n]), newSandbox(t).target, ExtractOptions{Limits: limits, NoChown: true})
			checkRejection(t, "Extract", err, hostile{rule: ErrMalformed, entry: c.entry})
		})
	}
}

// TestOpaqueWhiteoutThroughALowerSymlinkToItsOwnDirectory: with
// Limits.LowerSymlinks, an opaque whiteout named through a lower layer's
// symlink that points at the directory holding it (a/self -> .) clears
// that directory, the symlink among the rest, as containerd's applier
// does: the names after the symlink are found by the directory's real
// path, not through the symlink just removed, and a directory the layer
// wrote there is cleared of the lower layer's files too.
func TestOpaqueWhiteoutThroughALowerSymlinkToItsOwnDirectory(t *testing.T) {
	s := newSandbox(t)
	a := filepath.Join(s.target, "a")
	if err := os.MkdirAll(filepath.Join(a, "w"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "w", "lower"), []byte("lower"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Lower names on both sides of the symlink, whatever order the file
	// system lists them in.
	for i := range 10 {
		if err := os.WriteFile(filepath.Join(a, fmt.Sprintf("f%d", i)), []byte("lower"), 0o644); err != nil {
			t.Fatal(err)
		}
		if i == 4 {
			if err := os.Symlink(".", filepath.Join(a, "self")); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := build(t, file("a/self/w/new", "new"), file("a/self/.wh..wh..opq", ""))
	opts := ExtractOptions{Limits: Limits{LowerSymlinks: true}, NoChown: true}
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, opts); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	s.intact(t)
	var left []string
	err := filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != a {
			rel, _ := filepath.Rel(a, p)
			left = append(left, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"w", "w/new"}; !slices.Equal(left, want) {
		t.Errorf("a holds %v, want %v: the layer's file only", left, want)
	}
}

// TestHardLinkToAFileItsOwnNameReplaces: a hard link whose target lies in
// the directory its own name replaces, reached through a lower symlink
// (lower b -> a; entry a, a hard link to b/c/c), has no target once its
// name is cleared. That is the layer's fault, refused as a hard link to
// nothing in the tree (ErrHardlinkTarget, not retried), not an I/O error
// worth another attempt.
func TestHardLinkToAFileItsOwnNameReplaces(t *testing.T) {
	s := newSandbox(t)
	if err := os.MkdirAll(filepath.Join(s.target, "a", "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.target, "a", "c", "c"), []byte("lower"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", filepath.Join(s.target, "b")); err != nil {
		t.Fatal(err)
	}
	b := build(t, hardlink("a", "b/c/c"))
	opts := ExtractOptions{Limits: Limits{LowerSymlinks: true, LowerHardlinks: true}, NoChown: true}
	_, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, opts)
	var pe *PolicyError
	if !errors.Is(err, ErrHardlinkTarget) || !errors.As(err, &pe) {
		t.Fatalf("Extract: %v; want the layer refused for a hard link to nothing in the tree (%v)", err, ErrHardlinkTarget)
	}
	s.intact(t)
}
