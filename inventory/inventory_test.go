package inventory

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// TestListings: the ls listings show each image's state, names, layer
// count, device and lock; each unpacked device's references; each chain's
// device, users and children; each activation; each lock with its age.
func TestListings(t *testing.T) {
	ctx, db := context.Background(), metadatatest.Open(t)
	w, t0 := seed.Listed(t, db)

	imgs, err := Images(ctx, db)
	if err != nil || len(imgs) != 3 {
		t.Fatalf("Images = %+v, %v; want 3 images", imgs, err)
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
		t.Errorf("Images:\n got  %+v\n want %+v", got, want)
	}

	unp, err := UnpackedImages(ctx, db)
	if err != nil || len(unp) != 2 {
		t.Fatalf("UnpackedImages = %+v, %v", unp, err)
	}
	if u := unp[0]; u.ImageID != "s3-a" || u.DeviceName != "pool-snap-2" || u.DevicePath != "/dev/mapper/pool-snap-2" ||
		u.SizeBytes != 6000 || u.FileCount != 6 || !u.LayoutVerified || u.RefCount != 1 || u.ActiveRefs != 1 || u.UnpackedAt.IsZero() {
		t.Errorf("unpacked s3-a = %+v", u)
	}
	if u := unp[1]; u.ImageID != "s3-b" || u.DeviceID != "4" || u.RefCount != 0 || u.ActiveRefs != 0 {
		t.Errorf("unpacked s3-b = %+v", u)
	}

	chains, err := Chains(ctx, db)
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
		t.Errorf("Chains:\n got  %v\n want %v", gotChains, wantChains)
	}

	snaps, err := Snapshots(ctx, db)
	want1 := Snapshot{SnapshotID: "2-snap-s3-a", SnapshotName: "snap-s3-a", ImageID: "s3-a", S3Key: "s3://bkt/a/",
		DevicePath: "/dev/mapper/pool-snap-3", OriginDeviceID: "2", OriginDeviceName: "pool-snap-2", Active: true, CreatedAt: time.Unix(2, 0).UTC()}
	if err != nil || len(snaps) != 1 || snaps[0] != want1 {
		t.Errorf("Snapshots = %+v, %v; want [%+v]", snaps, err, want1)
	}

	locks, err := Locks(ctx, db, t0.Add(90*time.Second))
	wantLock := Lock{ImageID: "s3-a", LockedBy: "activate-image:r-a", LockedAt: t0, Age: 90 * time.Second}
	if err != nil || len(locks) != 1 || locks[0] != wantLock {
		t.Errorf("Locks = %+v, %v; want [%+v] (the running run, not the pending one)", locks, err, wantLock)
	}

	// Containerd removed s3-a's activation: it is unpacked again.
	w.RemoveSnapshot(seed.ActivationKey("s3-a"))
	imgs, _ = Images(ctx, db)
	if imgs[0].State != ImageStateUnpacked || imgs[0].ActiveSnapshots != 0 {
		t.Errorf("s3-a without its activation: state %s, %d active snapshots; want unpacked, 0", imgs[0].State, imgs[0].ActiveSnapshots)
	}
	if s, _ := Snapshots(ctx, db); len(s) != 0 {
		t.Errorf("Snapshots after the activation was removed = %+v", s)
	}
}

// rowCount turns listing into a function giving the number of rows it
// listed, so that listings of different row types can be run alike.
func rowCount[T any](listing func(context.Context, *metadata.DB) ([]T, error)) func(context.Context, *metadata.DB) (int, error) {
	return func(ctx context.Context, d *metadata.DB) (int, error) {
		v, err := listing(ctx, d)
		return len(v), err
	}
}

// BenchmarkListings runs each `ls` listing once per iteration on a database
// of 1000 pulled and activated images. Compare with metadata's
// BenchmarkPing: a listing reads every image once, so it should cost about
// as many round trips' worth of row reads as there are images, not grow
// with their square.
func BenchmarkListings(b *testing.B) {
	const images = 1000
	ctx := context.Background()
	db := metadatatest.Open(b)
	for i := range images {
		if err := seed.WriteImage(ctx, db, i); err != nil {
			b.Fatal(err)
		}
	}
	for name, listing := range map[string]func(context.Context, *metadata.DB) (int, error){
		"Images":         rowCount(Images),
		"UnpackedImages": rowCount(UnpackedImages),
		"Chains":         rowCount(Chains),
		"Snapshots":      rowCount(Snapshots),
	} {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if n, err := listing(ctx, db); err != nil || n != images {
					b.Fatalf("%s listed %d rows, %v; want %d", name, n, err, images)
				}
			}
		})
	}
}

// TestImageStateFailedWhateverItsActivation: an image's state is failed
// when its last pull failed (ImageStateFailed), whether the activation an
// earlier pull made is still there or not.
func TestImageStateFailedWhateverItsActivation(t *testing.T) {
	ctx, db := context.Background(), metadatatest.Open(t)
	w := seed.NewWorld(t, db)
	w.Pull("s3-a", "s3://bkt/a/", "a:latest", seed.TwoLayers("a/", "a")...)
	w.PullNoActivation("s3-b", "s3://bkt/b/", "b:latest", seed.TwoLayers("b/", "b")...)
	for _, id := range []string{"s3-a", "s3-b"} {
		w.Must(seed.MarkImageFailed(ctx, db, id, "s3://bkt/"+id[3:]+"/", "list s3://bkt: access denied"))
	}
	imgs, err := Images(ctx, db)
	if err != nil || len(imgs) != 2 {
		t.Fatalf("Images = %+v, %v", imgs, err)
	}
	for _, v := range imgs {
		if v.State != ImageStateFailed {
			t.Errorf("image %s, whose last pull failed (%q), active snapshots %d: state %s, want %s", v.ImageID, v.FailureReason, v.ActiveSnapshots, v.State, ImageStateFailed)
		}
	}
}

// TestImageLastUsedIsWhatCollectionReads: an image's last use is the one
// garbage collection removes the least recent of first: the later of its
// last pull and its last touch (a re-pull whose client left before any
// touch counts at its pull), and none for an image never pulled, however
// many of its tries failed (each records the try's time as used_ns, for
// retention).
func TestImageLastUsedIsWhatCollectionReads(t *testing.T) {
	ctx, db := context.Background(), metadatatest.Open(t)
	w := seed.NewWorld(t, db)
	w.PullNoActivation("s3-r", "s3://bkt/r/", "r:latest", seed.TwoLayers("r/", "r")...)
	touched, repulled := time.Unix(1_800_000_000, 0).UTC(), time.Unix(1_800_003_600, 0).UTC()
	w.Exec(`UPDATE s3_images SET used_ns = ?, pulled_ns = ? WHERE image_id = 's3-r'`, touched.UnixNano(), repulled.UnixNano())
	w.Must(seed.MarkImageFailed(ctx, db, "s3-f", "s3://bkt/f.tar", "list s3://bkt: access denied"))
	w.Exec(`UPDATE s3_images SET used_ns = created_ns WHERE image_id = 's3-f'`) // a second failed try
	imgs, err := Images(ctx, db)
	if err != nil || len(imgs) != 2 {
		t.Fatalf("Images = %+v, %v", imgs, err)
	}
	for _, v := range imgs {
		switch v.ImageID {
		case "s3-r":
			if !v.LastUsedAt.Equal(repulled) {
				t.Errorf("image re-pulled at %v, last touched at %v: LastUsedAt %v, want its re-pull", repulled, touched, v.LastUsedAt)
			}
		case "s3-f":
			if !v.LastUsedAt.IsZero() {
				t.Errorf("image never pulled, tried twice: LastUsedAt %v, want none", v.LastUsedAt)
			}
		}
	}
}
