package metadata

import (
	"database/sql"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// viewsWorld writes three images: s3-a pulled (two layers) and activated
// with two names and a running run on it, s3-b pulled (sharing s3-a's
// bottom layer) and not activated, s3-c whose only pull failed; and a
// pending run. It returns the running run's start time.
func viewsWorld(t *testing.T) (*world, time.Time) {
	w := newWorld(t)
	w.pull("s3-a", "s3://bkt/a/", "a:latest", twoLayers("a/", "a")...) // thin ids 1 (d1), 2 (c-a), 3 (activation)
	w.addName("a:v1", "s3-a")
	w.pullNoActivation("s3-b", "s3://bkt/b/", "b:latest", twoLayers("b/", "b")...) // thin id 4 (c-b)
	w.must(markImageFailed(w.ctx, w.db, "s3-c", "s3://bkt/c.tar", `validate s3://bkt/c.tar: entry "../x" climbs above the root`))
	t0 := time.Unix(1_800_000_000, 0).UTC()
	for _, r := range []testRun{
		{ID: "r-a", FSM: "activate-image", IdempotencyID: "s3-a", State: "running", Started: t0},
		{ID: "r-p", FSM: "download-image", IdempotencyID: "sha256:zz", State: "pending"},
	} {
		r.Created = t0.Add(-time.Second)
		if err := insertRun(w.ctx, w.db, r); err != nil {
			t.Fatalf("insert run %s: %v", r.ID, err)
		}
	}
	return w, t0
}

// TestViewsOfTheFirstSchema: the images, unpacked_images, snapshots and
// image_locks views, read with plain SQL as an operator would, show the
// records with the first schema's columns.
func TestViewsOfTheFirstSchema(t *testing.T) {
	w, _ := viewsWorld(t)
	rows := func(q string) []string {
		t.Helper()
		rs, err := w.db.db.QueryContext(w.ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rs.Close()
		cols, _ := rs.Columns()
		var out []string
		for rs.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rs.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			var f []string
			for _, v := range vals {
				if v.Valid {
					f = append(f, v.String)
				} else {
					f = append(f, "NULL")
				}
			}
			out = append(out, strings.Join(f, "|"))
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(q string, want ...string) {
		t.Helper()
		if got := rows(q); !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got  %q\n want %q", q, got, want)
		}
	}
	check(`SELECT image_id, s3_key, download_status, activation_status, checksum, size_bytes, local_path, failure_reason,
		activated_at, downloaded_at IS NOT NULL FROM images ORDER BY id`,
		"s3-a|s3://bkt/a/|completed|active|sha256:c-a|3000|/blobs/d-a|NULL|1970-01-01 00:00:02|1",
		"s3-b|s3://bkt/b/|completed|inactive|sha256:c-b|3000|/blobs/d-b|NULL|NULL|1",
		`s3-c|s3://bkt/c.tar|failed|inactive|NULL|0||validate s3://bkt/c.tar: entry "../x" climbs above the root|NULL|0`)
	check(`SELECT image_id, device_id, device_name, device_path, size_bytes, file_count, layout_verified FROM unpacked_images ORDER BY id`,
		"s3-a|2|pool-snap-2|/dev/mapper/pool-snap-2|6000|6|1",
		"s3-b|4|pool-snap-4|/dev/mapper/pool-snap-4|6000|6|1")
	check(`SELECT image_id, snapshot_id, snapshot_name, device_path, origin_device_id, active, created_at, deactivated_at FROM snapshots`,
		"s3-a|2-snap-s3-a|snap-s3-a|/dev/mapper/pool-snap-3|2|1|1970-01-01 00:00:02|NULL")
	check(`SELECT image_id, locked_at, locked_by FROM image_locks`, "s3-a|1800000000|activate-image:r-a")

	// The views are derived: they cannot be written.
	for _, q := range []string{
		`INSERT INTO images (image_id, s3_key, local_path, size_bytes) VALUES ('x', 'x', '/x', 1)`,
		`DELETE FROM unpacked_images`,
		`UPDATE snapshots SET active = 0`,
		`DELETE FROM image_locks`,
	} {
		if _, err := w.db.db.ExecContext(w.ctx, q); err == nil || !strings.Contains(err.Error(), "view") {
			t.Errorf("%s: err = %v, want a refusal to modify a view", q, err)
		}
	}

	// The run finishing releases its lock.
	w.must(finishRun(w.ctx, w.db, "r-a", "complete", time.Unix(1_800_000_100, 0)))
	check(`SELECT image_id FROM image_locks`)
}

// TestListingViews: the ls listings show each image's state, names, layer
// count, device and lock; each unpacked device's references; each chain's
// device, users and children; each activation; each lock with its age.
func TestListingViews(t *testing.T) {
	w, t0 := viewsWorld(t)
	ctx, db := w.ctx, w.db

	imgs, err := db.ImageViews(ctx)
	if err != nil || len(imgs) != 3 {
		t.Fatalf("ImageViews = %+v, %v; want 3 images", imgs, err)
	}
	type imageSummary struct {
		ID, State, Names       string
		Layers                 int
		Size                   int64
		DeviceID, DeviceName   string
		Active                 int
		LockedBy, Failure, Sum string
	}
	var got []imageSummary
	for _, v := range imgs {
		got = append(got, imageSummary{v.ImageID, v.State, fmt.Sprint(v.Names), v.Layers, v.SizeBytes, v.DeviceID, v.DeviceName,
			v.ActiveSnapshots, v.LockedBy, v.FailureReason, v.Checksum})
		if v.CreatedAt.IsZero() || v.UpdatedAt.IsZero() || v.Names == nil {
			t.Errorf("image %s: times %v %v, names %v", v.ImageID, v.CreatedAt, v.UpdatedAt, v.Names)
		}
	}
	want := []imageSummary{
		{"s3-a", ImageStateActive, "[a:latest a:v1]", 2, 3000, "2", "pool-snap-2", 1, "activate-image:r-a", "", "sha256:c-a"},
		{"s3-b", ImageStateUnpacked, "[b:latest]", 2, 3000, "4", "pool-snap-4", 0, "", "", "sha256:c-b"},
		{"s3-c", ImageStateFailed, "[]", 0, 0, "", "", 0, "", `validate s3://bkt/c.tar: entry "../x" climbs above the root`, ""},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ImageViews:\n got  %+v\n want %+v", got, want)
	}

	unp, err := db.UnpackedViews(ctx)
	if err != nil || len(unp) != 2 {
		t.Fatalf("UnpackedViews = %+v, %v", unp, err)
	}
	if u := unp[0]; u.ImageID != "s3-a" || u.DeviceName != "pool-snap-2" || u.DevicePath != "/dev/mapper/pool-snap-2" ||
		u.SizeBytes != 6000 || u.FileCount != 6 || !u.LayoutVerified || u.RefCount != 1 || u.ActiveRefs != 1 || u.UnpackedAt.IsZero() {
		t.Errorf("unpacked s3-a = %+v", u)
	}
	if u := unp[1]; u.ImageID != "s3-b" || u.DeviceID != "4" || u.RefCount != 0 || u.ActiveRefs != 0 {
		t.Errorf("unpacked s3-b = %+v", u)
	}

	chains, err := db.ChainViews(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gotChains := map[string]string{}
	for _, c := range chains {
		gotChains[c.ChainID] = fmt.Sprintf("parent=%s diff=%s dev=%d %s size=%d files=%d images=%d children=%d",
			c.Parent, c.DiffID, c.DeviceID, c.DeviceName, c.SizeBytes, c.FileCount, c.Images, c.Children)
	}
	wantChains := map[string]string{
		"sha256:d1":  "parent= diff=sha256:d1 dev=1 pool-snap-1 size=2000 files=3 images=2 children=2",
		"sha256:c-a": "parent=sha256:d1 diff=sha256:d-a dev=2 pool-snap-2 size=4000 files=3 images=1 children=1",
		"sha256:c-b": "parent=sha256:d1 diff=sha256:d-b dev=4 pool-snap-4 size=4000 files=3 images=1 children=0",
	}
	if !reflect.DeepEqual(gotChains, wantChains) {
		t.Errorf("ChainViews:\n got  %v\n want %v", gotChains, wantChains)
	}

	snaps, err := db.SnapshotViews(ctx)
	want1 := SnapshotView{SnapshotID: "2-snap-s3-a", SnapshotName: "snap-s3-a", ImageID: "s3-a", S3Key: "s3://bkt/a/",
		DevicePath: "/dev/mapper/pool-snap-3", OriginDeviceID: "2", OriginDeviceName: "pool-snap-2", Active: true, CreatedAt: time.Unix(2, 0).UTC()}
	if err != nil || len(snaps) != 1 || snaps[0] != want1 {
		t.Errorf("SnapshotViews = %+v, %v; want [%+v]", snaps, err, want1)
	}

	locks, err := db.LockViews(ctx, t0.Add(90*time.Second))
	wantLock := LockView{ImageID: "s3-a", LockedBy: "activate-image:r-a", LockedAt: t0, Age: 90 * time.Second}
	if err != nil || len(locks) != 1 || locks[0] != wantLock {
		t.Errorf("LockViews = %+v, %v; want [%+v] (the running run, not the pending one)", locks, err, wantLock)
	}

	// Containerd removed s3-a's activation: it is unpacked again.
	w.removeSnapshot(activationKey("s3-a"))
	imgs, _ = db.ImageViews(ctx)
	if imgs[0].State != ImageStateUnpacked || imgs[0].ActiveSnapshots != 0 {
		t.Errorf("s3-a without its activation: state %s, %d active snapshots; want unpacked, 0", imgs[0].State, imgs[0].ActiveSnapshots)
	}
	if s, _ := db.SnapshotViews(ctx); len(s) != 0 {
		t.Errorf("SnapshotViews after the activation was removed = %+v", s)
	}
}
