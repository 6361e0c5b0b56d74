package metadata

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// seedImage stores a completed image and returns its id.
func seedImage(t testing.TB, d *DB, n int) (imageID, s3Key string) {
	t.Helper()
	imageID, s3Key = fmt.Sprintf("img-%d", n), fmt.Sprintf("images/family/%d.tar", n)
	if err := d.StoreImageMetadata(context.Background(), imageID, s3Key, "/var/lib/x/"+imageID+".tar", "sha-"+imageID, int64(1000+n)); err != nil {
		t.Fatalf("StoreImageMetadata(%s): %v", imageID, err)
	}
	return imageID, s3Key
}

func seedUnpacked(t testing.TB, d *DB, imageID string, dev int) UnpackedImageRecord {
	t.Helper()
	r := UnpackedImageRecord{ImageID: imageID, DeviceID: fmt.Sprint(dev), DeviceName: fmt.Sprintf("thin-%d", dev),
		DevicePath: fmt.Sprintf("/dev/mapper/thin-%d", dev), SizeBytes: 5000, FileCount: 15}
	if err := d.StoreUnpackedImage(context.Background(), r); err != nil {
		t.Fatalf("StoreUnpackedImage(%s): %v", imageID, err)
	}
	return r
}

func snapRecord(imageID, originDev string, n int) SnapshotRecord {
	return SnapshotRecord{ImageID: imageID, SnapshotID: fmt.Sprintf("%s-snap-%s-%d", originDev, imageID, n),
		SnapshotName: fmt.Sprintf("snapshot-%s-%d", imageID, n), DevicePath: fmt.Sprintf("/dev/mapper/snapshot-%s-%d", imageID, n),
		OriginDeviceID: originDev}
}

func TestImages(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)

	if img, err := d.CheckImageDownloaded(ctx, "images/a.tar"); err != nil || img != nil {
		t.Fatalf("CheckImageDownloaded on empty DB = %v, %v; want nil, nil", img, err)
	}
	if err := d.StoreImageMetadata(ctx, "img-a", "images/a.tar", "/d/a.tar", "abc", 1024); err != nil {
		t.Fatal(err)
	}
	img, err := d.CheckImageDownloaded(ctx, "images/a.tar")
	if err != nil || img == nil {
		t.Fatalf("CheckImageDownloaded after store = %v, %v", img, err)
	}
	if img.ImageID != "img-a" || img.LocalPath != "/d/a.tar" || img.Checksum != "abc" || img.SizeBytes != 1024 ||
		img.DownloadStatus != DownloadCompleted || img.ActivationStatus != ActivationInactive || img.DownloadedAt.IsZero() || img.CreatedAt.IsZero() {
		t.Errorf("stored image = %+v", img)
	}

	// Upsert: same s3 key, new path/size: one row, updated values, same id.
	if err := d.StoreImageMetadata(ctx, "img-a", "images/a.tar", "/d/a2.tar", "def", 2048); err != nil {
		t.Fatal(err)
	}
	imgs, err := d.ListImages(ctx, "")
	if err != nil || len(imgs) != 1 {
		t.Fatalf("ListImages after upsert = %d rows, %v; want 1", len(imgs), err)
	}
	if imgs[0].ID != img.ID || imgs[0].LocalPath != "/d/a2.tar" || imgs[0].Checksum != "def" || imgs[0].SizeBytes != 2048 {
		t.Errorf("upserted image = %+v", imgs[0])
	}
	// The same image id under another key breaks UNIQUE(image_id).
	if err := d.StoreImageMetadata(ctx, "img-a", "images/other.tar", "/d/o.tar", "", 1); err == nil {
		t.Errorf("StoreImageMetadata accepted image id img-a for a second s3 key")
	}
	if err := d.StoreImageMetadata(ctx, "img-n", "images/n.tar", "/d/n.tar", "", -1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative size: err = %v, want ErrInvalidArgument", err)
	}

	got, err := d.GetImageByID(ctx, "img-a")
	if err != nil || got.S3Key != "images/a.tar" {
		t.Fatalf("GetImageByID = %+v, %v", got, err)
	}
	if _, err := d.GetImageByID(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetImageByID(nope) err = %v, want ErrNotFound", err)
	}

	if err := d.UpdateImageActivationStatus(ctx, "img-a", ActivationActive); err != nil {
		t.Fatal(err)
	}
	got, _ = d.GetImageByID(ctx, "img-a")
	if got.ActivationStatus != ActivationActive || got.ActivatedAt.IsZero() {
		t.Errorf("after activation: status %q activated_at %v", got.ActivationStatus, got.ActivatedAt)
	}
	if err := d.UpdateImageActivationStatus(ctx, "img-a", "bogus"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bogus activation status: err = %v, want ErrInvalidArgument", err)
	}
	if err := d.UpdateImageActivationStatus(ctx, "nope", ActivationActive); !errors.Is(err, ErrNotFound) {
		t.Errorf("activation of unknown image: err = %v, want ErrNotFound", err)
	}
	if err := d.MarkImageActivationFailed(ctx, "img-a", "create_snap: pool full"); err != nil {
		t.Fatal(err)
	}
	got, _ = d.GetImageByID(ctx, "img-a")
	if got.ActivationStatus != ActivationFailed || got.FailureReason != "create_snap: pool full" {
		t.Errorf("after activation failure: %q %q", got.ActivationStatus, got.FailureReason)
	}
	if err := d.UpdateImageActivationStatus(ctx, "img-a", ActivationActive); err != nil {
		t.Fatal(err)
	}
	if got, _ = d.GetImageByID(ctx, "img-a"); got.FailureReason != "" {
		t.Errorf("failure reason %q kept after a successful activation", got.FailureReason)
	}

	// A validation failure before store-metadata: a new failed row with the reason.
	fail := ImageFailure{ImageID: "img-b", S3Key: "images/b.tar", LocalPath: "/d/b.tar", SizeBytes: 10,
		Reason: `entry "../etc/passwd": path climbs above the root`}
	if err := d.MarkImageFailed(ctx, fail); err != nil {
		t.Fatal(err)
	}
	if img, err := d.CheckImageDownloaded(ctx, "images/b.tar"); err != nil || img != nil {
		t.Errorf("a failed image counts as downloaded: %+v, %v", img, err)
	}
	failed, err := d.ListImages(ctx, DownloadFailed)
	if err != nil || len(failed) != 1 || failed[0].ImageID != "img-b" || failed[0].FailureReason != fail.Reason {
		t.Fatalf("ListImages(failed) = %+v, %v", failed, err)
	}
	if err := d.MarkImageFailed(ctx, ImageFailure{ImageID: "img-b", S3Key: "images/b.tar"}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("MarkImageFailed without a reason: err = %v, want ErrInvalidArgument", err)
	}
	// A later successful download clears the failure.
	if err := d.StoreImageMetadata(ctx, "img-b", "images/b.tar", "/d/b.tar", "sum", 10); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.GetImageByID(ctx, "img-b"); got.DownloadStatus != DownloadCompleted || got.FailureReason != "" {
		t.Errorf("after a successful re-download: %q %q", got.DownloadStatus, got.FailureReason)
	}
	completed, _ := d.ListImages(ctx, DownloadCompleted)
	if len(completed) != 2 {
		t.Errorf("ListImages(completed) = %d rows, want 2", len(completed))
	}
}

func TestUnpackedImages(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	imageID, _ := seedImage(t, d, 1)

	if u, err := d.CheckImageUnpacked(ctx, imageID); err != nil || u != nil {
		t.Fatalf("CheckImageUnpacked before unpack = %v, %v", u, err)
	}
	// The image must exist (foreign key).
	if err := d.StoreUnpackedImage(ctx, UnpackedImageRecord{ImageID: "ghost", DeviceID: "9", DeviceName: "thin-9", DevicePath: "/dev/mapper/thin-9"}); err == nil {
		t.Errorf("StoreUnpackedImage accepted an image that does not exist")
	}
	r := seedUnpacked(t, d, imageID, 12345)
	u, err := d.CheckImageUnpacked(ctx, imageID)
	if err != nil || u == nil || !u.LayoutVerified || u.DeviceID != "12345" || u.DeviceName != "thin-12345" || u.FileCount != 15 {
		t.Fatalf("CheckImageUnpacked = %+v, %v", u, err)
	}
	// Upsert: new device for the same image replaces the record.
	r.DeviceID, r.DeviceName, r.DevicePath, r.FileCount = "777", "thin-777", "/dev/mapper/thin-777", 20
	if err := d.StoreUnpackedImage(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := d.StoreUnpackedImage(ctx, r); err != nil {
		t.Fatal(err)
	}
	all, err := d.ListUnpackedImages(ctx)
	if err != nil || len(all) != 1 || all[0].ID != u.ID || all[0].DeviceID != "777" || all[0].FileCount != 20 {
		t.Fatalf("ListUnpackedImages after upserts = %+v, %v", all, err)
	}
	if got, err := d.GetUnpackedImageByID(ctx, imageID); err != nil || got.DeviceName != "thin-777" {
		t.Errorf("GetUnpackedImageByID = %+v, %v", got, err)
	}
	if got, err := d.GetUnpackedImageByDeviceID(ctx, "777"); err != nil || got.ImageID != imageID {
		t.Errorf("GetUnpackedImageByDeviceID = %+v, %v", got, err)
	}
	if _, err := d.GetUnpackedImageByDeviceID(ctx, "12345"); !errors.Is(err, ErrNotFound) {
		t.Errorf("old device id still found: %v", err)
	}
	// Device ids and names are unique across images.
	other, _ := seedImage(t, d, 2)
	if err := d.StoreUnpackedImage(ctx, UnpackedImageRecord{ImageID: other, DeviceID: "777", DeviceName: "thin-x", DevicePath: "/x"}); err == nil {
		t.Errorf("a second image got device id 777")
	}
	if err := d.DeleteUnpackedImage(ctx, imageID); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteUnpackedImage(ctx, imageID); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if _, err := d.GetUnpackedImageByID(ctx, imageID); !errors.Is(err, ErrNotFound) {
		t.Errorf("after delete: %v, want ErrNotFound", err)
	}
}

func TestSnapshots(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	imageID, s3Key := seedImage(t, d, 1)
	seedUnpacked(t, d, imageID, 100)

	if sn, err := d.CheckSnapshotExists(ctx, imageID, "snapshot-"+imageID+"-1"); err != nil || sn != nil {
		t.Fatalf("CheckSnapshotExists before = %v, %v", sn, err)
	}
	// Foreign keys: the image and the origin device must exist.
	if err := d.StoreSnapshot(ctx, snapRecord("ghost", "100", 1)); err == nil {
		t.Errorf("StoreSnapshot accepted a missing image")
	}
	if err := d.StoreSnapshot(ctx, snapRecord(imageID, "999", 1)); err == nil {
		t.Errorf("StoreSnapshot accepted a missing origin device")
	}
	r1 := snapRecord(imageID, "100", 1)
	if err := d.StoreSnapshot(ctx, r1); err != nil {
		t.Fatal(err)
	}
	sn, err := d.CheckSnapshotExists(ctx, imageID, r1.SnapshotName)
	if err != nil || sn == nil || !sn.Active || sn.SnapshotID != r1.SnapshotID || sn.OriginDeviceID != "100" {
		t.Fatalf("CheckSnapshotExists = %+v, %v", sn, err)
	}
	if got, err := d.GetSnapshotByID(ctx, r1.SnapshotID); err != nil || got.SnapshotName != r1.SnapshotName {
		t.Errorf("GetSnapshotByID = %+v, %v", got, err)
	}
	if _, err := d.GetSnapshotByID(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSnapshotByID(nope): %v, want ErrNotFound", err)
	}
	if err := d.DeactivateSnapshot(ctx, r1.SnapshotID); err != nil {
		t.Fatal(err)
	}
	sn, _ = d.GetSnapshotByID(ctx, r1.SnapshotID)
	if sn.Active || sn.DeactivatedAt.IsZero() {
		t.Errorf("after deactivate: active %v deactivated_at %v", sn.Active, sn.DeactivatedAt)
	}
	if err := d.DeactivateSnapshot(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("DeactivateSnapshot(nope): %v, want ErrNotFound", err)
	}
	if act, _ := d.ListActiveSnapshots(ctx); len(act) != 0 {
		t.Errorf("ListActiveSnapshots after deactivate = %d", len(act))
	}
	// Storing the same name again re-activates the same row.
	if err := d.StoreSnapshot(ctx, r1); err != nil {
		t.Fatal(err)
	}
	again, _ := d.GetSnapshotByID(ctx, r1.SnapshotID)
	if !again.Active || again.ID != sn.ID || !again.DeactivatedAt.IsZero() {
		t.Errorf("re-stored snapshot = %+v (was id %d)", again, sn.ID)
	}

	// The register transaction: snapshot + image activation together.
	r2 := snapRecord(imageID, "100", 2)
	if err := d.RegisterActivation(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if err := d.RegisterActivation(ctx, r2); err != nil {
		t.Fatalf("repeated register: %v", err)
	}
	img, _ := d.GetImageByID(ctx, imageID)
	if img.ActivationStatus != ActivationActive || img.ActivatedAt.IsZero() {
		t.Errorf("image after register: %q %v", img.ActivationStatus, img.ActivatedAt)
	}
	byImage, err := d.GetSnapshotsByImageID(ctx, imageID)
	if err != nil || len(byImage) != 2 || byImage[0].SnapshotID != r1.SnapshotID || byImage[1].SnapshotID != r2.SnapshotID {
		t.Fatalf("GetSnapshotsByImageID = %+v, %v", byImage, err)
	}
	// A register that fails (origin device missing) changes nothing.
	other, _ := seedImage(t, d, 2)
	if err := d.RegisterActivation(ctx, snapRecord(other, "404", 1)); err == nil {
		t.Fatalf("RegisterActivation with a missing origin device succeeded")
	}
	if o, _ := d.GetImageByID(ctx, other); o.ActivationStatus != ActivationInactive {
		t.Errorf("failed register still activated the image: %q", o.ActivationStatus)
	}

	// The seed's idempotency checks by s3 key.
	if u, err := d.CheckImageUnpackedByS3Key(ctx, s3Key); err != nil || u == nil || u.DeviceID != "100" {
		t.Errorf("CheckImageUnpackedByS3Key = %+v, %v", u, err)
	}
	if s, err := d.CheckImageActivatedByS3Key(ctx, s3Key); err != nil || s == nil || s.SnapshotID != r1.SnapshotID {
		t.Errorf("CheckImageActivatedByS3Key = %+v, %v", s, err)
	}
	otherKey := "images/family/2.tar"
	if u, err := d.CheckImageUnpackedByS3Key(ctx, otherKey); err != nil || u != nil {
		t.Errorf("CheckImageUnpackedByS3Key(not unpacked) = %+v, %v", u, err)
	}
	if s, err := d.CheckImageActivatedByS3Key(ctx, otherKey); err != nil || s != nil {
		t.Errorf("CheckImageActivatedByS3Key(not activated) = %+v, %v", s, err)
	}
	st, err := d.GetImageStatus(ctx, s3Key)
	if err != nil || len(st) != 2 {
		t.Fatalf("GetImageStatus = %+v, %v; want 2 rows", st, err)
	}
	for i, want := range []string{r1.SnapshotName, r2.SnapshotName} {
		if st[i].ImageID != imageID || st[i].DeviceName != "thin-100" || st[i].SnapshotName != want || !st[i].SnapshotActive || st[i].ActivationStatus != ActivationActive {
			t.Errorf("status row %d = %+v", i, st[i])
		}
	}
	if st, err := d.GetImageStatus(ctx, otherKey); err != nil || len(st) != 1 || st[0].DeviceName != "" || st[0].SnapshotName != "" {
		t.Errorf("GetImageStatus(no device, no snapshot) = %+v, %v", st, err)
	}
	if st, err := d.GetImageStatus(ctx, "images/unknown.tar"); err != nil || len(st) != 0 {
		t.Errorf("GetImageStatus(unknown) = %+v, %v", st, err)
	}

	// Delete is idempotent; the active list follows.
	if err := d.DeleteSnapshot(ctx, r1.SnapshotID); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteSnapshot(ctx, r1.SnapshotID); err != nil {
		t.Errorf("second delete: %v", err)
	}
	act, err := d.ListActiveSnapshots(ctx)
	if err != nil || len(act) != 1 || act[0].SnapshotID != r2.SnapshotID {
		t.Errorf("ListActiveSnapshots = %+v, %v", act, err)
	}
}

func TestImageLocks(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(dd time.Duration) { mu.Lock(); now = now.Add(dd); mu.Unlock() }
	d, err := Open(ctx, Options{Path: filepath.Join(t.TempDir(), "m.db"), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	if locked, err := d.IsImageLocked(ctx, "img-1"); err != nil || locked {
		t.Fatalf("IsImageLocked before = %v, %v", locked, err)
	}
	if err := d.AcquireImageLock(ctx, "img-1", "unpack-fsm:run-1"); err != nil {
		t.Fatal(err)
	}
	err = d.AcquireImageLock(ctx, "img-1", "unpack-fsm:run-2")
	var held *LockHeldError
	if !errors.Is(err, ErrImageLocked) || !errors.As(err, &held) {
		t.Fatalf("second acquire err = %v, want a LockHeldError", err)
	}
	if held.LockedBy != "unpack-fsm:run-1" || !held.LockedAt.Equal(now) {
		t.Errorf("LockHeldError names %q since %v, want unpack-fsm:run-1 since %v", held.LockedBy, held.LockedAt, now)
	}
	if msg := err.Error(); !strings.Contains(msg, "unpack-fsm:run-1") || !strings.Contains(msg, "2026-01-02T03:04:05Z") {
		t.Errorf("error message %q does not name the holder and since when", msg)
	}
	if locked, _ := d.IsImageLocked(ctx, "img-1"); !locked {
		t.Errorf("IsImageLocked = false while held")
	}

	advance(30 * time.Minute)
	if err := d.AcquireImageLock(ctx, "img-2", "unpack-fsm:run-3"); err != nil {
		t.Fatal(err)
	}
	locks, err := d.ListImageLocks(ctx)
	if err != nil || len(locks) != 2 || locks[0].ImageID != "img-2" || locks[1].ImageID != "img-1" {
		t.Fatalf("ListImageLocks (newest first) = %+v, %v", locks, err)
	}
	advance(31 * time.Minute) // img-1 held 61 min, img-2 31 min
	stale, err := d.ListStaleImageLocks(ctx, DefaultStaleLockAge)
	if err != nil || len(stale) != 1 || stale[0].ImageID != "img-1" {
		t.Fatalf("ListStaleImageLocks(1h) = %+v, %v", stale, err)
	}
	views, err := d.LockViews(ctx, 0)
	if err != nil || len(views) != 2 {
		t.Fatalf("LockViews = %+v, %v", views, err)
	}
	if views[1].ImageID != "img-1" || views[1].Age != 61*time.Minute || !views[1].Stale || views[0].Stale || views[0].Age != 31*time.Minute {
		t.Errorf("LockViews = %+v", views)
	}
	if _, err := d.ListStaleImageLocks(ctx, -time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative age: %v, want ErrInvalidArgument", err)
	}
	cleared, err := d.ClearStaleImageLocks(ctx, DefaultStaleLockAge)
	if err != nil || len(cleared) != 1 || cleared[0].ImageID != "img-1" || cleared[0].LockedBy != "unpack-fsm:run-1" {
		t.Fatalf("ClearStaleImageLocks = %+v, %v", cleared, err)
	}
	if locked, _ := d.IsImageLocked(ctx, "img-1"); locked {
		t.Errorf("stale lock still held after clearing")
	}
	if locked, _ := d.IsImageLocked(ctx, "img-2"); !locked {
		t.Errorf("fresh lock cleared")
	}
	if cleared, err := d.ClearStaleImageLocks(ctx, 10*time.Minute); err != nil || len(cleared) != 1 {
		t.Errorf("ClearStaleImageLocks(10m) = %+v, %v", cleared, err)
	}

	// Release is idempotent and frees the lock for the next holder.
	if err := d.AcquireImageLock(ctx, "img-3", "a"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := d.ReleaseImageLock(ctx, "img-3"); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	if err := d.ReleaseImageLock(ctx, "never-locked"); err != nil {
		t.Errorf("release of an unheld lock: %v", err)
	}
	if err := d.AcquireImageLock(ctx, "img-3", "b"); err != nil {
		t.Errorf("acquire after release: %v", err)
	}
	if err := d.AcquireImageLock(ctx, "", "b"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty image id: %v", err)
	}
}

// TestImageLockRace: 10 goroutines, each with its own connection pool (as
// separate processes would have), race for one image's lock; exactly one
// wins and every loser is told who holds it.
func TestImageLockRace(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	first, err := Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	const n = 10
	dbs := make([]*DB, n)
	for i := range dbs {
		if dbs[i], err = Open(ctx, Options{Path: path}); err != nil {
			t.Fatal(err)
		}
		defer dbs[i].Close()
	}
	for round := 0; round < 5; round++ {
		image := fmt.Sprintf("img-race-%d", round)
		start := make(chan struct{})
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = dbs[i].AcquireImageLock(ctx, image, fmt.Sprintf("worker-%d", i))
			}()
		}
		close(start)
		wg.Wait()
		winners := 0
		winner := ""
		for i, err := range errs {
			if err == nil {
				winners++
				winner = fmt.Sprintf("worker-%d", i)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d winners, want exactly 1 (errors %v)", round, winners, errs)
		}
		for i, err := range errs {
			var held *LockHeldError
			if err != nil && (!errors.As(err, &held) || held.LockedBy != winner) {
				t.Errorf("round %d worker %d: err %v, want LockHeldError naming %s", round, i, err, winner)
			}
		}
		l, err := first.GetImageLock(ctx, image)
		if err != nil || l == nil || l.LockedBy != winner {
			t.Errorf("round %d: lock row %+v, %v; want held by %s", round, l, err, winner)
		}
	}
}

func TestViews(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	// pending: a row still downloading (written as the pipeline would).
	if _, err := d.db.ExecContext(ctx, `INSERT INTO images (image_id, s3_key, local_path, size_bytes, download_status) VALUES ('img-p', 'k/p.tar', '/d/p', 0, 'downloading')`); err != nil {
		t.Fatal(err)
	}
	dl, _ := seedImage(t, d, 1) // downloaded
	up, _ := seedImage(t, d, 2) // unpacked
	seedUnpacked(t, d, up, 2)
	ac, _ := seedImage(t, d, 3) // active, two snapshots of which one active
	seedUnpacked(t, d, ac, 3)
	if err := d.RegisterActivation(ctx, snapRecord(ac, "3", 1)); err != nil {
		t.Fatal(err)
	}
	if err := d.RegisterActivation(ctx, snapRecord(ac, "3", 2)); err != nil {
		t.Fatal(err)
	}
	if err := d.DeactivateSnapshot(ctx, snapRecord(ac, "3", 2).SnapshotID); err != nil {
		t.Fatal(err)
	}
	if err := d.MarkImageFailed(ctx, ImageFailure{ImageID: "img-f", S3Key: "k/f.tar", Reason: "not a tar"}); err != nil {
		t.Fatal(err)
	}
	if err := d.AcquireImageLock(ctx, up, "unpack-fsm"); err != nil {
		t.Fatal(err)
	}
	views, err := d.ImageViews(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"img-p": ImageStatePending, dl: ImageStateDownloaded, up: ImageStateUnpacked, ac: ImageStateActive, "img-f": ImageStateFailed}
	if len(views) != len(want) {
		t.Fatalf("ImageViews returned %d rows, want %d", len(views), len(want))
	}
	for _, v := range views {
		if v.State != want[v.ImageID] {
			t.Errorf("image %s: state %q, want %q", v.ImageID, v.State, want[v.ImageID])
		}
		switch v.ImageID {
		case ac:
			if v.Snapshots != 2 || v.ActiveSnapshots != 1 || v.DeviceName != "thin-3" {
				t.Errorf("active image view = %+v", v)
			}
		case up:
			if v.LockedBy != "unpack-fsm" {
				t.Errorf("unpacked image view lock = %q", v.LockedBy)
			}
		case "img-f":
			if v.FailureReason != "not a tar" {
				t.Errorf("failed image reason = %q", v.FailureReason)
			}
		}
	}
	uv, err := d.UnpackedViews(ctx)
	if err != nil || len(uv) != 2 {
		t.Fatalf("UnpackedViews = %+v, %v", uv, err)
	}
	for _, v := range uv {
		wantRefs, wantActive := 0, 0
		if v.ImageID == ac {
			wantRefs, wantActive = 2, 1
		}
		if v.RefCount != wantRefs || v.ActiveRefs != wantActive {
			t.Errorf("device %s: refs %d/%d active, want %d/%d", v.DeviceID, v.RefCount, v.ActiveRefs, wantRefs, wantActive)
		}
	}
	sv, err := d.SnapshotViews(ctx)
	if err != nil || len(sv) != 2 || sv[0].S3Key != "images/family/3.tar" || sv[0].OriginDeviceName != "thin-3" || !sv[0].Active || sv[1].Active || sv[1].DeactivatedAt == nil {
		t.Errorf("SnapshotViews = %+v, %v", sv, err)
	}
}
