package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDirListedTwiceKeepsLastTimes: a directory the archive lists twice
// (again after its files, or after a file replaced it) ends with its last
// entry's mode and times, as containerd's applier leaves it.
func TestDirListedTwiceKeepsLastTimes(t *testing.T) {
	t1 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	t2 := time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(e ent, mtime time.Time) ent { e.hdr.ModTime = mtime; return e }
	for name, ents := range map[string][]ent{
		"listed twice": {at(dir("d/"), t1), file("d/f", "x"), at(dir("d/").mode(0o750), t2)},
		"replaced":     {at(dir("d/"), t1), file("d", "x"), at(dir("d/").mode(0o750), t2)},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSandbox(t)
			if _, err := ExtractDir(context.Background(), bytes.NewReader(build(t, ents...)), s.target, ExtractOptions{}); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(filepath.Join(s.target, "d"))
			if err != nil || !fi.IsDir() {
				t.Fatalf("d: %v, %v; want a directory", fi, err)
			}
			if !fi.ModTime().Equal(t2) || fi.Mode().Perm() != 0o750 {
				t.Errorf("d: mtime %v, mode %o; want the last entry's %v, 750", fi.ModTime().UTC(), fi.Mode().Perm(), t2)
			}
		})
	}
}

// TestOpaqueWhiteoutThroughALowerSymlinkKeepsTheLayersFiles: over a lower
// tree with lib -> usr/lib (usr-merge), a registry layer writes a file in
// usr/lib/x and gives the same directory an opaque whiteout, naming it
// through the symlink or not, in either order. The whiteout hides the
// lower layer's file only: the file this layer wrote stays, as with
// containerd's applier.
func TestOpaqueWhiteoutThroughALowerSymlinkKeepsTheLayersFiles(t *testing.T) {
	for name, ents := range map[string][]ent{
		"file, then marker through the symlink": {file("usr/lib/x/new", "new"), file("lib/x/.wh..wh..opq", "")},
		"marker through the symlink, then file": {file("lib/x/.wh..wh..opq", ""), file("usr/lib/x/new", "new")},
		"file through the symlink, then marker": {file("lib/x/new", "new"), file("usr/lib/x/.wh..wh..opq", "")},
		"marker under both names":               {file("usr/lib/x/new", "new"), file("usr/lib/x/.wh..wh..opq", ""), file("lib/x/.wh..wh..opq", "")},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSandbox(t)
			if err := os.MkdirAll(filepath.Join(s.target, "usr/lib/x"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(s.target, "usr/lib/x/lower"), []byte("lower"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("usr/lib", filepath.Join(s.target, "lib")); err != nil {
				t.Fatal(err)
			}
			opts := ExtractOptions{Limits: Limits{LowerSymlinks: true}, NoChown: true}
			if _, err := ExtractDir(context.Background(), bytes.NewReader(build(t, ents...)), s.target, opts); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(s.target, "usr/lib/x/new")); err != nil || string(b) != "new" {
				t.Errorf("usr/lib/x/new, which the layer wrote: %q, %v", b, err)
			}
			if _, err := os.Lstat(filepath.Join(s.target, "usr/lib/x/lower")); !os.IsNotExist(err) {
				t.Errorf("usr/lib/x/lower, the lower layer's: %v, want it hidden", err)
			}
		})
	}
}

// TestNameUnderAReplacedDirectoryIsNew: a layer makes symlink d/s, then
// whites d out (or replaces it by a file and makes it again), then writes
// d/s/x. d/s is gone by then, so d/s/x is written under a new directory
// d/s, as containerd's applier writes it, instead of being refused as a
// write through the old symlink; Validate takes the layer too.
func TestNameUnderAReplacedDirectoryIsNew(t *testing.T) {
	for name, ents := range map[string][]ent{
		"whited out": {dir("d/"), symlink("d/s", "/etc"), file(".wh.d", ""), file("d/s/x", "y")},
		"replaced":   {dir("d/"), symlink("d/s", "/etc"), file("d", ""), dir("d/"), file("d/s/x", "y")},
	} {
		t.Run(name, func(t *testing.T) {
			b := build(t, ents...)
			if _, err := Validate(context.Background(), bytes.NewReader(b), Limits{}); err != nil {
				t.Errorf("Validate: %v", err)
			}
			s := newSandbox(t)
			if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{}); err != nil {
				t.Fatalf("Extract: %v", err)
			}
			s.intact(t)
			if fi, err := os.Lstat(filepath.Join(s.target, "d/s")); err != nil || !fi.IsDir() {
				t.Errorf("d/s: %v, %v; want a directory", fi, err)
			}
			if b, err := os.ReadFile(filepath.Join(s.target, "d/s/x")); err != nil || string(b) != "y" {
				t.Errorf("d/s/x: %q, %v", b, err)
			}
		})
	}
}

// TestEntryTimesAsContainerdSetsThem: an entry's modification time before
// the epoch is the epoch, and its access time is never older than its
// modification time, as containerd's applier sets them.
func TestEntryTimesAsContainerdSetsThem(t *testing.T) {
	early := file("early", "x")
	early.hdr.ModTime = time.Unix(-86400, 0)
	older := file("older", "x").format(tar.FormatPAX)
	older.hdr.ModTime, older.hdr.AccessTime = time.Unix(2_000_000_000, 0), time.Unix(1_000_000_000, 0)
	newer := file("newer", "x").format(tar.FormatPAX)
	newer.hdr.ModTime, newer.hdr.AccessTime = time.Unix(1_000_000_000, 0), time.Unix(2_000_000_000, 0)
	s := newSandbox(t)
	if _, err := ExtractDir(context.Background(), bytes.NewReader(build(t, early, older, newer)), s.target, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name         string
		atime, mtime int64
	}{{"early", 0, 0}, {"older", 2_000_000_000, 2_000_000_000}, {"newer", 2_000_000_000, 1_000_000_000}} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(s.target, c.name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Atim.Sec != c.atime || st.Mtim.Sec != c.mtime {
			t.Errorf("%s: atime %d, mtime %d; want %d, %d", c.name, st.Atim.Sec, st.Mtim.Sec, c.atime, c.mtime)
		}
	}
}

// TestHardLinkHeaderSetsTheFilesMetadata: a hard link entry's owner, mode,
// user.* attribute and times are the file's once it is applied, as
// containerd's applier leaves them (the last header applied wins), for a
// link to a file of the archive and to a lower layer's; a link to a
// symlink changes its owner and times only. A hard link whose header
// carries a setuid or setgid bit is refused without Limits.AllowSetID, as
// a file with one is.
func TestHardLinkHeaderSetsTheFilesMetadata(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("setting owners takes root: run the tests as root")
	}
	mtime := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
	link := func(name, target string) ent {
		e := hardlink(name, target).mode(0o750).owner(1000, 1001).pax("SCHILY.xattr.user.k", "v")
		e.hdr.ModTime = mtime
		return e
	}
	symLink := hardlink("s2", "s").owner(1000, 1001)
	symLink.hdr.ModTime = mtime
	limits := Limits{LowerHardlinks: true, AllowSetID: true}
	s := newSandbox(t)
	if err := os.WriteFile(filepath.Join(s.target, "lower"), []byte("lower"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := build(t, file("f", "x").mode(0o644), link("f2", "f"), link("lower2", "lower"), symlink("s", "f"), symLink)
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: limits}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"f", "lower"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(s.target, name), &st); err != nil {
			t.Fatal(err)
		}
		v, err := unix.Lgetxattr(filepath.Join(s.target, name), "user.k", make([]byte, 8))
		if st.Mode&0o7777 != 0o750 || st.Uid != 1000 || st.Gid != 1001 || st.Nlink != 2 || st.Mtim.Sec != mtime.Unix() || err != nil || v != 1 {
			t.Errorf("%s: mode %o, owner %d:%d, %d names, mtime %d, user.k %d bytes (%v); want the link's 750, 1000:1001, 2, %d, 1 byte",
				name, st.Mode&0o7777, st.Uid, st.Gid, st.Nlink, st.Mtim.Sec, v, err, mtime.Unix())
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(s.target, "s"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK || st.Uid != 1000 || st.Mtim.Sec != mtime.Unix() {
		t.Errorf("s: %+v, %v; want a symlink owned by 1000 with the link's mtime", st, err)
	}

	for name, e := range map[string]ent{"setuid": hardlink("f2", "f").mode(0o4755), "setgid": hardlink("f2", "f").mode(0o2755)} {
		_, err := ExtractDir(context.Background(), bytes.NewReader(build(t, file("f", "x"), e)), newSandbox(t).target, ExtractOptions{})
		if !errors.Is(err, ErrSetID) {
			t.Errorf("a hard link with a %s bit: %v, want %v", name, err, ErrSetID)
		}
	}
}

// TestHardLinkToALowerSymlinkOnAnEntrysPath: an entry written through a
// lower layer's symlink (c -> d) makes c a directory as far as its name
// tells; a later hard link to c names the symlink, and is made, as
// containerd's applier makes it. A hard link to a directory an entry's
// path made is still refused.
func TestHardLinkToALowerSymlinkOnAnEntrysPath(t *testing.T) {
	limits := Limits{LowerHardlinks: true, LowerSymlinks: true}
	s := newSandbox(t)
	if err := os.Symlink("d", filepath.Join(s.target, "c")); err != nil {
		t.Fatal(err)
	}
	b := build(t, file("c/g", "g"), hardlink("h", "c"))
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: limits}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	c, errC := os.Lstat(filepath.Join(s.target, "c"))
	h, errH := os.Lstat(filepath.Join(s.target, "h"))
	if errC != nil || errH != nil || !os.SameFile(c, h) || h.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("h: %v, %v; want a second name of the symlink c", errH, errC)
	}
	if got, err := os.ReadFile(filepath.Join(s.target, "d/g")); err != nil || string(got) != "g" {
		t.Errorf("d/g: %q, %v; want the entry written through c", got, err)
	}
	s.intact(t)

	_, err := ExtractDir(context.Background(), bytes.NewReader(build(t, file("x/y", "y"), hardlink("h", "x"))), newSandbox(t).target, ExtractOptions{Limits: limits})
	if !errors.Is(err, ErrHardlinkTarget) {
		t.Errorf("a hard link to a directory an entry's path made: %v, want %v", err, ErrHardlinkTarget)
	}
}
