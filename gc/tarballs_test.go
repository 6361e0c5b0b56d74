package gc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
)

// TestTrimTarballsKeepsBudget: the tarballs of unpacked layers go, least
// recently used image first, until the rest fit the budget; a tarball whose
// layer is not unpacked stays whatever its age; the records stay; nothing
// is trimmed while another pull is under way.
func TestTrimTarballsKeepsBudget(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{TarballCache: 3 * 7}) // three of the 7-byte test tarballs
	pending := filepath.Join(h.dir, "blob-pending")
	if err := os.WriteFile(pending, []byte("tarball"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pipeline.RecordsOf(h.db).StoreDownload(ctx, pipeline.Object{Bucket: "bucket", Key: "pending.tar", ETag: "e", SizeBytes: 7, Digest: "sha256:pending"},
		pipeline.LayerFile{Digest: "sha256:pending", Path: pending, SizeBytes: 7}); err != nil {
		t.Fatal(err)
	}
	files := map[string][]string{}
	for _, id := range []string{"img1", "img2", "img3", "img4"} {
		files[id] = h.image(id, "name-"+id, layer{"c-" + id, mib})
	}
	for _, id := range []string{"img3", "img1", "img4", "img2"} { // img3 least recently used, then img1
		if err := pipeline.RecordsOf(h.db).TouchImage(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	end := h.c.Begin("other")
	tr, err := h.c.TrimTarballs(ctx, "img2")
	end()
	if err != nil || tr.Files != 0 || tr.Skipped == "" {
		t.Fatalf("trim during another pull = %+v, %v; want skipped", tr, err)
	}
	end = h.c.Begin("img2")
	tr, err = h.c.TrimTarballs(ctx, "img2")
	end()
	if err != nil {
		t.Fatal(err)
	}
	if tr.Files != 2 || tr.Bytes != 14 || tr.Kept != 21 {
		t.Fatalf("trim = %+v; want 2 files (14 bytes) removed, 21 bytes kept", tr)
	}
	for id, fs := range files {
		_, err := os.Stat(fs[0])
		removed := errors.Is(err, os.ErrNotExist)
		if want := id == "img3" || id == "img1"; removed != want {
			t.Errorf("tarball of %s removed = %v, want %v", id, removed, want)
		}
	}
	if _, err := os.Stat(pending); err != nil {
		t.Errorf("tarball of a layer not unpacked: %v; want it kept", err)
	}
	if f, err := pipeline.RecordsOf(h.db).LayerFile(ctx, "sha256:diff-c-img3"); err != nil || f == nil {
		t.Errorf("layer record of a trimmed tarball = %+v, %v; want kept", f, err)
	}
	if tr, err := h.c.TrimTarballs(ctx, ""); err != nil || tr.Files != 0 {
		t.Errorf("second trim = %+v, %v; want nothing more to do", tr, err)
	}
}

// TestTrimTarballsTrimsCompressedLayers: a compressed tarball is recorded
// under the digest of its compressed bytes and its layer under its diff
// ID; once the layer is unpacked, its tarball is trimmed like a plain one.
func TestTrimTarballsTrimsCompressedLayers(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{TarballCache: 7}) // one 7-byte test tarball
	var files []string
	for _, id := range []string{"img1", "img2", "img3"} {
		chain := "c-" + id
		h.image(id, "name-"+id, layer{chain, mib})
		// The layer's tarball as a .tar.gz would leave it: the file and
		// object under the compressed digest, the diff ID beside it.
		path := filepath.Join(h.dir, "gz-"+chain)
		if err := os.WriteFile(path, []byte("tarball"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := pipeline.RecordsOf(h.db).StoreDownload(ctx,
			pipeline.Object{Bucket: "bucket", Key: id + "/1.tar", ETag: "e", SizeBytes: 7, Digest: "sha256:gz-" + chain},
			pipeline.LayerFile{Digest: "sha256:gz-" + chain, DiffID: "sha256:diff-" + chain, Path: path, SizeBytes: 7}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.db.Statements().ExecContext(ctx, `DELETE FROM layers WHERE digest = ?`, "sha256:diff-"+chain); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(h.dir, "blob-"+chain)); err != nil {
			t.Fatal(err)
		}
		files = append(files, path)
	}
	tr, err := h.c.TrimTarballs(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if tr.Files != 2 || tr.Kept != 7 {
		t.Errorf("trim = %+v; want 2 compressed tarballs removed, 7 bytes kept", tr)
	}
	for i, f := range files {
		_, err := os.Stat(f)
		if removed, want := errors.Is(err, os.ErrNotExist), i < 2; removed != want {
			t.Errorf("tarball %s removed = %v, want %v (least recently used first)", f, removed, want)
		}
	}
}

// TestTrimTarballsWhileAPullIsUnderWay: on a host where some pull is
// always under way, the tarball cache is still trimmed to its budget,
// keeping the tarballs that pull or a live run may read (FilesInUse, here
// a fake naming one) and holding off the pulls' new holds until the trim
// is done.
func TestTrimTarballsWhileAPullIsUnderWay(t *testing.T) {
	ctx := context.Background()
	released := false
	inUse := map[string]bool{"sha256:diff-c-img1": true}
	h := newHarness(t, 1000*mib, Options{TarballCache: 14, FilesInUse: func(context.Context) (map[string]bool, func(), error) {
		return inUse, func() { released = true }, nil
	}})
	files := map[string][]string{}
	for _, id := range []string{"img1", "img2", "img3"} {
		files[id] = h.image(id, "name-"+id, layer{"c-" + id, mib})
	}
	for _, id := range []string{"img1", "img2", "img3"} { // img1 least recently used
		if err := pipeline.RecordsOf(h.db).TouchImage(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	end := h.c.Begin("other")
	defer end()
	tr, err := h.c.TrimTarballs(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if tr.Files != 1 || tr.Kept != 14 || tr.Skipped != "" {
		t.Errorf("trim during another pull = %+v; want img2's tarball removed, img1's (in use) and img3's kept", tr)
	}
	for id, fs := range files {
		_, err := os.Stat(fs[0])
		if removed, want := errors.Is(err, os.ErrNotExist), id == "img2"; removed != want {
			t.Errorf("tarball of %s removed = %v, want %v", id, removed, want)
		}
	}
	if !released {
		t.Errorf("the hold FilesInUse took was not released")
	}
}
