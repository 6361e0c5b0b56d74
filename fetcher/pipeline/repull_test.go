package pipeline

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// noSnapshots is a snapshotter any call of which panics: the re-pull's fast
// path must not touch the snapshotter (nor, behind it, device-mapper).
type noSnapshots struct{ Snapshots }

// pulledFixture records what a completed pull of s3://BUCKET/img/ (one
// layer) leaves in the database and on disk, without running the
// machines: the blob file, the layer's images row and chain, the committed
// chain snapshot, the activation (snapshot record and seed snapshots row)
// and the pulled-image record "img".
type pulledFixture struct {
	blob, chain, activation string
}

func recordPulled(t *testing.T, e *env) pulledFixture {
	t.Helper()
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const diff, chain = "sha256:d1", "sha256:c1"
	blob := filepath.Join(e.dir, "images", "blobs", "sha256", "d1")
	must(os.MkdirAll(filepath.Dir(blob), 0o755))
	must(os.WriteFile(blob, []byte("tarball bytes"), 0o600))
	fi, err := os.Stat(blob)
	must(err)
	size, mtime, ino := fileStamp(fi)
	must(e.db.StoreBlob(ctx, metadata.Blob{Digest: diff, Path: blob, SizeBytes: size, StatSize: size, StatMtimeNs: mtime, StatIno: ino}, ""))
	layerID := LayerImageID(e.srv.Bucket, "img/1.tar")
	must(e.db.StoreImageMetadata(ctx, layerID, S3URL(e.srv.Bucket, "img/1.tar"), blob, diff, size))
	source, imageID := imageSource(e.srv.Bucket, "img/")
	activation := SnapshotName(imageID)
	must(e.db.WithTx(ctx, func(tx *sql.Tx) error {
		q := metadata.SnapshotterTx(tx)
		for _, d := range []metadata.ThinDevice{
			{ID: 101, Name: "pool-snap-101", Role: metadata.ThinRoleSnapshot, State: metadata.ThinStateInactive, SizeBytes: 1 << 30, FSType: "ext4", CreatedNs: 1, UpdatedNs: 1},
			{ID: 201, Name: "pool-snap-201", Role: metadata.ThinRoleSnapshot, State: metadata.ThinStateActive, SizeBytes: 1 << 30, FSType: "ext4", CreatedNs: 1, UpdatedNs: 1},
		} {
			if err := q.InsertThinDevice(ctx, d); err != nil {
				return err
			}
		}
		parent, err := q.InsertSnapshot(ctx, metadata.CDSnapshot{Key: chain, Kind: metadata.SnapKindCommitted, DeviceID: 101, CreatedNs: 1, UpdatedNs: 1})
		if err != nil {
			return err
		}
		_, err = q.InsertSnapshot(ctx, metadata.CDSnapshot{Key: activation, Kind: metadata.SnapKindActive, ParentID: parent, DeviceID: 201, CreatedNs: 1, UpdatedNs: 1})
		return err
	}))
	must(e.db.StoreUnpackedChain(ctx, metadata.Chain{ChainID: chain, DiffID: diff, ImageID: layerID},
		metadata.UnpackedImageRecord{ImageID: layerID, DeviceID: "101", DeviceName: "pool-snap-101", DevicePath: "/dev/mapper/pool-snap-101"}))
	must(e.db.StoreImageMetadata(ctx, imageID, source, "", chain, size))
	must(e.db.RegisterActivation(ctx, metadata.SnapshotRecord{ImageID: imageID, SnapshotID: "101-" + activation, SnapshotName: activation,
		DevicePath: "/dev/mapper/pool-snap-201", OriginDeviceID: "101"}))
	layers, err := json.Marshal([]Layer{{Key: "img/1.tar", Size: size, DiffID: diff, ChainID: chain}})
	must(err)
	must(e.db.StorePulledImage(ctx, metadata.PulledImage{Ref: "img", Source: source, ImageID: imageID, Layers: string(layers),
		TopChainID: chain, SnapshotKey: activation}))
	return pulledFixture{blob: blob, chain: chain, activation: activation}
}

func (e *env) runCount() int {
	e.t.Helper()
	runs, err := e.db.ListRuns(context.Background(), metadata.RunFilter{})
	if err != nil {
		e.t.Fatal(err)
	}
	return len(runs)
}

// TestRepullAnsweredFromTheRecords: a pull of an image already pulled is
// answered from the database, a stat of its tarball and of its
// activation's device node: no FSM run, no S3 request, no snapshotter (so
// no device-mapper) call.
func TestRepullAnsweredFromTheRecords(t *testing.T) {
	e := newEnv(t, time.Minute)
	e.p.opts.Snapshots = noSnapshots{}
	fx := recordPulled(t, e)
	var probed []string
	e.p.deviceLive = func(path string) error { probed = append(probed, path); return nil }

	res, err := e.p.Pull(context.Background(), PullRequest{Bucket: e.srv.Bucket, Key: "img/", Ref: "img"}, nil)
	if err != nil {
		t.Fatalf("re-pull: %v", err)
	}
	if res.Downloaded != 0 || res.Unpacked != 0 || res.TopChainID != fx.chain || res.Snapshot.SnapshotName != fx.activation ||
		res.Snapshot.DevicePath != "/dev/mapper/pool-snap-201" || !res.Snapshot.Active || len(res.Layers) != 1 {
		t.Errorf("re-pull result %+v", res)
	}
	if n := e.srv.TotalRequests(); n != 0 {
		t.Errorf("re-pull made %d S3 requests, want 0", n)
	}
	if n := e.runCount(); n != 0 {
		t.Errorf("re-pull started %d FSM runs, want 0", n)
	}
	if len(probed) != 1 || probed[0] != "/dev/mapper/pool-snap-201" {
		t.Errorf("device nodes looked at: %v, want the activation's", probed)
	}
}

// TestRepullFallsBack: anything missing or changed sends the pull down the
// pipelines (which heal it); a missing record makes Pull ask S3 again.
func TestRepullFallsBack(t *testing.T) {
	for _, c := range []struct {
		name    string
		breakIt func(t *testing.T, e *env, fx pulledFixture)
	}{
		{"device node gone", func(t *testing.T, e *env, fx pulledFixture) {
			e.p.deviceLive = func(path string) error { return errors.New("gone") }
		}},
		{"tarball rewritten", func(t *testing.T, e *env, fx pulledFixture) {
			os.Remove(fx.blob)
			if err := os.WriteFile(fx.blob, []byte("other bytes!!"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"tarball removed", func(t *testing.T, e *env, fx pulledFixture) { os.Remove(fx.blob) }},
		{"activation row removed", func(t *testing.T, e *env, fx pulledFixture) {
			if err := e.db.DeleteSnapshotByName(context.Background(), fx.activation); err != nil {
				t.Fatal(err)
			}
		}},
		{"chain snapshot removed", func(t *testing.T, e *env, fx pulledFixture) {
			ctx := context.Background()
			err := e.db.WithTx(ctx, func(tx *sql.Tx) error {
				q := metadata.SnapshotterTx(tx)
				for _, k := range []string{fx.activation, fx.chain} {
					r, ok, err := q.Snapshot(ctx, "", k)
					if err != nil || !ok {
						return errors.Join(err, errors.New("no snapshot "+k))
					}
					if err := q.DeleteSnapshot(ctx, r.ID); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, time.Minute)
			fx := recordPulled(t, e)
			e.p.deviceLive = func(string) error { return nil }
			source, imageID := imageSource(e.srv.Bucket, "img/")
			if res := e.p.repull(context.Background(), source, imageID, "img"); res == nil {
				t.Fatal("intact records: no fast answer")
			}
			c.breakIt(t, e, fx)
			if res := e.p.repull(context.Background(), source, imageID, "img"); res != nil {
				t.Fatalf("answered from the records after %s: %+v", c.name, res)
			}
		})
	}

	t.Run("no record", func(t *testing.T) {
		e := newEnv(t, time.Minute)
		e.p.opts.Snapshots = noSnapshots{}
		recordPulled(t, e)
		e.p.deviceLive = func(string) error { return nil }
		// No record of this source: Pull lists the prefix in S3 (where
		// nothing is).
		_, err := e.p.Pull(context.Background(), PullRequest{Bucket: e.srv.Bucket, Key: "img2/", Ref: "img"}, nil)
		if err == nil {
			t.Fatal("pull of an empty prefix succeeded")
		}
		if e.srv.TotalRequests() == 0 {
			t.Errorf("a pull with no record made no S3 request (err %v): it did not run the pipelines", err)
		}
	})
}

// TestMappedDeviceLive: the activation's node must be a block device that
// sysfs names as that device-mapper device.
func TestMappedDeviceLive(t *testing.T) {
	dir := t.TempDir()
	if err := mappedDeviceLive(filepath.Join(dir, "gone")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing node: %v", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := mappedDeviceLive(file); err == nil || !strings.Contains(err.Error(), "not a block device") {
		t.Errorf("regular file: %v", err)
	}
	// /dev/loop0 or any block device that is not device-mapper's.
	for _, d := range []string{"/dev/loop0", "/dev/sda", "/dev/vda"} {
		if fi, err := os.Stat(d); err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
			if err := mappedDeviceLive(d); err == nil {
				t.Errorf("%s counted as a live device-mapper device named %s", d, filepath.Base(d))
			}
			break
		}
	}
}
