package tarball

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
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
