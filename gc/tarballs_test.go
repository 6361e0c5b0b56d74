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
