package tarball

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
	"time"
)

// Archive builders for the tests: every hostile and real-world archive of
// the tests is made here with archive/tar, none is a checked-in binary.

var testTime = time.Date(2024, 3, 1, 12, 30, 45, 0, time.UTC)

type ent struct {
	hdr  tar.Header
	body string
}

func file(name, body string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: testTime}, body: body}
}

func dir(name string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: testTime}}
}

func symlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: testTime}}
}

func hardlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644, ModTime: testTime}}
}

func special(name string, typ byte) ent {
	return ent{hdr: tar.Header{Typeflag: typ, Name: name, Mode: 0o644, ModTime: testTime, Devmajor: 1, Devminor: 3}}
}

func (e ent) mode(m int64) ent        { e.hdr.Mode = m; return e }
func (e ent) owner(uid, gid int) ent  { e.hdr.Uid, e.hdr.Gid = uid, gid; return e }
func (e ent) format(f tar.Format) ent { e.hdr.Format = f; return e }
func (e ent) pax(k, v string) ent {
	if e.hdr.PAXRecords == nil {
		e.hdr.PAXRecords = map[string]string{}
	}
	e.hdr.PAXRecords[k] = v
	e.hdr.Format = tar.FormatPAX
	return e
}

// prefixed returns the entries with every name (and hard link target) under
// prefix, as a tarball with a rootfs/ folder has them.
func prefixed(prefix string, ents []ent) []ent {
	out := make([]ent, 0, len(ents)+1)
	for _, e := range ents {
		e.hdr.Name = prefix + e.hdr.Name
		if e.hdr.Typeflag == tar.TypeLink {
			e.hdr.Linkname = prefix + e.hdr.Linkname
		}
		out = append(out, e)
	}
	return out
}

func writeEntries(tb testing.TB, w io.Writer, ents []ent) {
	tb.Helper()
	tw := tar.NewWriter(w)
	for _, e := range ents {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			tb.Fatalf("build archive: header %q: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			tb.Fatalf("build archive: body %q: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatalf("build archive: close: %v", err)
	}
}

func build(tb testing.TB, ents ...ent) []byte {
	tb.Helper()
	var buf bytes.Buffer
	writeEntries(tb, &buf, ents)
	return buf.Bytes()
}

// zeros is an endless reader of zero bytes that allocates nothing.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// streamed returns a reader of an archive generated on the fly by gen on
// another goroutine, so tests of the size and count limits never hold the
// archive in memory. The returned stop function ends the generator.
func streamed(gen func(tw *tar.Writer) error) (io.Reader, func()) {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := gen(tw)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr, func() { pr.CloseWithError(io.ErrClosedPipe) }
}

// realWorld is a small image as real distributions make it: usr-merge
// symlinks, absolute symlinks (Debian's alternatives), hard links, a long
// name needing PAX or GNU headers, non-ASCII names, a setgid and a sticky
// directory, a fifo, other owners, a user xattr.
func realWorld() []ent {
	long := "usr/share/doc/" + string(bytes.Repeat([]byte("very-long-directory-name-"), 6)) + "/" +
		string(bytes.Repeat([]byte("x"), 200)) + ".txt"
	return []ent{
		dir("etc/"),
		dir("etc/alternatives/"),
		dir("usr/"),
		dir("usr/bin/"),
		dir("usr/lib/"),
		dir("var/"),
		dir("var/mail/").mode(0o2775).owner(0, 8),
		dir("tmp/").mode(0o1777),
		symlink("bin", "usr/bin"),
		symlink("lib", "usr/lib"),
		file("usr/bin/vim.basic", "#!vim\n").mode(0o755),
		symlink("etc/alternatives/vi", "/usr/bin/vim.basic"),
		symlink("usr/bin/vi", "/etc/alternatives/vi"),
		symlink("usr/bin/ex", "vim.basic"),
		symlink("usr/lib/os-release", "../../etc/os-release"),
		file("etc/os-release", "ID=test\n"),
		file("usr/bin/perl", "perl binary").mode(0o755),
		hardlink("usr/bin/perl5.36", "usr/bin/perl"),
		file("etc/motd", "hello").owner(1000, 1000).pax("SCHILY.xattr.user.comment", "kept"),
		file(long, "long name"),
		file("usr/share/ü-名前.txt", "utf-8 name"),
		special("var/run-fifo", tar.TypeFifo),
	}
}
