package pipeline

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// TestRepullAnsweredFromTheRecords: a pull of an image already pulled and
// unchanged in S3 is answered from the database after one S3 listing and a
// look at its activation's device node: no FSM run, no GET, no snapshotter
// (so no device-mapper) call.
func TestRepullAnsweredFromTheRecords(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "img/1.tar", layerTar(t, "img", 500))
	first := e.mustPull("img/", "img")
	var probed []string
	e.p.deviceLive = func(path string) error { probed = append(probed, path); return e.sn.deviceLive(path) }
	e.srv.Faults.Reset()
	checkNoWork := e.checkNoWorkSince("re-pull")

	res, err := e.p.Pull(context.Background(), api.PullRequest{Bucket: e.srv.Bucket, Key: "img/", Ref: "img"}, nil)
	if err != nil {
		t.Fatalf("re-pull: %v", err)
	}
	if res.Downloaded != 0 || res.Unpacked != 0 || res.TopChainID != first.TopChainID || res.Snapshot.SnapshotName != first.Snapshot.SnapshotName ||
		res.Snapshot.DevicePath != first.Snapshot.DevicePath || !res.Snapshot.Active || len(res.Layers) != 1 || res.Layers[0].DiffID != first.Layers[0].DiffID {
		t.Errorf("re-pull result %+v, first pull %+v", res, first)
	}
	if n, get := e.srv.TotalRequests(), e.srv.Requests("GET", "img/1.tar"); n != 1 || get != 0 {
		t.Errorf("re-pull made %d S3 requests (%d GETs of the layer), want one listing", n, get)
	}
	checkNoWork()
	if len(probed) != 1 || probed[0] != first.Snapshot.DevicePath {
		t.Errorf("device nodes looked at: %v, want the activation's %s", probed, first.Snapshot.DevicePath)
	}
}

// TestRepullFallsBack: anything missing sends the pull down the pipelines,
// which heal it; the records answer again afterwards.
func TestRepullFallsBack(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		breakIt func(t *testing.T, e *env, first *api.PullResult)
	}{
		{"activation unmapped", func(t *testing.T, e *env, first *api.PullResult) { e.sn.unmap(t, first.Snapshot.SnapshotName) }},
		{"activation removed", func(t *testing.T, e *env, first *api.PullResult) {
			if err := e.sn.Remove(ctx, first.Snapshot.SnapshotName); err != nil {
				t.Fatal(err)
			}
		}},
		{"activation's device deleted", func(t *testing.T, e *env, first *api.PullResult) { e.sn.deleteDevice(t, first.Snapshot.SnapshotName) }},
		{"chain snapshot removed", func(t *testing.T, e *env, first *api.PullResult) {
			for _, k := range []string{first.Snapshot.SnapshotName, first.TopChainID} {
				if err := e.sn.Remove(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.sn.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newPullEnv(t, nil)
			e.srv.Put(t, "img/1.tar", layerTar(t, "img", 500))
			first := e.mustPull("img/", "img")
			source, imageID := imageSource(e.srv.Bucket, "img/")
			if res, why := e.p.repull(ctx, e.p.recordsNow(ctx, imageID), source, imageID, "img", nil, false, nil); res == nil {
				t.Fatalf("intact records: no fast answer (%s)", why)
			}
			c.breakIt(t, e, first)
			if res, _ := e.p.repull(ctx, e.p.recordsNow(ctx, imageID), source, imageID, "img", nil, false, nil); res != nil {
				t.Fatalf("answered from the records after %s: %+v", c.name, res)
			}
			healed := e.mustPull("img/", "img")
			if healed.TopChainID != first.TopChainID || !healed.Snapshot.Active {
				t.Errorf("pull after %s: %+v", c.name, healed)
			}
			if got := e.sn.readFile(t, healed.Snapshot.SnapshotName, "etc/marker"); got != "img" {
				t.Errorf("after %s the activation shows %q", c.name, got)
			}
			if res, why := e.p.repull(ctx, e.p.recordsNow(ctx, imageID), source, imageID, "img", nil, false, nil); res == nil {
				t.Errorf("after the healing pull the records do not answer: %s", why)
			}
		})
	}

	t.Run("no record", func(t *testing.T) {
		e := newPullEnv(t, nil)
		// No record of this source: Pull lists the prefix in S3 (where
		// nothing is) and fails saying so.
		_, err := e.p.Pull(ctx, api.PullRequest{Bucket: e.srv.Bucket, Key: "img2/", Ref: "img"}, nil)
		if err == nil || !strings.Contains(err.Error(), "img2/") {
			t.Fatalf("pull of an empty prefix: %v", err)
		}
		if e.srv.TotalRequests() == 0 {
			t.Errorf("a pull with no record made no S3 request")
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

// TestRepullWithoutTarballs: once an image is unpacked its tarballs are a
// cache: with them deleted, a pull that runs the pipelines again
// (--refresh) downloads nothing and needs no file, because its layers'
// chains stand as recorded.
func TestRepullWithoutTarballs(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "img/1.tar", layerTar(t, "img", 500))
	e.srv.Put(t, "img/2.tar", layerTar(t, "img2", 300))
	first := e.mustPull("img/", "img")
	files, err := RecordsOf(e.db).ListLayerFiles(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("%d layer files recorded, want 2", len(files))
	}
	for _, f := range files {
		if err := os.Remove(f.Path); err != nil {
			t.Fatal(err)
		}
	}
	e.srv.Faults.Reset()
	res, err := e.p.Pull(context.Background(), api.PullRequest{Bucket: e.srv.Bucket, Key: "img/", Ref: "img", Refresh: true}, nil)
	if err != nil {
		t.Fatalf("refresh pull without the tarballs: %v", err)
	}
	if res.Downloaded != 0 || res.TopChainID != first.TopChainID {
		t.Errorf("refresh pull: %d layers downloaded, top chain %s; want 0 and %s", res.Downloaded, res.TopChainID, first.TopChainID)
	}
	if get := e.srv.Requests("GET", "img/1.tar") + e.srv.Requests("GET", "img/2.tar"); get != 0 {
		t.Errorf("refresh pull fetched the layers %d times, want none", get)
	}
}
