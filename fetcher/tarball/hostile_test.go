package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// sandbox is a target directory with a sibling canary directory: whatever an
// archive does, the canary and the parent must look the same afterwards.
type sandbox struct {
	parent, target, canary string
}

func newSandbox(t testing.TB) sandbox {
	t.Helper()
	p := t.TempDir()
	s := sandbox{parent: p, target: filepath.Join(p, "target"), canary: filepath.Join(p, "canary")}
	for _, d := range []string{s.target, s.canary} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.canary, "secret"), []byte("canary"), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// intact fails the test if anything outside target changed.
func (s sandbox) intact(t testing.TB) {
	t.Helper()
	names := func(dir string) []string {
		es, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("read %s: %v", dir, err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	if got := names(s.parent); !slices.Equal(got, []string{"canary", "target"}) {
		t.Errorf("parent of the target now holds %v, want [canary target]", got)
	}
	if got := names(s.canary); !slices.Equal(got, []string{"secret"}) {
		t.Errorf("canary dir now holds %v, want [secret]", got)
	}
	fi, err := os.Lstat(filepath.Join(s.canary, "secret"))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("canary/secret changed: %v %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(s.canary, "secret")); err != nil || string(b) != "canary" {
		t.Errorf("canary/secret content now %q (%v)", b, err)
	}
}

type hostile struct {
	name   string
	ents   func(canary string) []ent // the archive, or
	raw    func(t testing.TB) []byte // raw bytes
	limits Limits
	rule   error  // the rule (or ErrMalformed)
	entry  string // the entry named
	absent string // a name in the target that must not exist afterwards
}

func hostileCorpus() []hostile {
	big := strings.Repeat("x", 4096)
	return []hostile{
		{name: "traversal", ents: func(string) []ent { return []ent{file("../canary/pwned", "x")} },
			rule: ErrTraversal, entry: "../canary/pwned"},
		{name: "traversal-nested", ents: func(string) []ent { return []ent{dir("a/"), file("a/../../canary/pwned", "x")} },
			rule: ErrTraversal, entry: "a/../../canary/pwned"},
		{name: "traversal-dotslash", ents: func(string) []ent { return []ent{file("./../canary/pwned", "x")} },
			rule: ErrTraversal, entry: "./../canary/pwned"},
		{name: "absolute-name", ents: func(c string) []ent { return []ent{file(c+"/pwned", "x")} },
			rule: ErrAbsoluteName},
		{name: "symlink-climbing-out", ents: func(string) []ent { return []ent{symlink("esc", "../canary")} },
			rule: ErrSymlinkEscape, entry: "esc", absent: "esc"},
		{name: "symlink-climbing-out-deep", ents: func(string) []ent {
			return []ent{dir("a/"), dir("a/b/"), symlink("a/b/esc", "../../../canary/secret")}
		}, rule: ErrSymlinkEscape, entry: "a/b/esc", absent: "a/b/esc"},
		{name: "file-through-absolute-symlink", ents: func(c string) []ent {
			return []ent{symlink("abs", c), file("abs/pwned", "x")}
		}, rule: ErrThroughSymlink, entry: "abs/pwned"},
		{name: "file-through-relative-symlink", ents: func(string) []ent {
			return []ent{dir("d/"), symlink("l", "d"), file("l/x", "x")}
		}, rule: ErrThroughSymlink, entry: "l/x", absent: "d/x"},
		{name: "dir-through-symlink", ents: func(c string) []ent {
			return []ent{symlink("abs", c), dir("abs/newdir/")}
		}, rule: ErrThroughSymlink, entry: "abs/newdir/"},
		{name: "hardlink-out", ents: func(string) []ent { return []ent{hardlink("h", "../canary/secret")} },
			rule: ErrHardlinkEscape, entry: "h", absent: "h"},
		{name: "hardlink-absolute", ents: func(c string) []ent { return []ent{hardlink("h", c+"/secret")} },
			rule: ErrHardlinkEscape, entry: "h", absent: "h"},
		{name: "hardlink-through-symlink", ents: func(c string) []ent {
			return []ent{symlink("abs", c), hardlink("h", "abs/secret")}
		}, rule: ErrHardlinkTarget, entry: "h", absent: "h"},
		{name: "hardlink-unseen", ents: func(string) []ent { return []ent{hardlink("h", "etc/shadow")} },
			rule: ErrHardlinkTarget, entry: "h", absent: "h"},
		{name: "hardlink-to-dir", ents: func(string) []ent { return []ent{dir("d/"), hardlink("h", "d")} },
			rule: ErrHardlinkTarget, entry: "h", absent: "h"},
		{name: "setuid", ents: func(string) []ent { return []ent{file("su", "x").mode(0o4755)} },
			rule: ErrSetID, entry: "su", absent: "su"},
		{name: "setgid-file", ents: func(string) []ent { return []ent{file("sg", "x").mode(0o2755)} },
			rule: ErrSetID, entry: "sg", absent: "sg"},
		{name: "setuid-dir", ents: func(string) []ent { return []ent{dir("d/").mode(0o4755)} },
			rule: ErrSetID, entry: "d/", absent: "d"},
		{name: "file-capability", ents: func(string) []ent {
			return []ent{file("ping", "x").pax("SCHILY.xattr.security.capability", "\x01\x00\x00\x02")}
		}, rule: ErrFileCapability, entry: "ping", absent: "ping"},
		{name: "char-device", ents: func(string) []ent { return []ent{special("null", tar.TypeChar)} },
			rule: ErrDeviceNode, entry: "null", absent: "null"},
		{name: "block-device", ents: func(string) []ent { return []ent{special("sda", tar.TypeBlock)} },
			rule: ErrDeviceNode, entry: "sda", absent: "sda"},
		{name: "too-many-entries", ents: func(string) []ent {
			var es []ent
			for i := range 11 {
				es = append(es, file(string(rune('a'+i)), ""))
			}
			return es
		}, limits: Limits{MaxEntries: 10}, rule: ErrTooManyEntries, entry: "k", absent: "k"},
		{name: "oversized-file", ents: func(string) []ent { return []ent{file("small", "x"), file("big", big)} },
			limits: Limits{MaxFileSize: 4095}, rule: ErrFileTooLarge, entry: "big", absent: "big"},
		{name: "total-too-large", ents: func(string) []ent {
			return []ent{file("a", big), file("b", big), file("c", big)}
		}, limits: Limits{MaxTotalSize: 3*4096 - 1}, rule: ErrTotalTooLarge, entry: "c", absent: "c"},
		{name: "truncated-in-body", raw: func(t testing.TB) []byte {
			b := build(t, file("first", "1"), file("victim", big))
			return b[:1024+512+2000] // first's header+block, victim's header, part of its body
		}, rule: ErrMalformed, entry: "victim", absent: "victim"},
		{name: "truncated-at-boundary", raw: func(t testing.TB) []byte {
			b := build(t, file("first", "1"), file("second", "2"))
			return b[:2048] // both entries, no end-of-archive marker
		}, rule: ErrMalformed, entry: "second"},
		{name: "truncated-after-pax-header", raw: func(t testing.TB) []byte {
			// The second entry's name needs PAX records: the stream ends
			// after them, where its own header should be.
			b := build(t, file("first", "1"), file(strings.Repeat("d", 200)+"/"+strings.Repeat("e", 120), "2"))
			return b[:2048] // first's header and block, the PAX header and its records
		}, rule: ErrMalformed, entry: "first"},
		{name: "truncated-in-header", raw: func(t testing.TB) []byte {
			return build(t, file("first", "1"), file("second", "2"))[:1024+300]
		}, rule: ErrMalformed, entry: "first", absent: "second"},
		{name: "not-a-tar", raw: func(testing.TB) []byte {
			return bytes.Repeat([]byte("this is not a tar archive, just text.\n"), 100)
		}, rule: ErrMalformed},
		{name: "gzip-not-tar", raw: func(testing.TB) []byte {
			return append([]byte{0x1f, 0x8b, 8, 0}, bytes.Repeat([]byte{7}, 1020)...)
		}, rule: ErrMalformed},
		{name: "empty-file", raw: func(testing.TB) []byte { return nil }, rule: ErrMalformed},
		{name: "whiteout-escaping-root", ents: func(string) []ent { return []ent{file(".wh..", "")} },
			rule: ErrWhiteoutEscape, entry: ".wh.."},
		{name: "whiteout-escaping-dir", ents: func(string) []ent { return []ent{dir("a/"), file("a/.wh..", "")} },
			rule: ErrWhiteoutEscape, entry: "a/.wh.."},
		{name: "whiteout-traversal", ents: func(string) []ent { return []ent{file("../canary/.wh.secret", "")} },
			rule: ErrTraversal, entry: "../canary/.wh.secret"},
		{name: "whiteout-in-a-file", ents: func(string) []ent { return []ent{file("f", "x"), file("f/.wh.x", "")} },
			rule: ErrParentNotDir, entry: "f/.wh.x"},
		{name: "whiteout-through-symlink", ents: func(c string) []ent {
			return []ent{symlink("abs", c), file("abs/.wh.secret", "")}
		}, rule: ErrThroughSymlink, entry: "abs/.wh.secret"},
		{name: "opaque-through-symlink", ents: func(c string) []ent {
			return []ent{symlink("abs", c), file("abs/.wh..wh..opq", "")}
		}, rule: ErrThroughSymlink, entry: "abs/.wh..wh..opq"},
		// A whiteout of another type than a regular file is held to the
		// same confinement.
		{name: "hardlinked-whiteout-escaping-dir", ents: func(string) []ent {
			return []ent{dir("a/"), file("a/.wh.x", ""), hardlink("a/.wh..", "a/.wh.x")}
		}, rule: ErrWhiteoutEscape, entry: "a/.wh.."},
		{name: "hardlinked-whiteout-through-symlink", ents: func(c string) []ent {
			return []ent{file(".wh.x", ""), symlink("abs", c), hardlink("abs/.wh.secret", ".wh.x")}
		}, rule: ErrThroughSymlink, entry: "abs/.wh.secret"},
		{name: "dir-whiteout-traversal", ents: func(string) []ent { return []ent{dir("../canary/.wh.secret/")} },
			rule: ErrTraversal, entry: "../canary/.wh.secret/"},
		{name: "aufs-metadata-through-symlink", ents: func(c string) []ent {
			return []ent{symlink("abs", c), dir("abs/.wh..wh.plnk/")}
		}, rule: ErrThroughSymlink, entry: "abs/.wh..wh.plnk/"},
		{name: "parent-not-dir", ents: func(string) []ent { return []ent{file("f", "x"), file("f/g", "y")} },
			rule: ErrParentNotDir, entry: "f/g"},
		{name: "root-as-symlink", ents: func(c string) []ent { return []ent{symlink("./", c)} },
			rule: ErrRootNotDir, entry: "./"},
		{name: "unsupported-type", ents: func(string) []ent { return []ent{special("vol", 'V')} },
			rule: ErrUnsupportedType, entry: "vol", absent: "vol"},
		{name: "too-many-xattrs", ents: func(string) []ent {
			return []ent{file("ok", "x").pax("SCHILY.xattr.user.a", "1"), withXattrs(file("many", "x"), DefaultMaxXattrs+1, 1)}
		}, rule: ErrTooManyXattrs, entry: "many", absent: "many"},
		{name: "too-many-pax-records", ents: func(string) []ent {
			e := withXattrs(file("junk", "x"), 2, 1)
			for i := range 2*DefaultMaxXattrs + 64 {
				e = e.pax("junk."+strconv.Itoa(i), "v")
			}
			return []ent{e}
		}, rule: ErrTooManyPAXRecords, entry: "junk", absent: "junk"},
		{name: "pax-records-in-global-header", ents: func(string) []ent {
			g := ent{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "global", Format: tar.FormatPAX, PAXRecords: map[string]string{}}}
			for i := range 2*DefaultMaxXattrs + 65 {
				g.hdr.PAXRecords["junk."+strconv.Itoa(i)] = "v"
			}
			return []ent{g, file("after", "x")}
		}, rule: ErrTooManyPAXRecords, entry: "global", absent: "after"},
		{name: "xattrs-too-large", ents: func(string) []ent {
			return []ent{dir("d/").pax("SCHILY.xattr.user.big", strings.Repeat("v", DefaultMaxXattrBytes))}
		}, rule: ErrXattrsTooLarge, entry: "d/", absent: "d"},
		{name: "xattrs-count-in-total", ents: func(string) []ent {
			// 60 bytes of files and 30 of xattrs fit 100; 10 more bytes of
			// xattrs on an empty file do not.
			return []ent{file("a", strings.Repeat("a", 60)).pax("SCHILY.xattr.user.k", strings.Repeat("v", 24)),
				file("b", "").pax("SCHILY.xattr.user.k", strings.Repeat("v", 5))}
		}, limits: Limits{MaxTotalSize: 100}, rule: ErrTotalTooLarge, entry: "b", absent: "b"},
		{name: "trailing-non-zero", raw: func(t testing.TB) []byte {
			return append(append(build(t, file("a", "x")), make([]byte, 9216)...), 'x')
		}, rule: ErrTrailingData, entry: "a"},
		{name: "trailing-zeros-past-bound", raw: func(t testing.TB) []byte {
			return append(build(t, file("a", "x")), make([]byte, MaxPadding+1)...)
		}, rule: ErrTrailingData, entry: "a"},
		{name: "trailing-non-zero-gzip", raw: func(t testing.TB) []byte {
			return s3test.Gzip(t, append(build(t, file("a", "x")), "\x1b[32mok"...))
		}, rule: ErrTrailingData, entry: "a"},
		{name: "trailing-zeros-zstd", raw: func(t testing.TB) []byte {
			return s3test.Zstd(t, append(build(t, file("a", "x")), make([]byte, 64<<20)...))
		}, rule: ErrTrailingData, entry: "a"},
		{name: "data-after-zstd-frame", raw: func(t testing.TB) []byte {
			return append(s3test.Zstd(t, build(t, file("a", "x"))), make([]byte, 512)...)
		}, rule: ErrMalformed, entry: "a"},
		{name: "data-after-gzip-member", raw: func(t testing.TB) []byte {
			return append(s3test.Gzip(t, build(t, file("a", "x"))), "garbage"...)
		}, rule: ErrMalformed, entry: "a"},
	}
}

// withXattrs gives e n user.* extended attributes of valueLen bytes each.
func withXattrs(e ent, n, valueLen int) ent {
	v := strings.Repeat("v", valueLen)
	for i := range n {
		e = e.pax("SCHILY.xattr.user.x"+strconv.Itoa(i), v)
	}
	return e
}

func (h hostile) archive(t testing.TB, s sandbox) []byte {
	if h.raw != nil {
		return h.raw(t)
	}
	return build(t, h.ents(s.canary)...)
}

// checkRejection asserts err is the expected rule naming the expected entry.
func checkRejection(t *testing.T, what string, err error, h hostile) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s accepted the archive, want %v", what, h.rule)
	}
	if !errors.Is(err, h.rule) {
		t.Fatalf("%s: %v, want rule %v", what, err, h.rule)
	}
	if !IsRejection(err) {
		t.Errorf("%s: IsRejection(%v) = false", what, err)
	}
	if !strings.Contains(err.Error(), h.rule.Error()) && h.rule != ErrMalformed {
		t.Errorf("%s: message %q does not name the rule %q", what, err, h.rule)
	}
	var pe *PolicyError
	var fe *FormatError
	switch {
	case errors.As(err, &pe):
		if h.entry != "" && pe.Entry != h.entry {
			t.Errorf("%s: entry %q, want %q", what, pe.Entry, h.entry)
		}
		if !strings.Contains(err.Error(), `"`+pe.Entry+`"`) {
			t.Errorf("%s: message %q does not name the entry", what, err)
		}
	case errors.As(err, &fe):
		if fe.Entry != h.entry {
			t.Errorf("%s: format error in entry %q, want %q (%v)", what, fe.Entry, h.entry, err)
		}
		if !strings.Contains(err.Error(), "offset") {
			t.Errorf("%s: message %q does not give the offset", what, err)
		}
	default:
		t.Errorf("%s: %T is neither a PolicyError nor a FormatError", what, err)
	}
}

func TestHostileCorpus(t *testing.T) {
	for _, h := range hostileCorpus() {
		t.Run(h.name, func(t *testing.T) {
			s := newSandbox(t)
			b := h.archive(t, s)
			_, err := Validate(context.Background(), bytes.NewReader(b), h.limits)
			checkRejection(t, "Validate", err, h)

			_, err = ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{Limits: h.limits})
			checkRejection(t, "Extract", err, h)
			s.intact(t)
			if h.absent != "" {
				if _, err := os.Lstat(filepath.Join(s.target, h.absent)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("Extract left %s in the target (%v)", h.absent, err)
				}
			}
			t.Logf("rejected: %v", err)
		})
	}
}

// TestDefaultEntryLimit proves the real default (100,000 entries) bites:
// 100,001 tiny entries, generated as they are read.
func TestDefaultEntryLimit(t *testing.T) {
	gen := func(tw *tar.Writer) error {
		for i := range DefaultMaxEntries + 1 {
			h := &tar.Header{Typeflag: tar.TypeReg, Name: ".wh.n" + strconv.Itoa(i), Mode: 0o644, Format: tar.FormatUSTAR}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		}
		return nil
	}
	want := hostile{rule: ErrTooManyEntries, entry: ".wh.n" + strconv.Itoa(DefaultMaxEntries)}

	r, stop := streamed(gen)
	rep, err := Validate(context.Background(), r, Limits{})
	stop()
	checkRejection(t, "Validate", err, want)
	if rep.Entries != DefaultMaxEntries+1 {
		t.Errorf("Validate read %d entries before rejecting, want %d", rep.Entries, DefaultMaxEntries+1)
	}

	s := newSandbox(t)
	r, stop = streamed(gen)
	_, err = ExtractDir(context.Background(), r, s.target, ExtractOptions{})
	stop()
	checkRejection(t, "Extract", err, want)
	s.intact(t)
}

// TestDefaultFileSizeLimit proves the real 1 GiB default bites on a file of
// 1 GiB + 1 byte whose content is never materialised: it is rejected from
// its header, before its body is read.
func TestDefaultFileSizeLimit(t *testing.T) {
	gen := func(tw *tar.Writer) error {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: "huge", Mode: 0o644, Size: DefaultMaxFileSize + 1}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := io.CopyN(tw, zeros{}, h.Size)
		return err
	}
	want := hostile{rule: ErrFileTooLarge, entry: "huge"}
	r, stop := streamed(gen)
	_, err := Validate(context.Background(), r, Limits{})
	stop()
	checkRejection(t, "Validate", err, want)

	s := newSandbox(t)
	r, stop = streamed(gen)
	_, err = ExtractDir(context.Background(), r, s.target, ExtractOptions{})
	stop()
	checkRejection(t, "Extract", err, want)
	if _, err := os.Lstat(filepath.Join(s.target, "huge")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Extract created the oversized file (%v)", err)
	}
	s.intact(t)
}

// TestTruncatedLeavesNoPartialFile checks the file being written when the
// stream ends is removed, and the ones before it are complete.
func TestTruncatedLeavesNoPartialFile(t *testing.T) {
	body := strings.Repeat("y", 3<<20)
	b := build(t, file("done", "complete"), file("partial", body))
	s := newSandbox(t)
	_, err := ExtractDir(context.Background(), bytes.NewReader(b[:len(b)/2]), s.target, ExtractOptions{})
	checkRejection(t, "Extract", err, hostile{rule: ErrMalformed, entry: "partial"})
	if _, err := os.Lstat(filepath.Join(s.target, "partial")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("partial file left behind (%v)", err)
	}
	if got, err := os.ReadFile(filepath.Join(s.target, "done")); err != nil || string(got) != "complete" {
		t.Errorf("earlier file: %q, %v", got, err)
	}
}

// failingReader returns an I/O error (not a format problem) after n bytes:
// err, or errSource when err is nil.
type failingReader struct {
	r   io.Reader
	n   int
	err error
}

var errSource = errors.New("connection reset by faulty source")

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		if f.err != nil {
			return 0, f.err
		}
		return 0, errSource
	}
	p = p[:min(len(p), f.n)]
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

// TestSourceErrorIsNotRejection: a failing source is an I/O error the
// caller may retry, not a verdict on the archive.
func TestSourceErrorIsNotRejection(t *testing.T) {
	b := build(t, file("a", strings.Repeat("z", 10000)))
	_, err := Validate(context.Background(), &failingReader{r: bytes.NewReader(b), n: 3000}, Limits{})
	if !errors.Is(err, errSource) || IsRejection(err) {
		t.Fatalf("Validate: %v; want the source's error, not a rejection", err)
	}
	s := newSandbox(t)
	_, err = ExtractDir(context.Background(), &failingReader{r: bytes.NewReader(b), n: 3000}, s.target, ExtractOptions{})
	if !errors.Is(err, errSource) || IsRejection(err) {
		t.Fatalf("Extract: %v; want the source's error, not a rejection", err)
	}
	if _, err := os.Lstat(filepath.Join(s.target, "a")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("partial file left behind (%v)", err)
	}
}

// TestSourceUnexpectedEOFIsNotRejection: a source whose transfer was cut
// fails with an error wrapping io.ErrUnexpectedEOF (as net/http and the
// S3 readers do once their resumes are spent); read plain, gzip or zstd,
// that stays an I/O error the caller may retry, with its cause, and not a
// truncated archive. The same bytes ending cleanly are a truncated
// archive (ErrMalformed).
func TestSourceUnexpectedEOFIsNotRejection(t *testing.T) {
	plain := build(t, file("a", strings.Repeat("z", 10000)+strings.Repeat("y", 10000)))
	cut := fmt.Errorf("read s3://b/k: body ended at 3000 of 20480 bytes after 3 resumes: %w", io.ErrUnexpectedEOF)
	for name, b := range map[string][]byte{"plain": plain, "gzip": s3test.Gzip(t, plain), "zstd": s3test.Zstd(t, plain)} {
		t.Run(name, func(t *testing.T) {
			n := len(b) / 2
			_, verr := Validate(context.Background(), &failingReader{r: bytes.NewReader(b), n: n, err: cut}, Limits{})
			_, xerr := ExtractDir(context.Background(), &failingReader{r: bytes.NewReader(b), n: n, err: cut}, newSandbox(t).target, ExtractOptions{NoChown: true})
			for what, err := range map[string]error{"Validate": verr, "Extract": xerr} {
				if !errors.Is(err, cut) || IsRejection(err) || IsPermanent(err) {
					t.Errorf("%s: %v (rejection %v, permanent %v); want the source's error, neither a rejection nor permanent", what, err, IsRejection(err), IsPermanent(err))
				}
			}
			_, err := Validate(context.Background(), bytes.NewReader(b[:n]), Limits{})
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("Validate of the first %d bytes, ending cleanly: %v, want %v", n, err, ErrMalformed)
			}
		})
	}
}

func TestCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := build(t, file("a", "x"))
	if _, err := Validate(ctx, bytes.NewReader(b), Limits{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Validate: %v, want context.Canceled", err)
	}
	s := newSandbox(t)
	if _, err := ExtractDir(ctx, bytes.NewReader(b), s.target, ExtractOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Extract: %v, want context.Canceled", err)
	}
}
