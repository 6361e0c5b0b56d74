//go:build dm

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
)

// TestKillAtEveryStep SIGKILLs the daemon at the start of every transition
// of the three machines, restarts it and pulls nothing more: the resumed
// runs finish by themselves, and then the pool's devices are exactly the
// recorded ones, with no extraction device, temp file or live run left.
// Then two kills during one extraction use up its attempts: the run fails
// and its cleanup removes the half-made device.
func TestKillAtEveryStep(t *testing.T) {
	e := newPullEnv(t)
	// A step whose point is in the extraction while downloading: the
	// bottom layer's extraction, asked for before its download starts,
	// follows the transfer from its first byte and so names the layer:
	// the download's validate waits for it, and the kill lands there.
	steps := []struct{ fsm, transition, point string }{
		{api.FSMDownload, "check-exists", "check-exists:started"},
		{api.FSMDownload, "download", "download:started"},
		{api.FSMDownload, "validate", "validate:started"},
		{api.FSMDownload, "store-metadata", "store-metadata:started"},
		{api.FSMUnpack, "check-unpacked", "check-unpacked:started"},
		{api.FSMUnpack, "create-device", "create-device:started"},
		{api.FSMUnpack, "extract-layers", "extract:started"},
		{api.FSMDownload, "validate", "stream-extract:started"},
		{api.FSMUnpack, "verify-layout", "verify-layout:started"},
		{api.FSMUnpack, "update-db", "update-db:started"},
		{api.FSMActivate, "check-snapshot", "check-snapshot:started"},
		{api.FSMActivate, "create-snapshot", "create-snapshot:started"},
		{api.FSMActivate, "register", "register:started"},
	}
	// paused restarts the daemon with every run stopping at point.
	paused := func(point string) {
		e.d.kill()
		os.Setenv(pipeline.FaultPauseEnv, point)
		e.restart()
		os.Unsetenv(pipeline.FaultPauseEnv)
	}
	// killAt pulls prefix with every run stopping at point, kills the
	// daemon once a run of fsmName is in transition (and extra holds),
	// restarts it with no fault and no pull (the runs resume alone), then
	// pulls prefix again: nothing half-made is left either time, and the
	// image shows files.
	killAt := func(t *testing.T, prefix, fsmName, transition, point string, extra func() bool, files ...string) {
		paused(point)
		errc := make(chan error, 1)
		go func() { _, err := e.pull(prefix, ""); errc <- err }()
		e.waitRun(fsmName, transition, extra)
		e.d.kill()
		<-errc
		e.restart()
		e.waitIdle()
		e.checkClean()
		res, err := e.pull(prefix, "")
		if err != nil {
			t.Fatalf("pull after the kill at %s: %v", point, err)
		}
		e.checkActive(res, files...)
		e.checkClean()
	}
	for i, s := range steps {
		t.Run(s.fsm+"/"+s.transition+"/"+s.point, func(t *testing.T) {
			prefix := fmt.Sprintf("k%02d/", i)
			e.srv.Put(t, prefix+"1.tar", genLayer(t, uint64(100+2*i), "k1", 8, 16<<10, true))
			e.srv.Put(t, prefix+"2.tar", genLayer(t, uint64(101+2*i), "k2", 8, 16<<10, false))
			killAt(t, prefix, s.fsm, s.transition, s.point, nil, "k1/f00007", "k2/f00007")
		})
	}

	// A gzip layer that is in before the layer below it is unpacked keeps
	// its tar stream in a spool file: killed while it is written, or while
	// the unpack reads it, the next daemon removes it before any run
	// starts, and the resumed runs decompress the layer file.
	for i, point := range []struct{ fsm, transition, point string }{
		{api.FSMDownload, "download", "download:spooling"},
		{api.FSMUnpack, "extract-layers", "extract:spooled"},
	} {
		t.Run("spool/"+point.point, func(t *testing.T) {
			prefix := fmt.Sprintf("sp%d/", i)
			e.srv.Put(t, prefix+"1.tar", genLayer(t, uint64(300+2*i), "s1", 8, 16<<10, true))
			e.srv.Put(t, prefix+"2.tar.gz", s3test.Gzip(t, genLayer(t, uint64(301+2*i), "s2", 8, 16<<10, false)))
			// The bottom layer arrives last, so the top one waits for it.
			e.srv.Faults.Delay(1, prefix+"1.tar", 2*time.Second)
			spooled := func() bool {
				m, _ := filepath.Glob(filepath.Join(e.cfg.Pipeline.DownloadDir, "tmp", "*.spool"))
				return len(m) == 1
			}
			killAt(t, prefix, point.fsm, point.transition, point.point, spooled, "s1/f00007", "s2/f00007")
		})
	}

	t.Run("two kills during one extraction", func(t *testing.T) {
		e.srv.Put(t, "x/1.tar", genLayer(t, 200, "x1", 8, 16<<10, true))
		paused("extract:started")
		errc := make(chan error, 1)
		go func() { _, err := e.pull("x/", ""); errc <- err }()
		e.waitRun(api.FSMUnpack, "extract-layers", nil)
		e.d.kill()
		<-errc
		// The resumed run reaches extraction again (its second attempt) and
		// is killed there again.
		os.Setenv(pipeline.FaultPauseEnv, "extract:started")
		e.restart()
		os.Unsetenv(pipeline.FaultPauseEnv)
		secondAttempt := func() bool {
			runs, err := fsm.NewSQLiteStore(e.db()).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMUnpack, States: []fsm.State{fsm.StateRunning}})
			return err == nil && len(runs) == 1 && runs[0].Attempts >= 2
		}
		e.waitRun(api.FSMUnpack, "extract-layers", secondAttempt)
		e.d.kill()
		e.restart()
		e.waitIdle()
		runs, err := fsm.NewSQLiteStore(e.db()).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMUnpack, States: []fsm.State{fsm.StateFailed}})
		if err != nil || len(runs) != 1 {
			t.Fatalf("failed unpack runs after two kills in one extraction: %d, %v; want the one whose attempts were used up", len(runs), err)
		}
		t.Logf("the run ended: %s", runs[0].LastError)
		e.checkClean() // no extraction device: the failed run's cleanup removed it
		res, err := e.pull("x/", "")
		if err != nil {
			t.Fatalf("pull after two kills in one extraction: %v", err)
		}
		e.checkActive(res, "x1/f00007")
		e.checkClean()
	})
}

// layerWith is a base layer whose etc/flyio-version holds version, padded
// with a file of pad zero bytes (so that two versions can have one size).
func layerWith(t *testing.T, version string, pad int) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"etc/", "usr/", "var/", "pad/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: time.Unix(1700000000, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		name string
		body []byte
	}{{"etc/flyio-version", []byte(version)}, {"pad/data", make([]byte, pad)}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(1700000000, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readActive returns the content of path in the image's activation.
func (e *pullEnv) readActive(res *api.PullResult, path string) string {
	e.t.Helper()
	dir := e.t.TempDir()
	if out, err := exec.Command("mount", "-o", "ro,noload", res.Snapshot.DevicePath, dir).CombinedOutput(); err != nil {
		e.t.Fatalf("mount %s: %v: %s", res.Snapshot.DevicePath, err, out)
	}
	defer exec.Command("umount", dir).Run()
	b, err := os.ReadFile(filepath.Join(dir, path))
	if err != nil {
		e.t.Fatalf("read %s in %s: %v", path, res.Ref, err)
	}
	return string(b)
}

// TestPullsOverTime: an object overwritten in S3 (same size, then another
// size) is picked up by the next pull; one key is a layer of two chains; a
// chain whose device is lost under a container is rebuilt without touching
// the container's snapshot.
func TestPullsOverTime(t *testing.T) {
	e := newPullEnv(t)

	t.Run("overwritten object", func(t *testing.T) {
		e.srv.Put(t, "ow/1.tar", layerWith(t, "v1", 4096))
		first, err := e.pull("ow/", "ow")
		if err != nil {
			t.Fatal(err)
		}
		if got := e.readActive(first, "etc/flyio-version"); got != "v1" {
			t.Fatalf("first pull: version %q, want v1", got)
		}
		for _, c := range []struct {
			version string
			pad     int
		}{{"v2", 4096}, {"v3", 8192}} {
			e.srv.Put(t, "ow/1.tar", layerWith(t, c.version, c.pad))
			res, err := e.pull("ow/", "ow")
			if err != nil {
				t.Fatalf("pull after the object was overwritten with %s: %v", c.version, err)
			}
			if res.Downloaded != 1 || res.TopChainID == first.TopChainID {
				t.Errorf("%s: downloaded %d, top chain %s (first %s); want the new object downloaded into a new chain",
					c.version, res.Downloaded, res.TopChainID, first.TopChainID)
			}
			if got := e.readActive(res, "etc/flyio-version"); got != c.version {
				t.Errorf("after overwriting with %s (%d bytes of padding): the image shows version %q", c.version, c.pad, got)
			}
		}
		e.checkClean()
	})

	t.Run("one key in two chains", func(t *testing.T) {
		e.srv.Put(t, "two/1.tar", genLayer(t, 31, "t1", 4, 4096, true))
		e.srv.Put(t, "two/2.tar", genLayer(t, 32, "t2", 4, 4096, true))
		alone, err := e.pull("two/2.tar", "two-alone")
		if err != nil {
			t.Fatalf("pull of two/2.tar alone: %v", err)
		}
		both, err := e.pull("two/", "two-both")
		if err != nil {
			t.Fatalf("pull of two/ (two/2.tar as layer 2): %v", err)
		}
		if alone.TopChainID == both.TopChainID {
			t.Errorf("two/2.tar alone and on two/1.tar have the same chain %s", alone.TopChainID)
		}
		if e.srv.Requests("GET", "two/2.tar") != 1 {
			t.Errorf("two/2.tar downloaded %d times, want 1", e.srv.Requests("GET", "two/2.tar"))
		}
		e.checkActive(alone, "t2/f00003")
		e.checkActive(both, "t1/f00003", "t2/f00003")
		e.checkClean()
	})

	t.Run("heal under a container", func(t *testing.T) {
		e.srv.Put(t, "h/1.tar", genLayer(t, 41, "h1", 4, 4096, true))
		e.srv.Put(t, "h/2.tar", genLayer(t, 42, "h2", 4, 4096, false))
		res, err := e.pull("h/", "h")
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		client := dmtest.DialProxy(t, e.cfg.Daemon.Socket)
		mounts, err := client.Prepare(ctx, "container-h", res.TopChainID)
		if err != nil {
			t.Fatalf("a container's snapshot on the image: %v", err)
		}
		dir := t.TempDir()
		if err := mount.All(mounts, dir); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "data.txt"), []byte("the container's data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := mount.UnmountAll(dir, 0); err != nil {
			t.Fatal(err)
		}
		lost := e.deviceOfChain(res.TopChainID)
		if err := e.pool.Delete(ctx, lost); err != nil {
			t.Fatalf("delete the top chain's thin %d behind the daemon's back: %v", lost, err)
		}
		healed, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "h/", Ref: "h", Refresh: true})
		if err != nil {
			t.Fatalf("pull --refresh with a container on the lost chain: %v", err)
		}
		if healed.Unpacked != 1 || e.deviceOfChain(res.TopChainID) == lost {
			t.Errorf("heal: unpacked %d, chain device %d (lost %d); want 1 and a new device", healed.Unpacked, e.deviceOfChain(res.TopChainID), lost)
		}
		mounts, err = client.Mounts(ctx, "container-h")
		if err != nil {
			t.Fatalf("the container's snapshot after the heal: %v", err)
		}
		if err := mount.All(mounts, dir); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "data.txt"))
		mount.UnmountAll(dir, 0)
		if err != nil || string(b) != "the container's data\n" {
			t.Errorf("the container's data after the heal: %q, %v", b, err)
		}
		// A new container on the rebuilt chain sees the image's files.
		mounts, err = client.View(ctx, "container-h2", res.TopChainID)
		if err != nil {
			t.Fatalf("a new container on the rebuilt chain: %v", err)
		}
		if err := mount.All(mounts, dir); err != nil {
			t.Fatal(err)
		}
		_, err = os.Stat(filepath.Join(dir, "h2", "f00003"))
		mount.UnmountAll(dir, 0)
		if err != nil {
			t.Errorf("the rebuilt chain lacks the image's files: %v", err)
		}
		for _, k := range []string{"container-h", "container-h2"} {
			if err := client.Remove(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		e.checkClean()
	})
}
