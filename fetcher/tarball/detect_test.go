package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestDetectRootfs: extracting with DetectRootfs, as a stream is before
// Validate has seen it whole, makes the tree that extracting with
// StripRootfs set from Validate's report makes, and with HashStream names
// the layer (diff ID, entries) as Validate does, for an archive kept under
// rootfs/ (with and without its "./" root entry) and for one that is not;
// an archive that starts under rootfs/ and then leaves it is refused, as
// Validate's report (no rootfs layout) would not match the decision.
func TestDetectRootfs(t *testing.T) {
	tree := []ent{dir("etc/"), file("etc/hostname", "box\n"), dir("usr/"), dir("usr/bin/"), file("usr/bin/tool", "#!/bin/sh\n"), symlink("usr/bin/t", "tool"), hardlink("usr/bin/tool2", "usr/bin/tool")}
	rootEntry := dir("./").mode(0o751)
	for _, tc := range []struct {
		name      string
		ents      []ent
		wantStrip bool
		rootSet   bool // an entry gives the root's mode and times
	}{
		{"plain", tree, false, false},
		{"plain with its root entry", append([]ent{rootEntry}, tree...), false, true},
		{"rootfs", append([]ent{dir("rootfs/").mode(0o700)}, prefixed("rootfs/", tree)...), true, true},
		{"rootfs with the archive root first", append([]ent{rootEntry, dir("rootfs/").mode(0o700)}, prefixed("rootfs/", tree)...), true, true},
		{"rootfs without its own entry", prefixed("rootfs/", tree), true, false},
		{"plain with its root entry twice, with PAX records", append([]ent{rootEntry.pax("comment", strings.Repeat("c", 5000)), dir("./").mode(0o750).pax("SCHILY.xattr.user.a", "1")}, tree...), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			archive := build(t, tc.ents...)
			rep, err := Validate(context.Background(), bytes.NewReader(archive), Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.HasRootfs != tc.wantStrip {
				t.Fatalf("Validate: HasRootfs %v, want %v", rep.HasRootfs, tc.wantStrip)
			}
			want, got := newSandbox(t), newSandbox(t)
			if _, err := ExtractDir(context.Background(), bytes.NewReader(archive), want.target, ExtractOptions{StripRootfs: rep.HasRootfs, NoChown: true}); err != nil {
				t.Fatal(err)
			}
			st, err := ExtractDir(context.Background(), bytes.NewReader(s3test.Gzip(t, archive)), got.target, ExtractOptions{DetectRootfs: true, HashStream: true, NoChown: true})
			if err != nil {
				t.Fatalf("DetectRootfs: %v", err)
			}
			if st.DiffID != rep.DiffID || st.Entries != rep.Entries {
				t.Errorf("extraction of the gzip-compressed archive names it %s with %d entries; Validate of the plain one: %s with %d", st.DiffID, st.Entries, rep.DiffID, rep.Entries)
			}
			if st.StrippedRootfs != rep.HasRootfs {
				t.Errorf("DetectRootfs decided strip=%v, Validate says HasRootfs=%v", st.StrippedRootfs, rep.HasRootfs)
			}
			g, w := describeTree(t, got.target), describeTree(t, want.target)
			if !tc.rootSet { // the root's mtime is then when its children were made
				delete(g, ".")
				delete(w, ".")
			}
			diffTrees(t, "DetectRootfs against StripRootfs from the report", g, w)
		})
	}
	t.Run("starts under rootfs then leaves it", func(t *testing.T) {
		archive := build(t, append(prefixed("rootfs/", tree), file("outside", "x"))...)
		rep, err := Validate(context.Background(), bytes.NewReader(archive), Limits{})
		if err != nil || rep.HasRootfs {
			t.Fatalf("Validate: %+v, %v; want a valid archive without the rootfs layout", rep, err)
		}
		_, err = ExtractDir(context.Background(), bytes.NewReader(archive), newSandbox(t).target, ExtractOptions{DetectRootfs: true, NoChown: true})
		if !errors.Is(err, ErrOutsideRootfs) {
			t.Fatalf("DetectRootfs on an archive that leaves rootfs/: %v, want ErrOutsideRootfs", err)
		}
	})
}

// TestDetectRootfsRootDirWithSize: a "./" directory entry whose size
// field is not zero (a writer's quirk: archive/tar reads no body for a
// directory) is still the archive root. DetectRootfs holds it, and the
// archive, otherwise all under rootfs/, is extracted stripped, as
// Validate's report says, not with rootfs/ kept.
func TestDetectRootfsRootDirWithSize(t *testing.T) {
	root := dir("./")
	root.hdr.Size = 512
	layer := build(t, root, dir("rootfs/"), dir("rootfs/etc/"), file("rootfs/etc/os-release", "ID=x\n"))
	if h, err := tar.NewReader(bytes.NewReader(layer)).Next(); err != nil || h.Size != 512 {
		t.Fatalf("the root entry reads back as %+v, %v; want size 512", h, err)
	}
	rep, err := Validate(context.Background(), bytes.NewReader(layer), Limits{})
	if err != nil || !rep.HasRootfs {
		t.Fatalf("Validate: %+v, %v; want the rootfs/ layout", rep, err)
	}
	s := newSandbox(t)
	st, err := ExtractDir(context.Background(), bytes.NewReader(layer), s.target, ExtractOptions{DetectRootfs: true, NoChown: true})
	if err != nil || !st.StrippedRootfs {
		t.Fatalf("Extract with DetectRootfs: %+v, %v; want rootfs/ stripped", st, err)
	}
	if _, err := os.Stat(filepath.Join(s.target, "etc/os-release")); err != nil {
		t.Errorf("etc/os-release after the extraction: %v", err)
	}
}

// TestPlainHashedByCaller: with CallerHashesPlain (Validate) or HashStream
// (Extract), a compressed layer is named by its decompressed stream's
// SHA-256, and a plain layer is left to the caller, whose SHA-256 of the
// bytes it reads is the same diff ID: those bytes are hashed once.
func TestPlainHashedByCaller(t *testing.T) {
	plain := build(t, dir("etc/"), file("etc/hostname", "box\n"))
	full, err := Validate(context.Background(), bytes.NewReader(plain), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		data     []byte
		wantDiff string
	}{{"plain", plain, ""}, {"gzip", s3test.Gzip(t, plain), full.DiffID}, {"zstd", s3test.Zstd(t, plain), full.DiffID}} {
		rep, err := Validate(context.Background(), bytes.NewReader(tc.data), Limits{}, CallerHashesPlain())
		if err != nil || rep.DiffID != tc.wantDiff {
			t.Errorf("%s: Validate with CallerHashesPlain: diff ID %q, %v; want %q", tc.name, rep.DiffID, err, tc.wantDiff)
		}
		st, err := ExtractDir(context.Background(), bytes.NewReader(tc.data), newSandbox(t).target, ExtractOptions{HashStream: true, NoChown: true})
		if err != nil || st.DiffID != tc.wantDiff || (st.Compression == Plain) != (tc.name == "plain") {
			t.Errorf("%s: Extract with HashStream: diff ID %q (%s), %v; want %q", tc.name, st.DiffID, st.Compression, err, tc.wantDiff)
		}
	}
	if want := "sha256:" + fmt.Sprintf("%x", sha256.Sum256(plain)); full.DiffID != want {
		t.Errorf("Validate of the plain layer: diff ID %s, want its SHA-256 %s", full.DiffID, want)
	}
}

// rootEntries is an archive of n bodiless root entries ("./"), each with
// the PAX records pax, and then a file: what DetectRootfs reads before it
// can decide.
func rootEntries(n int, pax map[string]string) []ent {
	var ents []ent
	for range n {
		e := dir("./")
		for k, v := range pax {
			e = e.pax(k, v)
		}
		ents = append(ents, e)
	}
	return append(ents, file("etc/hostname", "box\n"))
}

// records is n PAX records of size bytes each, keys prefix and a number.
func records(prefix string, n, size int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("%s%04d", prefix, i)] = strings.Repeat("x", size)
	}
	return m
}

// TestDetectRootfsChecksRootEntries: the root entries DetectRootfs reads
// before it decides are checked as they are read, by every rule that
// holds whatever the decision (the entry count, the PAX record and
// extended attribute limits, the number of root entries, the root's own
// mode), and refused at the entry that breaks one, with the rule and
// entry Validate names and Extract with StripRootfs names too.
func TestDetectRootfsChecksRootEntries(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ents   []ent
		limits Limits
		rule   error
		read   int // entries read when refused
	}{
		{"PAX records over the limit", rootEntries(300, records("k", 1000, 80)), Limits{MaxEntries: 5}, ErrTooManyPAXRecords, 1},
		{"extended attributes over the limit", rootEntries(300, records("SCHILY.xattr.user.k", 10, 10)), Limits{MaxXattrs: 4}, ErrTooManyXattrs, 1},
		{"past MaxEntries", rootEntries(300, nil), Limits{MaxEntries: 5}, ErrTooManyEntries, 6},
		{"root listed too often", rootEntries(300, nil), Limits{}, ErrTooManyRootEntries, MaxRootEntries + 1},
		{"setuid root over rootfs/", append([]ent{dir("./").mode(0o4755)}, prefixed("rootfs/", []ent{file("a", "x")})...), Limits{}, ErrSetID, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := hostile{rule: tc.rule, entry: "./"}
			archive := s3test.Gzip(t, build(t, tc.ents...))
			_, err := Validate(context.Background(), bytes.NewReader(archive), tc.limits)
			checkRejection(t, "Validate", err, want)
			_, err = ExtractDir(context.Background(), bytes.NewReader(archive), newSandbox(t).target, ExtractOptions{Limits: tc.limits, StripRootfs: true, NoChown: true})
			checkRejection(t, "Extract with StripRootfs", err, want)
			st, err := ExtractDir(context.Background(), bytes.NewReader(archive), newSandbox(t).target, ExtractOptions{Limits: tc.limits, DetectRootfs: true, NoChown: true})
			checkRejection(t, "Extract with DetectRootfs", err, want)
			if st.Entries != tc.read {
				t.Errorf("Extract with DetectRootfs read %d entries before refusing, want %d", st.Entries, tc.read)
			}
		})
	}
}

// heapPeak passes r through and, every sampleEvery bytes, records the
// live heap (after a collection) above base: what the reader's consumer
// holds while it reads.
type heapPeak struct {
	r          io.Reader
	base, peak uint64
	n, next    int64
}

const sampleEvery = 4 << 20

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func (p *heapPeak) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if p.n += int64(n); p.n >= p.next {
		p.next = p.n + sampleEvery
		if h := liveHeap(); h > p.base {
			p.peak = max(p.peak, h-p.base)
		}
	}
	return n, err
}

// TestDetectRootfsRootEntriesBoundedMemory: a layer of 200 root entries,
// each behind a PAX header of about 900 KB that every limit admits (~180
// MB of tar stream), is refused by Extract with DetectRootfs at the root
// entry past MaxRootEntries, having held no more than a few MiB: the
// root entries read before the decision are kept without their PAX
// records, and bounded in number. (Held whole and without bound, they
// were ~180 MB at the stream's end.)
func TestDetectRootfsRootEntriesBoundedMemory(t *testing.T) {
	const entries, bound = 200, 32 << 20
	pax := records("comment.", 300, 3000)
	gen := func(tw *tar.Writer) error {
		for range entries {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, ModTime: testTime, Format: tar.FormatPAX, PAXRecords: pax}); err != nil {
				return err
			}
		}
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/hostname", Mode: 0o644, ModTime: testTime})
	}
	r, stop := streamed(gen)
	_, err := Validate(context.Background(), r, Limits{})
	stop()
	checkRejection(t, "Validate", err, hostile{rule: ErrTooManyRootEntries, entry: "./"})

	r, stop = streamed(gen)
	defer stop()
	probe := &heapPeak{r: r, base: liveHeap()}
	st, err := ExtractDir(context.Background(), probe, newSandbox(t).target, ExtractOptions{DetectRootfs: true, NoChown: true})
	checkRejection(t, "Extract with DetectRootfs", err, hostile{rule: ErrTooManyRootEntries, entry: "./"})
	if !strings.Contains(err.Error(), fmt.Sprintf("more than %d", MaxRootEntries)) {
		t.Errorf("message %q does not give the bound %d", err, MaxRootEntries)
	}
	t.Logf("read %d entries, %d bytes of tar; live heap at most +%d bytes", st.Entries, probe.n, probe.peak)
	if st.Entries != MaxRootEntries+1 {
		t.Errorf("Extract read %d entries, want it to stop at the root entry past %d", st.Entries, MaxRootEntries)
	}
	if probe.peak > bound {
		t.Errorf("live heap grew by %d bytes while reading the root entries, want at most %d", probe.peak, bound)
	}
}
