package metadata

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// pipelineImage writes what one pulled single-layer image leaves in the
// database: the layer's download (images row and blob), its committed chain
// snapshot in the snapshotter's tables, the unpacked chain, the activation
// (snapshot row and active snapshot) and the pulled-image record.
func pipelineImage(t *testing.T, ctx context.Context, db *DB, n int, chain, diff string) {
	t.Helper()
	layerID := fmt.Sprintf("layer-%d", n)
	url := fmt.Sprintf("s3://bkt/img%d/1.tar", n)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(db.StoreImageMetadata(ctx, layerID, url, "/blobs/"+diff, diff, 10))
	must(db.StoreBlob(ctx, Blob{Digest: diff, Path: "/blobs/" + diff, SizeBytes: 10, StatSize: 10, StatMtimeNs: 1, StatIno: 1}, ""))
	mustSnapTx(t, ctx, db, func(q SnapshotterQueries) error {
		r := db.SnapshotterReads()
		if _, ok, err := r.Snapshot(ctx, "", chain); err != nil || ok {
			return err // shared chain: committed once
		}
		id := uint32(100 + n)
		if err := q.InsertThinDevice(ctx, dev(id, ThinStateInactive)); err != nil {
			return err
		}
		_, err := q.InsertSnapshot(ctx, CDSnapshot{Key: chain, Kind: SnapKindCommitted, DeviceID: id, CreatedNs: 1, UpdatedNs: 1})
		return err
	})
	if c, err := db.GetChain(ctx, chain); err != nil {
		t.Fatal(err)
	} else if c == nil {
		must(db.StoreUnpackedChain(ctx, Chain{ChainID: chain, DiffID: diff, ImageID: layerID},
			UnpackedImageRecord{ImageID: layerID, DeviceID: "dev-" + layerID, DeviceName: "dm-" + layerID, DevicePath: "/dev/mapper/dm-" + layerID}))
	}
	c, err := db.GetChain(ctx, chain)
	must(err)
	u, err := db.CheckImageUnpacked(ctx, c.ImageID)
	must(err)
	imageID := fmt.Sprintf("image-%d", n)
	snap := "snap-" + imageID
	must(db.StoreImageMetadata(ctx, imageID, fmt.Sprintf("s3://bkt/img%d/", n), "", chain, 10))
	mustSnapTx(t, ctx, db, func(q SnapshotterQueries) error {
		id := uint32(200 + n)
		if err := q.InsertThinDevice(ctx, dev(id, ThinStateActive)); err != nil {
			return err
		}
		parent, _, err := db.SnapshotterReads().Snapshot(ctx, "", chain)
		if err != nil {
			return err
		}
		_, err = q.InsertSnapshot(ctx, CDSnapshot{Key: snap, Kind: SnapKindActive, ParentID: parent.ID, DeviceID: id, CreatedNs: 1, UpdatedNs: 1})
		return err
	})
	must(db.RegisterActivation(ctx, SnapshotRecord{ImageID: imageID, SnapshotID: u.DeviceID + "-snap-" + imageID, SnapshotName: snap,
		DevicePath: "/dev/mapper/" + snap, OriginDeviceID: u.DeviceID}))
	layers, _ := json.Marshal([]map[string]any{{"key": fmt.Sprintf("img%d/1.tar", n)}})
	must(db.StorePulledImage(ctx, PulledImage{Ref: fmt.Sprintf("ref-%d", n), Source: fmt.Sprintf("s3://bkt/img%d/", n), ImageID: imageID,
		Layers: string(layers), TopChainID: chain, SnapshotKey: snap}))
}

// testLayerURLs reads the layers of a record the way the pipeline writes
// them (key per layer, bucket from the source).
func testLayerURLs(p PulledImage) ([]string, error) {
	var ls []struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal([]byte(p.Layers), &ls); err != nil {
		return nil, err
	}
	var out []string
	for _, l := range ls {
		out = append(out, "s3://bkt/"+l.Key)
	}
	return out, nil
}

func removeSnapshot(t *testing.T, ctx context.Context, db *DB, key string) {
	t.Helper()
	mustSnapTx(t, ctx, db, func(q SnapshotterQueries) error {
		r, ok, err := db.SnapshotterReads().Snapshot(ctx, "", key)
		if err != nil || !ok {
			return fmt.Errorf("snapshot %s: ok=%v err=%v", key, ok, err)
		}
		return q.DeleteSnapshot(ctx, r.ID)
	})
}

func count(t *testing.T, ctx context.Context, db *DB, table string) int {
	t.Helper()
	var n int
	if err := db.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPruneOrphansAfterGC: what containerd's garbage collector leaves when
// it removed one of two images (its activation and, the chain being its
// own, the chain) is forgotten; the other image keeps everything.
func TestPruneOrphansAfterGC(t *testing.T) {
	db, ctx := openSnapStore(t)
	pipelineImage(t, ctx, db, 1, "sha256:c1", "sha256:d1")
	pipelineImage(t, ctx, db, 2, "sha256:c2", "sha256:d2")

	res, err := db.PruneOrphans(ctx, testLayerURLs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Snapshots+res.Chains+res.PulledImages+res.Images+len(res.BlobPaths) != 0 {
		t.Fatalf("prune with nothing removed removed %+v", res)
	}

	removeSnapshot(t, ctx, db, "snap-image-1")
	removeSnapshot(t, ctx, db, "sha256:c1")
	res, err = db.PruneOrphans(ctx, testLayerURLs)
	if err != nil {
		t.Fatal(err)
	}
	want := PruneResult{Snapshots: 1, Chains: 1, PulledImages: 1, Images: 2, BlobPaths: []string{"/blobs/sha256:d1"}}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("prune = %+v, want %+v", res, want)
	}
	for table, n := range map[string]int{"images": 2, "unpacked_images": 1, "pipeline_chains": 1, "snapshots": 1, "pipeline_images": 1, "pipeline_blobs": 1} {
		if got := count(t, ctx, db, table); got != n {
			t.Errorf("%s has %d rows after prune, want %d (image 2's)", table, got, n)
		}
	}
	if p, err := db.GetPulledImage(ctx, "ref-2"); err != nil || p == nil {
		t.Errorf("image 2's record pruned: %v %v", p, err)
	}
}

// TestPruneOrphansWaitsForLiveRuns: while a run is pending, downloads and
// blobs nobody refers to yet may belong to a pull under way: they stay.
func TestPruneOrphansWaitsForLiveRuns(t *testing.T) {
	db, ctx := openSnapStore(t)
	pipelineImage(t, ctx, db, 1, "sha256:c1", "sha256:d1")
	removeSnapshot(t, ctx, db, "snap-image-1")
	removeSnapshot(t, ctx, db, "sha256:c1")
	if _, err := db.db.ExecContext(ctx, `INSERT INTO fsm_runs (run_id, fsm, idempotency_id, request, transition, state, created_at, updated_at)
		VALUES ('r1', 'download-image', 'x', '{}', 'download', 'running', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	res, err := db.PruneOrphans(ctx, testLayerURLs)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Deferred || res.Images != 0 || len(res.BlobPaths) != 0 || res.Chains != 1 {
		t.Fatalf("prune with a live run = %+v, want chains pruned, images and blobs deferred", res)
	}
	if n := count(t, ctx, db, "pipeline_blobs"); n != 1 {
		t.Errorf("blob pruned under a live run")
	}
	if _, err := db.db.ExecContext(ctx, `UPDATE fsm_runs SET state = 'complete'`); err != nil {
		t.Fatal(err)
	}
	res, err = db.PruneOrphans(ctx, testLayerURLs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deferred || res.Images != 2 || len(res.BlobPaths) != 1 || !strings.HasSuffix(res.BlobPaths[0], "d1") {
		t.Fatalf("prune once idle = %+v", res)
	}
}
