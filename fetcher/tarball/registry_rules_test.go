package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
