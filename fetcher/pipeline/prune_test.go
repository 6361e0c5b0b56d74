package pipeline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// pruneWorld writes two images sharing their bottom layer: s3-a
// (a/1.tar, a/2.tar) and s3-b (b/1.tar with a/1.tar's bytes, b/2.tar), both
// activated, then removes s3-b's activation and its top chain's snapshot as
// containerd's garbage collector does when it removes that image.
func pruneWorld(t *testing.T) (*seed.World, *metadata.DB) {
	db := metadatatest.Open(t)
	w := seed.NewWorld(t, db)
	w.Pull("s3-a", "s3://bkt/a/", "a:latest", seed.TwoLayers("a/", "a")...)
	w.Pull("s3-b", "s3://bkt/b/", "b:latest", seed.TwoLayers("b/", "b")...)
	w.AddName("b:v1", "s3-b")
	checkPrune(t, db, "prune with nothing removed", PruneResult{})
	w.RemoveSnapshot(seed.ActivationKey("s3-b"))
	w.RemoveSnapshot("sha256:c-b")
	return w, db
}

// checkPrune runs PruneOrphans on db and fails the test unless it pruned
// exactly want; what says when the prune ran.
func checkPrune(t *testing.T, db *metadata.DB, what string, want PruneResult) {
	t.Helper()
	res, err := RecordsOf(db).PruneOrphans(context.Background(), true)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("%s = %+v, want %+v", what, res, want)
	}
}

// checkAIntact checks image s3-a kept everything.
func checkAIntact(t *testing.T, w *seed.World) {
	t.Helper()
	if !w.Has("s3_images", "image_id = 's3-a' AND pulled_ns IS NOT NULL") || w.Count("image_layers WHERE image_id = 's3-a'") != 2 ||
		!w.Has("chains", "chain_id = 'sha256:c-a'") || !w.Has("cd_snapshots", "key = ?", seed.ActivationKey("s3-a")) {
		t.Errorf("s3-a is no longer a pulled image after the prune")
	}
	for _, k := range []string{"a/1.tar", "a/2.tar"} {
		if !w.Has("s3_objects", "bucket = 'bkt' AND key = ?", k) {
			t.Errorf("object %s of s3-a was pruned", k)
		}
	}
	for _, d := range []string{"sha256:d1", "sha256:d-a"} {
		if !w.Has("layers", "digest = ?", d) {
			t.Errorf("layer %s of s3-a was pruned", d)
		}
	}
}

// TestPruneOrphansAfterGC: the chain whose snapshot is gone is forgotten,
// the image using it with its layers and names, the objects only it listed
// and the layer file nothing refers to any more (its path returned for the
// caller to delete); the other image keeps everything, the shared layer
// included.
func TestPruneOrphansAfterGC(t *testing.T) {
	w, db := pruneWorld(t)
	checkPrune(t, db, "prune", PruneResult{Chains: 1, Images: 1, Objects: 2, LayerPaths: []string{seed.LayerPath("sha256:d-b")}})
	if w.Has("chains", "chain_id = 'sha256:c-b'") {
		t.Errorf("chain c-b survived")
	}
	if w.Has("s3_images", "image_id = 's3-b'") {
		t.Errorf("image s3-b survived")
	}
	for _, n := range []string{"b:latest", "b:v1"} {
		if w.Has("image_names", "name = ?", n) {
			t.Errorf("name %s survived", n)
		}
	}
	if w.Has("image_layers", "image_id = 's3-b'") {
		t.Errorf("layers of s3-b survived")
	}
	for _, k := range []string{"b/1.tar", "b/2.tar"} {
		if w.Has("s3_objects", "bucket = 'bkt' AND key = ?", k) {
			t.Errorf("object %s survived", k)
		}
	}
	if w.Has("layers", "digest = 'sha256:d-b'") {
		t.Errorf("layer d-b survived")
	}
	checkAIntact(t, w)
	if !w.Has("chains", "chain_id = 'sha256:d1'") {
		t.Errorf("the shared bottom chain was pruned")
	}
	checkPrune(t, db, "second prune", PruneResult{})
}

// TestPruneOrphansWaitsForLiveRuns: a chain a live run is making again is
// kept, and so is an image a live run is pulling; an object nobody lists
// any more, with its layer file, is kept while a live run names it (a
// download of it, an unpack of its layer, an activate of an image listing
// it), and only then: on a busy host some run is live at almost any time.
func TestPruneOrphansWaitsForLiveRuns(t *testing.T) {
	w, db := pruneWorld(t)
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	live := func(id, fsm, idem, state, request string) {
		t.Helper()
		if err := seed.InsertRun(ctx, db, seed.Run{ID: id, FSM: fsm, IdempotencyID: idem, State: state, Created: t0, Request: request}); err != nil {
			t.Fatalf("insert run %s: %v", id, err)
		}
	}
	finish := func(id string) {
		t.Helper()
		w.Must(seed.FinishRun(ctx, db, id, "complete", t0.Add(time.Second)))
	}

	// An unpack of c-b is under way: nothing of s3-b goes.
	live("unpack", "unpack-layer", "sha256:c-b", "running", "")
	checkPrune(t, db, "prune while c-b is being unpacked", PruneResult{})
	if !w.Has("chains", "chain_id = 'sha256:c-b'") {
		t.Errorf("chain c-b was forgotten while a run was making it")
	}
	finish("unpack")

	// A pull of s3-b is pending: the chain goes, the image stays.
	live("pull", "pull-image", "s3-b", "pending", "")
	checkPrune(t, db, "prune while s3-b is being pulled", PruneResult{Chains: 1})
	if !w.Has("s3_images", "image_id = 's3-b'") {
		t.Errorf("image s3-b was forgotten while a run was pulling it")
	}
	finish("pull")

	// A download of b/2.tar, an unpack of the layer downloaded from it and
	// an activate of an image listing it are live, and an unrelated
	// download: the image goes, and b/1.tar (whose layer s3-a keeps), but
	// b/2.tar and its layer file stay while any of the three is live.
	live("other", api.FSMDownload, "obj-z", "running", `{"Bucket":"bkt","S3Key":"z.tar"}`)
	live("dl", api.FSMDownload, "obj-b2", "running", `{"Bucket":"bkt","S3Key":"b/2.tar"}`)
	live("up", api.FSMUnpack, "sha256:c-b2", "pending", `{"chain_id":"sha256:c-b2","s3_url":"s3://bkt/b/2.tar"}`)
	live("act", api.FSMActivate, "s3-b2", "pending", `{"image_id":"s3-b2","source":"s3://bkt/b/","layers":[{"key":"b/2.tar"}]}`)
	checkPrune(t, db, "prune with b/2.tar downloading", PruneResult{Images: 1, Objects: 1})
	for _, run := range []string{"dl", "up", "act"} {
		if !w.Has("s3_objects", "bucket = 'bkt' AND key = 'b/2.tar'") || !w.Has("layers", "digest = 'sha256:d-b'") {
			t.Fatalf("object b/2.tar or its layer d-b pruned while run %s named it", run)
		}
		finish(run)
		want := PruneResult{}
		if run == "act" {
			want = PruneResult{Objects: 1, LayerPaths: []string{seed.LayerPath("sha256:d-b")}}
		}
		checkPrune(t, db, "prune once run "+run+" ended", want)
	}
	checkAIntact(t, w)
	finish("other")
}

// TestLiveRunsUsing: liveRunsUsing counts the live runs whose request names a chain, by a
// scalar member or by an array of layers, ignoring finished runs and
// machines not listed.
func TestLiveRunsUsing(t *testing.T) {
	db := metadatatest.Open(t)
	w := seed.NewWorld(t, db)
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	for _, r := range []struct{ id, fsm, state, req string }{
		{"u1", "unpack-layer", "running", `{"chain_id":"sha256:c3","parent":"sha256:c1"}`},
		{"u2", "unpack-layer", "pending", `{"chain_id":"sha256:c1"}`},
		{"a1", "activate-image", "pending", `{"layers":[{"key":"1.tar","chain_id":"sha256:c1"},{"key":"3.tar","chain_id":"sha256:c3"}]}`},
		{"old", "activate-image", "running", `{"layers":[{"chain_id":"sha256:c3"}]}`},
		{"x", "other", "running", `{"chain_id":"sha256:c3"}`},
	} {
		if err := seed.InsertRun(ctx, db, seed.Run{ID: r.id, FSM: r.fsm, IdempotencyID: r.id, Request: r.req, State: r.state, Created: t0}); err != nil {
			t.Fatal(err)
		}
	}
	w.Must(seed.FinishRun(ctx, db, "old", "failed", t0))
	fields := map[string][]string{"unpack-layer": {"$.chain_id"}, "activate-image": {"$.layers[]"}}
	for chain, want := range map[string]int{"sha256:c3": 2, "sha256:c1": 2, "sha256:c2": 0} {
		var n int
		w.Must(db.WithTx(ctx, func(tx *sql.Tx) error {
			var err error
			n, err = liveRunsUsing(ctx, tx, chain, fields)
			return err
		}))
		if n != want {
			t.Errorf("liveRunsUsing(%s) = %d, want %d", chain, n, want)
		}
	}
	if n, err := RecordsOf(db).LiveRuns(ctx); err != nil || n != 4 {
		t.Errorf("LiveRuns = %d, %v; want 4", n, err)
	}
}

// TestPruneOrphansInBatches: pruning more orphans than one batch holds
// takes several transactions and still forgets every one of them, and the
// layer paths it returns are those of every deleted layer row.
func TestPruneOrphansInBatches(t *testing.T) {
	ctx := context.Background()
	db := metadatatest.Open(t)
	const n = 7
	for i := range n {
		if err := seed.WriteImage(ctx, db, i); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{seed.ActivationKey(fmt.Sprintf("s3-w%d", i)), fmt.Sprintf("sha256:w%d", i)} {
			if err := seed.RemoveSnapshot(ctx, db, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, _, err := RecordsOf(db).pruneOrphans(ctx, 2, true, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Chains != n || res.Images != n || res.Objects != n || len(res.LayerPaths) != n || res.Deferred {
		t.Fatalf("prune in batches of 2 = %+v, want %d chains, images, objects and layer paths", res, n)
	}
	slices.Sort(res.LayerPaths)
	if res.LayerPaths = slices.Compact(res.LayerPaths); len(res.LayerPaths) != n {
		t.Fatalf("layer paths repeat: %v", res.LayerPaths)
	}
	if res, _, err := RecordsOf(db).pruneOrphans(ctx, 2, true, nil, nil); err != nil || fmt.Sprint(res) != fmt.Sprint(PruneResult{}) {
		t.Fatalf("second prune = %+v, %v; want nothing left", res, err)
	}
}

// BenchmarkPruneOrphans is one pruning (run by every Cleanup) with nothing
// to prune, on a database of 1000 pulled and activated images. Compare
// with metadata's BenchmarkPing: each rule looks its rows up by index, so
// the cost is about one read per chain, object and layer, not their
// product.
func BenchmarkPruneOrphans(b *testing.B) {
	ctx := context.Background()
	db := metadatatest.Open(b)
	for i := range 1000 {
		if err := seed.WriteImage(ctx, db, i); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("1000 images", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if res, err := RecordsOf(db).PruneOrphans(ctx, true); err != nil || res.Chains+res.Images+res.Objects+len(res.LayerPaths) != 0 {
				b.Fatalf("PruneOrphans = %+v, %v; want nothing pruned", res, err)
			}
		}
	})
}

// TestPruneOrphansLayerFileOnlyWhileAnObjectNamesIt: a layer file is found
// only through an object record (check-exists looks the object up, then
// its file by digest), so once no object names it the file is pruned,
// even while its layer's chain stands for another image stored under
// another key in another compression.
func TestPruneOrphansLayerFileOnlyWhileAnObjectNamesIt(t *testing.T) {
	db := metadatatest.Open(t)
	w := seed.NewWorld(t, db)
	w.Pull("s3-a", "s3://bkt/a/", "a:latest", seed.TwoLayers("a/", "a")...)
	// s3-g's bottom layer is a/1.tar's layer (diff ID d1) stored gzipped
	// under g/1.tar: another file, digest gz1, on the same chain.
	w.Pull("s3-g", "s3://bkt/g/", "g:latest",
		seed.Layer{Key: "g/1.tar.gz", ETag: `"eg"`, Size: 400, Diff: "sha256:gz1", Chain: "sha256:d1"})
	w.Exec(`UPDATE layers SET diff_id = 'sha256:d1' WHERE digest = 'sha256:gz1'`)
	w.RemoveSnapshot(seed.ActivationKey("s3-a"))
	w.RemoveSnapshot("sha256:c-a")
	checkPrune(t, db, "prune", PruneResult{Chains: 1, Images: 1, Objects: 2,
		LayerPaths: []string{seed.LayerPath("sha256:d1"), seed.LayerPath("sha256:d-a")}})
	if !w.Has("layers", "digest = 'sha256:gz1'") || !w.Has("chains", "chain_id = 'sha256:d1'") {
		t.Errorf("s3-g's layer file or its chain was pruned")
	}
}

// TestPruneOrphansBoundedOnABusyHost: a host that pulls a new version of
// its images all the time, some run always live, while containerd removes
// the old versions: the records and layer files pruning forgets stay
// bounded by the images kept, however long the host runs.
func TestPruneOrphansBoundedOnABusyHost(t *testing.T) {
	db := metadatatest.Open(t)
	w := seed.NewWorld(t, db)
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	const kept, versions = 5, 60
	for v := range versions {
		// The download of the next version is always under way.
		w.Must(seed.InsertRun(ctx, db, seed.Run{ID: fmt.Sprintf("dl-%d", v), FSM: api.FSMDownload, IdempotencyID: fmt.Sprintf("obj-%d", v),
			State: "running", Created: t0, Request: fmt.Sprintf(`{"Bucket":"bkt","S3Key":"app/v%d/2.tar"}`, v+1)}))
		if v > 0 {
			w.Must(seed.FinishRun(ctx, db, fmt.Sprintf("dl-%d", v-1), "complete", t0))
		}
		w.Pull(fmt.Sprintf("s3-v%d", v), fmt.Sprintf("s3://bkt/app/v%d/", v), fmt.Sprintf("app:v%d", v), seed.TwoLayers(fmt.Sprintf("app/v%d/", v), fmt.Sprintf("v%d", v))...)
		if old := v - kept; old >= 0 {
			w.RemoveSnapshot(seed.ActivationKey(fmt.Sprintf("s3-v%d", old)))
			w.RemoveSnapshot(fmt.Sprintf("sha256:c-v%d", old))
		}
		if _, err := RecordsOf(db).PruneOrphans(ctx, true); err != nil {
			t.Fatalf("prune after version %d: %v", v, err)
		}
	}
	// Each kept image: two objects, its top layer; the bottom layer is
	// shared by all.
	if n, want := w.Count("s3_objects"), 2*kept; n != want {
		t.Errorf("%d object records after %d versions, %d kept; want %d", n, versions, kept, want)
	}
	if n, want := w.Count("layers"), kept+1; n != want {
		t.Errorf("%d layer records (and files) after %d versions, %d kept; want %d", n, versions, kept, want)
	}
}

// TestRemoveLayerFileOnlyTheOneRecorded: a pruned layer row's file is
// removed only while it is the file the row recorded; one a download of the
// same content renamed onto that path since is that download's.
func TestRemoveLayerFileOnlyTheOneRecorded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "blob")
	write := func() fileID {
		t.Helper()
		tmp := filepath.Join(dir, "tmp")
		if err := os.WriteFile(tmp, []byte("layer"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return stampOf(fi)
	}
	recorded := write()
	keep, err := os.Open(path) // the recorded file's inode stays in use, so the next one gets another
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	write()
	if err := removeLayerFile(path, recorded); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("file renamed onto the pruned row's path since it was recorded: %v; want it kept", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := removeLayerFile(path, stampOf(fi)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the recorded file: %v; want it removed", err)
	}
	if err := removeLayerFile(path, fileID{}); err != nil {
		t.Errorf("remove of a file already gone: %v", err)
	}
}

// TestLayerFilesInUse: the layer files a pull under way holds, or a live
// run names, are in use; pulls wait to hold objects until the caller
// releases.
func TestLayerFilesInUse(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 0)
	data := imageTar(t, 4<<10, 3)
	e.srv.Put(t, "s/1.tar", data)
	resp, _, err := e.download("s/1.tar")
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, want bool) {
		t.Helper()
		inUse, release, err := e.p.LayerFilesInUse(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if e.p.objectGate.TryRLock() {
			t.Errorf("%s: a pull could hold objects before the release", what)
		}
		release()
		if !e.p.objectGate.TryRLock() {
			t.Errorf("%s: pulls still kept from holding objects after the release", what)
		} else {
			e.p.objectGate.RUnlock()
		}
		if inUse[resp.Checksum] != want {
			t.Errorf("%s: layer file in use = %v, want %v", what, inUse[resp.Checksum], want)
		}
	}
	check("nothing under way", false)
	release := e.p.objectHolds.hold(resp.S3URL)
	check("a pull holding the object", true)
	release()
	if err := seed.InsertRun(ctx, e.db, seed.Run{ID: "dl", FSM: api.FSMDownload, IdempotencyID: "obj-x", State: "running",
		Created: time.Unix(1_800_000_000, 0), Request: `{"Bucket":"other","S3Key":"k"}`}); err != nil {
		t.Fatal(err)
	}
	check("a live download of another object", false)
	if err := e.db.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE fsm_runs SET response = json_object('checksum', ?) WHERE run_id = 'dl'`, resp.Checksum)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	check("a live download that downloaded the same content", true)
	if err := seed.FinishRun(ctx, e.db, "dl", "complete", time.Unix(1_800_000_001, 0)); err != nil {
		t.Fatal(err)
	}
	check("a finished download that downloaded the same content", false)
	release = e.p.runHolds.hold("obj-x")
	check("a finished download a pull holds", true)
	release()
}

// TestLayerFilesInUseDoesNotGrowWithObjects: LayerFilesInUse, during
// which pulls wait, looks up the objects the live runs name rather than
// reading every object recorded: fifty times as many objects cost about
// the same, not fifty times as much. The margin allowed (ten times) is
// far above what a busy machine adds to the fastest of five rounds, and
// far below what reading every object costs.
func TestLayerFilesInUseDoesNotGrowWithObjects(t *testing.T) {
	ctx := context.Background()
	per := func(objects int) time.Duration {
		e := newEnv(t, 0)
		if err := e.db.WithTx(ctx, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < ?)
				INSERT INTO s3_objects (bucket, key, etag, size_bytes, digest, downloaded_ns)
				SELECT 'bkt', 'k/' || n || '.tar', 'e', 1, 'sha256:' || n, 1 FROM i`, objects)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if err := seed.InsertRun(ctx, e.db, seed.Run{ID: fmt.Sprint("r", i), FSM: api.FSMActivate, IdempotencyID: fmt.Sprint("i", i), State: "running",
				Created: time.Unix(1_800_000_000, 0), Request: fmt.Sprintf(`{"source":"s3://bkt/k/","layers":[{"key":"k/%d.tar"}]}`, i+1)}); err != nil {
				t.Fatal(err)
			}
		}
		// The fastest of a few rounds: other processes share the machine.
		best := time.Duration(math.MaxInt64)
		for range 5 {
			start := time.Now()
			inUse, release, err := e.p.LayerFilesInUse(ctx)
			release()
			if err != nil || len(inUse) != 50 {
				t.Fatalf("layer files in use among %d objects: %d, %v; want the 50 the activate runs list", objects, len(inUse), err)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	small, large := per(2000), per(100000)
	t.Logf("layer files in use: %v among 2000 objects, %v among 100000", small, large)
	if large > 10*small {
		t.Errorf("layer files in use took %v among 100000 objects, %v among 2000: grows with the objects", large, small)
	}
}
