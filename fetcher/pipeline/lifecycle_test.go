package pipeline

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// unpackRun is the one unpack run of the environment.
// waitNoLiveRun waits until no run is live, for at most 30 s after what
// happened (the message's words).
func (e *env) waitNoLiveRun(after string) {
	e.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := RecordsOf(e.db).LiveRuns(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d runs still live 30 s after %s", n, after)
		}
	}
}

func (e *env) unpackRun() fsm.RunRecord {
	e.t.Helper()
	runs, err := fsm.NewSQLiteStore(e.db).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMUnpack})
	if err != nil || len(runs) != 1 {
		e.t.Fatalf("unpack runs: %d, %v; want one", len(runs), err)
	}
	return runs[0]
}

func waitReached(t *testing.T, reached <-chan string, want string) {
	t.Helper()
	select {
	case got := <-reached:
		if got != want {
			t.Fatalf("extraction reached by %q, want %q", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("extraction never reached by %q", want)
	}
}

// TestUnpackKilledTwiceCleansUp: a daemon killed during an extraction, and
// killed again during the resumed attempt, leaves a run whose attempts are
// used up; the next start ends it failed and its cleanup removes the
// extraction snapshot and its mount point. A later pull works.
func TestUnpackKilledTwiceCleansUp(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "k/1.tar", layerTar(t, "killed", 1000))
	// A killed daemon's runs stop where they are: the hook never returns
	// while the test runs (released at its end, before the cleanups close
	// the daemons).
	release := make(chan struct{})
	defer close(release)
	reached := make(chan string, 4)
	stopAt := func(name string) map[string]func() {
		return map[string]func(){"extract:started": func() { reached <- name; <-release }}
	}
	e.p.hooks = stopAt("first")
	go e.pull("k/", "k") //nolint:errcheck // the first daemon never answers
	waitReached(t, reached, "first")
	// The kill comes once the pull has started all its runs (a killed
	// daemon starts nothing more).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		runs, err := fsm.NewSQLiteStore(e.db).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMActivate})
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pull never started its activation run")
		}
	}
	// The layer's extraction snapshot: the one made while it downloaded,
	// which the unpack run adopted as its device.
	if x := e.sn.extractions(t); len(x) != 1 || !strings.HasPrefix(x[0], streamPrefix) {
		t.Fatalf("during the extraction: extraction snapshots %v, want the one made while downloading", x)
	}

	e.reopen(stopAt("second"))
	waitReached(t, reached, "second")
	if r := e.unpackRun(); r.Transition != "extract-layers" || r.Attempts != 2 {
		t.Fatalf("after the second kill the unpack run is at %q attempt %d, want extract-layers attempt 2", r.Transition, r.Attempts)
	}

	p3 := e.reopen(nil)
	// The unpack run ends, then the activation run waiting on it.
	e.waitNoLiveRun("the third start")
	r := e.unpackRun()
	if r.State != fsm.StateFailed || !strings.Contains(r.LastError, "no attempt left: 2 counted of 2 allowed") {
		t.Errorf("unpack run %s: %q; want failed with both attempts counted", r.State, r.LastError)
	}
	e.p = p3
	e.assertNoExtraction()

	res, err := e.pull("k/", "k")
	if err != nil || res.Unpacked != 1 {
		t.Fatalf("pull after the failed run: %+v, %v", res, err)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "killed" {
		t.Errorf("activation shows %q", got)
	}
	e.assertNoExtraction()
}

// TestActivateReplacementKilled: a daemon killed while an activate run
// replaces an image's activation with one on a new top chain (after the
// new top was checked through the verification view, and after the old
// activation was removed) resumes the run at the next start, which ends
// with the new activation, verified, and the image recorded on it. A run
// killed there until its attempts are used up ends failed, and its
// cleanup leaves the old activation in place. No verification view is
// left either way.
func TestActivateReplacementKilled(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		at    string
		kills int
	}{
		{"create-snapshot:verified", 1},
		{"create-snapshot:replaced", 1},
		// create-snapshot has 3 attempts.
		{"create-snapshot:verified", 3},
	} {
		t.Run(fmt.Sprintf("%s killed %d", tc.at, tc.kills), func(t *testing.T) {
			e := newPullEnv(t, nil)
			e.srv.Put(t, "r/1.tar", layerTar(t, "old", 500))
			first := e.mustPull("r/", "r")
			next := layerTar(t, "new", 500)
			e.srv.Put(t, "r/1.tar", next)
			release := make(chan struct{})
			defer close(release)
			reached := make(chan string, 4)
			stopAt := func(name string) map[string]func() {
				return map[string]func(){tc.at: func() { reached <- name; <-release }}
			}
			e.p.hooks = stopAt("kill 1")
			go e.pull("r/", "r") //nolint:errcheck // the killed daemon never answers
			waitReached(t, reached, "kill 1")
			if ok, err := e.sn.Exists(ctx, verifyKey(first.ImageID)); err != nil || !ok {
				t.Fatalf("at %s the verification view exists=%v (%v)", tc.at, ok, err)
			}
			for k := 2; k <= tc.kills; k++ {
				e.reopen(stopAt(fmt.Sprintf("kill %d", k)))
				waitReached(t, reached, fmt.Sprintf("kill %d", k))
			}
			e.p = e.reopen(nil)
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				n, err := RecordsOf(e.db).LiveRuns(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d runs still live 30 s after the restart", n)
				}
			}
			if ok, err := e.sn.Exists(ctx, verifyKey(first.ImageID)); err != nil || ok {
				t.Errorf("verification view left after the restart: %v, %v", ok, err)
			}
			if m, _ := filepath.Glob(filepath.Join(e.p.opts.MountDir, "*")); len(m) != 0 {
				t.Errorf("mount points left: %v", m)
			}
			act := first.Snapshot.SnapshotName
			info, err := e.sn.Stat(ctx, act)
			if err != nil {
				t.Fatalf("no activation after the restart: %v", err)
			}
			layers, err := RecordsOf(e.db).imageLayers(ctx, first.ImageID)
			if err != nil || len(layers) != 1 {
				t.Fatalf("image layers %+v, %v", layers, err)
			}
			want, shows := sha(next), "new"
			if tc.kills == 3 {
				want, shows = first.TopChainID, "old"
			}
			if info.Parent != want || info.Labels[LabelLayoutVerified] != want || layers[0].ChainID != want {
				t.Errorf("activation on %s labelled %v, image recorded on %s; want all %s", info.Parent, info.Labels, layers[0].ChainID, want)
			}
			if got := e.sn.readFile(t, act, "etc/marker"); got != shows {
				t.Errorf("activation shows %q, want %q", got, shows)
			}
			res := e.mustPull("r/", "r")
			if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "new" {
				t.Errorf("pull after the restart: activation shows %q, want new", got)
			}
		})
	}
}

// TestResumeSweeps: start-up removes the extraction snapshot, the
// verification view and the download temp file that runs no longer live
// left behind.
func TestResumeSweeps(t *testing.T) {
	e := newPullEnv(t, nil)
	ctx := context.Background()
	stale := extractKey("sha256:" + strings.Repeat("ab", 32))
	if _, err := e.sn.Prepare(ctx, stale, "", snapshots.WithLabels(map[string]string{LabelPrivate: privateExtract})); err != nil {
		t.Fatal(err)
	}
	view := verifyKey("s3-" + strings.Repeat("cd", 12))
	if _, err := e.sn.View(ctx, view, "", snapshots.WithLabels(map[string]string{LabelPrivate: privateVerify})); err != nil {
		t.Fatal(err)
	}
	_, _, id, err := e.sn.DeviceOf(ctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(e.p.opts.tmpDir(), "obj-0123456789abcdef01234567.partial")
	if err := os.WriteFile(tmp, []byte("half a layer"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.p = e.reopen(nil)
	if ok, _ := e.sn.Exists(ctx, stale); ok {
		t.Errorf("extraction snapshot %s of no live run kept", stale)
	}
	if ok, _ := e.sn.ThinExists(ctx, id); ok {
		t.Errorf("its device %d is still in the pool", id)
	}
	if ok, _ := e.sn.Exists(ctx, view); ok {
		t.Errorf("verification view %s of no live run kept", view)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("temp file of no live run kept (stat: %v)", err)
	}
}

// TestPullHealsLostChainKeepingContainers: the top chain's device deleted
// from the pool behind our back, with a container's snapshot and the
// image's activation on it: a refresh pull extracts the layer again and
// puts the new device in place of the lost one (Recommit); the container's
// snapshot, its data, the activation and the lower chain are untouched.
func TestPullHealsLostChainKeepingContainers(t *testing.T) {
	e := newPullEnv(t, nil)
	ctx := context.Background()
	e.srv.Put(t, "h/1.tar", layerTar(t, "base", 1000, tarFile{name: "etc/base-only", body: []byte("from layer 1")}))
	e.srv.Put(t, "h/2.tar", layerTar(t, "top", 1000))
	r := e.mustPull("h/", "h")
	bottom, top := r.Layers[0].ChainID, r.TopChainID
	if _, err := e.sn.Prepare(ctx, "container-1", top); err != nil {
		t.Fatal(err)
	}
	e.sn.writeFile(t, "container-1", "etc/container-data", "mine")
	before := e.sn.list(t)
	e.sn.deleteDevice(t, top)

	res, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "h/", Ref: "h", Refresh: true})
	if err != nil {
		t.Fatalf("refresh pull with the top chain's device gone: %v", err)
	}
	if res.Unpacked != 1 || res.Downloaded != 0 || res.TopChainID != top {
		t.Errorf("heal: %+v; want the top chain unpacked again, nothing downloaded", res)
	}
	e.sn.mu.Lock()
	recommits := e.sn.calls["Recommit"]
	e.sn.mu.Unlock()
	if recommits != 1 {
		t.Errorf("Recommit called %d times, want once", recommits)
	}
	after := e.sn.list(t)
	for _, k := range []string{"container-1", r.Snapshot.SnapshotName, bottom} {
		if a, ok := after[k]; !ok || a.ID != before[k].ID || a.DeviceID != before[k].DeviceID {
			t.Errorf("%s changed by the heal: %+v, was %+v", k, a, before[k])
		}
	}
	if got := e.sn.readFile(t, "container-1", "etc/container-data"); got != "mine" {
		t.Errorf("the container's data reads %q after the heal", got)
	}
	nt, ok := after[top]
	if alive, _ := e.sn.ThinExists(ctx, nt.DeviceID); !ok || nt.ID != before[top].ID || nt.DeviceID == before[top].DeviceID || !alive {
		t.Errorf("healed chain %+v (was %+v): want the same snapshot on a new device in the pool", nt, before[top])
	}
	if got := e.sn.readFile(t, top, "etc/base-only") + " " + e.sn.readFile(t, top, "etc/marker"); got != "from layer 1 top" {
		t.Errorf("the healed chain holds %q", got)
	}
	if _, err := e.sn.Prepare(ctx, "container-2", top); err != nil {
		t.Fatalf("a new container on the healed chain: %v", err)
	}
	if got := e.sn.readFile(t, "container-2", "etc/marker"); got != "top" {
		t.Errorf("a new container on the healed chain reads %q", got)
	}
	e.assertNoExtraction()
}

// startLiveRun records a pending run of machine with request req that no
// process executes (a pull under way elsewhere, or stalled).
func (e *env) startLiveRun(id, machine string, req any) func() {
	e.t.Helper()
	ctx := context.Background()
	raw, err := json.Marshal(req)
	if err != nil {
		e.t.Fatal(err)
	}
	now := time.Now()
	if _, _, err := fsm.NewSQLiteStore(e.db).CreateRun(ctx, fsm.RunRecord{ID: id, FSM: machine, IdempotencyID: id, Transition: "check", State: fsm.StatePending,
		Request: raw, CreatedAt: now, UpdatedAt: now}); err != nil {
		e.t.Fatal(err)
	}
	return func() {
		e.t.Helper()
		if err := fsm.NewSQLiteStore(e.db).Checkpoint(ctx, fsm.Checkpoint{RunID: id, State: fsm.StateAborted, Transition: "check", At: time.Now()}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// TestContainerdView: what containerd sees of the snapshotter and what its
// garbage collector may remove. Walk hides the pipeline's private
// snapshots (and, without a registrar, its chains); removing a chain a
// live run names is refused while another image's chain is removed at the
// same time; Cleanup prunes the records of the removed chains and images.
func TestContainerdView(t *testing.T) {
	ctx := context.Background()
	e := newPullEnv(t, newFakeRegistrar())
	e.srv.Put(t, "x/1.tar", layerTar(t, "x", 500))
	e.srv.Put(t, "y/1.tar", layerTar(t, "y", 600))
	rx, ry := e.mustPull("x/", "x"), e.mustPull("y/", "y")
	cx, cy := rx.TopChainID, ry.TopChainID
	if _, err := e.sn.Prepare(ctx, extractKey("sha256:"+strings.Repeat("cd", 32)), cx,
		snapshots.WithLabels(map[string]string{LabelPrivate: privateExtract})); err != nil {
		t.Fatal(err)
	}
	view := e.p.ContainerdView(e.sn)
	walk := func() []string {
		var seen []string
		if err := view.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			seen = append(seen, info.Name)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return seen
	}
	seen := walk()
	for _, k := range seen {
		if strings.HasPrefix(k, extractPrefix) || strings.HasPrefix(k, "snap-") {
			t.Errorf("containerd sees the private snapshot %s", k)
		}
	}
	if !slices.Contains(seen, cx) || !slices.Contains(seen, cy) {
		t.Errorf("containerd sees %v, want the chains %s and %s", seen, cx, cy)
	}
	e.p.opts.Registrar = nil
	if seen := walk(); len(seen) != 0 {
		t.Errorf("without a registrar containerd sees %v, want nothing", seen)
	}
	e.p.opts.Registrar = newFakeRegistrar()
	if err := e.sn.Remove(ctx, extractKey("sha256:"+strings.Repeat("cd", 32))); err != nil {
		t.Fatal(err)
	}

	// A run under way names x's chain (as the parent of the layer it makes).
	end := e.startLiveRun("live-unpack", api.FSMUnpack, UnpackRequest{ChainID: "sha256:" + strings.Repeat("ef", 32), ParentChainID: cx})
	if err := view.Remove(ctx, cx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("remove of a chain a live run names: %v, want failed precondition", err)
	}
	// The guard itself, inside the removal's transaction.
	if err := e.sn.RemoveIf(ctx, cx, GuardChain(cx)); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "live run") {
		t.Errorf("guarded removal of a chain a live run names: %v", err)
	}
	if err := view.Remove(ctx, cy); err != nil {
		t.Errorf("remove of another image's chain during that run: %v", err)
	}
	for k, want := range map[string]bool{cx: true, rx.Snapshot.SnapshotName: true, cy: false, ry.Snapshot.SnapshotName: false} {
		if ok, _ := e.sn.Exists(ctx, k); ok != want {
			t.Errorf("after the removals %s exists: %v, want %v", k, ok, want)
		}
	}
	if err := view.(snapshots.Cleaner).Cleanup(ctx); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if c, _ := RecordsOf(e.db).GetChain(ctx, cy); c != nil {
		t.Errorf("chain record of the removed chain kept: %+v", c)
	}
	if img, _ := RecordsOf(e.db).GetImage(ctx, ry.ImageID); img != nil {
		t.Errorf("image record of the removed image kept: %+v", img)
	}
	if names, _ := RecordsOf(e.db).imageNames(ctx, ry.ImageID); len(names) != 0 {
		t.Errorf("names of the removed image kept: %v", names)
	}
	if img, _ := RecordsOf(e.db).GetImage(ctx, rx.ImageID); img == nil {
		t.Error("the image whose chain was kept was pruned")
	}
	end()

	// An activation under way lists x's chain among its layers.
	end = e.startLiveRun("live-activate", api.FSMActivate, ActivateRequest{ImageID: "other", Layers: []api.Layer{{Key: "k", ChainID: cx}}})
	if err := view.Remove(ctx, cx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("remove of a chain a live activation lists: %v, want failed precondition", err)
	}
	end()
	if err := view.Remove(ctx, cx); err != nil {
		t.Fatalf("remove once no live run names the chain: %v", err)
	}
	if err := view.(snapshots.Cleaner).Cleanup(ctx); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if img, _ := RecordsOf(e.db).GetImage(ctx, rx.ImageID); img != nil {
		t.Errorf("image record kept after its chain was removed: %+v", img)
	}
	if files, _ := os.ReadDir(e.p.opts.blobDir()); len(files) != 0 {
		t.Errorf("layer files kept after every image was removed: %v", files)
	}
}

// TestContainerdViewRefusedRemoveKeepsActivation: a pull that starts using
// a chain while containerd's collector is removing it makes the removal
// refused; the image's activation must then still be there (the refusal
// keeps the whole image, not its chain alone).
func TestContainerdViewRefusedRemoveKeepsActivation(t *testing.T) {
	ctx := context.Background()
	e := newPullEnv(t, newFakeRegistrar())
	e.srv.Put(t, "x/1.tar", layerTar(t, "x", 500))
	rx := e.mustPull("x/", "x")
	view := e.p.ContainerdView(e.sn)
	e.sn.beforeRemoveIf = func(string) {
		e.startLiveRun("late-activate", api.FSMActivate, ActivateRequest{ImageID: rx.ImageID, Layers: []api.Layer{{Key: "x/1.tar", ChainID: rx.TopChainID}}})
	}
	if err := view.Remove(ctx, rx.TopChainID); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("remove of a chain a pull started using meanwhile: %v, want failed precondition", err)
	}
	if ok, _ := e.sn.Exists(ctx, rx.Snapshot.SnapshotName); !ok {
		t.Errorf("the removal of chain %s was refused, but the image's activation %s was removed", rx.TopChainID, rx.Snapshot.SnapshotName)
	}
}

// TestPruneSparesAPullBetweenDownloadAndUnpack: containerd's collection
// (Cleanup, which prunes) can come after a layer's download ended and
// before its unpack run started, when no run of that layer is live. The prune then keeps
// the objects and layer files the pull is about to unpack, and the pull
// succeeds; a prune once the pull is over deletes what nothing uses.
func TestPruneSparesAPullBetweenDownloadAndUnpack(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "race/1.tar", layerTar(t, "r1", 3000))
	e.srv.Put(t, "race/2.tar", layerTar(t, "r2", 3000))
	ctx := context.Background()
	var during PruneResult
	e.p.hooks = map[string]func(){"download:awaited": func() {
		var err error
		if during, err = e.p.Prune(ctx); err != nil {
			t.Errorf("prune during the pull: %v", err)
		}
	}}
	res, err := e.pull("race/", "race")
	if err != nil {
		t.Fatalf("pull with a prune between its downloads and its unpack: %v", err)
	}
	if !during.Deferred || during.Objects != 0 || len(during.LayerPaths) != 0 {
		t.Errorf("prune during the pull: %+v, want the objects and layer files kept (deferred)", during)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "r2" {
		t.Errorf("pulled image shows marker %q, want r2", got)
	}

	// Once the image's snapshots are gone, a prune with no pull under way
	// forgets its objects and deletes its files.
	e.p.hooks = nil
	keys := []string{res.Snapshot.SnapshotName}
	for i := len(res.Layers) - 1; i >= 0; i-- {
		keys = append(keys, res.Layers[i].ChainID)
	}
	for _, key := range keys {
		if err := e.sn.Remove(ctx, key); err != nil {
			t.Fatalf("remove %s: %v", key, err)
		}
	}
	after, err := e.p.Prune(ctx)
	if err != nil || after.Deferred || after.Objects != 2 || len(after.LayerPaths) != 2 {
		t.Fatalf("prune after the image was removed: %+v, %v; want 2 objects and 2 layer files, not deferred", after, err)
	}
	for _, path := range after.LayerPaths {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("layer file %s still there after the prune (%v)", path, err)
		}
	}
}

// failStoreMetadata downloads the object at key while the database refuses
// to record layers (a full disk: SQLITE_FULL is retried, then the run
// fails), so the download renames its file into place and never records
// it. It returns that file's path.
func (e *env) failStoreMetadata(key string, data []byte) string {
	e.t.Helper()
	ctx := context.Background()
	exec := func(q string) {
		e.t.Helper()
		if err := e.db.WithTx(ctx, func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, q); return err }); err != nil {
			e.t.Fatal(err)
		}
	}
	exec(`CREATE TRIGGER test_disk_full BEFORE INSERT ON layers BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END`)
	if _, rec, err := e.download(key); err == nil || !strings.Contains(err.Error(), "disk is full") {
		e.t.Fatalf("download with the database refusing writes: %v (%+v); want it failed, disk full", err, rec)
	}
	exec(`DROP TRIGGER test_disk_full`)
	if f, err := RecordsOf(e.db).LayerFile(ctx, sha(data)); err != nil || f != nil {
		e.t.Fatalf("layer row: %+v, %v; want none", f, err)
	}
	blob := e.p.blobPath(sha(data))
	if _, err := os.Stat(blob); err != nil {
		e.t.Fatalf("the failed download's file: %v; want it renamed into place", err)
	}
	return blob
}

// TestPruneRemovesUnrecordedLayerFile: a download that renamed its file
// into blobs/sha256 and then could not record it leaves a file no layer
// row names; the next prune with no run live deletes it, and the object
// downloads and is recorded again afterwards.
func TestPruneRemovesUnrecordedLayerFile(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 0)
	data := imageTar(t, 64<<10, 7)
	e.srv.Put(t, "s/1.tar", data)
	blob := e.failStoreMetadata("s/1.tar", data)
	res, err := e.p.Prune(ctx)
	if err != nil || res.Deferred || res.StrayFiles != 1 {
		t.Fatalf("prune: %+v, %v; want the one unrecorded layer file removed, not deferred", res, err)
	}
	if _, err := os.Stat(blob); !os.IsNotExist(err) {
		t.Errorf("layer file %s no row names is still there after the prune (%v)", blob, err)
	}
	resp, _, err := e.download("s/1.tar")
	if err != nil {
		t.Fatalf("download again: %v", err)
	}
	if f, err := RecordsOf(e.db).LayerFile(ctx, sha(data)); err != nil || f == nil || f.Path != resp.LocalPath {
		t.Errorf("layer row after downloading again: %+v, %v; want it naming %s", f, err, resp.LocalPath)
	}
}

// TestResumeSweepsUnrecordedLayerFile: start-up removes a layer file no
// layer row names, left by a download that failed to record it.
func TestResumeSweepsUnrecordedLayerFile(t *testing.T) {
	e := newPullEnv(t, nil)
	data := imageTar(t, 64<<10, 8)
	e.srv.Put(t, "s/1.tar", data)
	blob := e.failStoreMetadata("s/1.tar", data)
	e.p = e.reopen(nil)
	if _, err := os.Stat(blob); !os.IsNotExist(err) {
		t.Errorf("layer file %s no row names is still there after start-up (%v)", blob, err)
	}
}

// TestPruneKeepsLayerFileOfLiveDownload: a download's file is in place
// before its row is: a prune and a sweep while that download is live keep
// it, and the download completes with its file.
func TestPruneKeepsLayerFileOfLiveDownload(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 0)
	data := imageTar(t, 64<<10, 9)
	e.srv.Put(t, "s/1.tar", data)
	var during PruneResult
	e.p.hooks = map[string]func(){"store-metadata:started": func() {
		var err error
		if during, err = e.p.Prune(ctx); err != nil {
			t.Errorf("prune during the download: %v", err)
		}
		if err := e.p.sweep(ctx); err != nil {
			t.Errorf("sweep during the download: %v", err)
		}
	}}
	resp, _, err := e.download("s/1.tar")
	if err != nil {
		t.Fatalf("download with a prune and a sweep before its record: %v", err)
	}
	if !during.Deferred || during.StrayFiles != 0 {
		t.Errorf("prune during the download: %+v; want it deferred, no file removed", during)
	}
	if _, err := os.Stat(resp.LocalPath); err != nil {
		t.Errorf("layer file of the download: %v", err)
	}
	if f, err := RecordsOf(e.db).LayerFile(ctx, sha(data)); err != nil || f == nil {
		t.Errorf("layer row: %+v, %v; want it recorded", f, err)
	}
}

// TestUnpackStoppedMidExtractionStartsAfresh: a daemon stopped gracefully
// while it extracts a layer (one not extracted as it downloaded) leaves its
// unpack run to resume at the next start, without the attempt counted,
// and that attempt extracts onto a fresh device, not over the part of the
// layer the stopped one wrote (which, among others, took space from the
// budget the new attempt is given). The image comes out whole, and no
// extraction snapshot is left.
func TestUnpackStoppedMidExtractionStartsAfresh(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "g/1.tar.gz", s3test.Gzip(t, layerTar(t, "g1", 200_000, tarFile{name: "usr/a", body: []byte("old")}, tarFile{name: "etc/gone", body: []byte("x")})))
	top := []tarFile{{name: "etc/.wh.gone"}, {name: "usr/a", body: []byte("new")}}
	for i := range 500 {
		top = append(top, tarFile{name: fmt.Sprintf("usr/after%d", i), body: []byte("x")})
	}
	e.srv.Put(t, "g/2.tar.gz", s3test.Gzip(t, layerTar(t, "g2", 300_000, top...)))
	// The top layer is all in before its parent is committed: its unpack
	// extracts it from the file (or its spool), not as it downloads.
	e.srv.Faults.Delay(1, "g/1.tar.gz", time.Second)

	// etc/, usr/, var/, etc/marker, usr/pad.bin, usr/b, usr/a: the stop
	// comes after the seventh entry, with usr/a replaced.
	reached, release := make(chan struct{}), make(chan struct{})
	var entries int
	e.p.hooks = map[string]func(){"extract:progress": func() {
		if entries++; entries == 7 {
			close(reached)
			<-release
		}
	}}
	pulled := e.pullAsync("g/", "g")
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the top layer's extraction never reached its seventh entry")
	}
	closed := e.closeAsync()
	// The extraction goes on once the stop has canceled the runs'
	// context, to find it canceled.
	<-e.p.Manager().Done()
	close(release)
	if err := <-closed; err != nil {
		t.Fatalf("stopping the daemon: %v", err)
	}
	// The client is told the daemon stopped, and its pull has written all
	// it will before the next daemon starts on the same database.
	wantPullStopped(t, pulled)
	r := e.upperUnpackRun(t)
	if r.Transition != "extract-layers" || r.Attempts != 0 {
		t.Fatalf("after the stop the top layer's unpack run is at %q with %d attempts counted, want extract-layers with none", r.Transition, r.Attempts)
	}
	var stopped UnpackResponse
	if err := json.Unmarshal(r.Response, &stopped); err != nil || stopped.ExtractKey == "" || stopped.Streamed {
		t.Fatalf("the stopped run's response %s (%v): want the extraction snapshot create-device prepared", r.Response, err)
	}
	e.sn.writeFile(t, stopped.ExtractKey, "usr/stray", "not the layer's")

	e.p = e.reopen(nil)
	e.waitNoLiveRun("the restart")
	if r := e.upperUnpackRun(t); r.State != fsm.StateComplete {
		t.Fatalf("the top layer's unpack run after the restart: %s %q", r.State, r.LastError)
	}
	res := e.mustPull("g/", "g")
	for name, want := range map[string]string{"usr/a": "new", "etc/marker": "g2", "usr/after4": "x"} {
		if got := e.sn.readFile(t, res.Snapshot.SnapshotName, name); got != want {
			t.Errorf("image shows %s %q, want %q", name, got, want)
		}
	}
	for name, why := range map[string]string{"etc/gone": "whited out by the top layer", "usr/stray": "on the stopped attempt's device only"} {
		if _, err := os.Stat(e.sn.devicePath(t, res.Snapshot.SnapshotName, name)); !os.IsNotExist(err) {
			t.Errorf("%s, %s: %v, want it absent", name, why, err)
		}
	}
	e.assertNoExtraction()
}

// upperUnpackRun is the one unpack run of a layer with a parent.
func (e *env) upperUnpackRun(t *testing.T) fsm.RunRecord {
	t.Helper()
	runs, err := fsm.NewSQLiteStore(e.db).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMUnpack})
	if err != nil {
		t.Fatal(err)
	}
	var upper []fsm.RunRecord
	for _, r := range runs {
		var req UnpackRequest
		if err := json.Unmarshal(r.Request, &req); err != nil {
			t.Fatal(err)
		}
		if req.ParentChainID != "" {
			upper = append(upper, r)
		}
	}
	if len(upper) != 1 {
		t.Fatalf("%d unpack runs of a layer with a parent, want one", len(upper))
	}
	return upper[0]
}

// TestStopEndsThePullsItCuts: a daemon stopped gracefully during a pull
// (here while the pull's extraction of its layer as it downloads is held
// at its start) has Close return only once that pull has ended: what the
// pull does on its way out (its extraction stopped and its snapshot
// removed) is done before the next daemon starts on the same database and
// pool, whose start-up sweep would otherwise race it. The pull says the
// daemon stopped and is not recorded as a failure of the image: its runs
// resume at the next start. Nothing of the extraction is left.
func TestStopEndsThePullsItCuts(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "w/1.tar", layerTar(t, "w", 100_000))
	reached, release := make(chan struct{}), make(chan struct{})
	e.p.hooks = map[string]func(){"stream-extract:started": func() {
		close(reached)
		<-release
	}}
	pulled := e.pullAsync("w/", "w")
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the layer's extraction as it downloads never started")
	}
	closed := e.closeAsync()
	<-e.p.Manager().Done()
	// The extraction is held a second past the stop's start: a Close
	// that waits for the pull returns only after it is let go.
	closedFirst := false
	select {
	case err := <-closed:
		closedFirst = true
		closed <- err
	case <-time.After(time.Second):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatalf("stopping the daemon: %v", err)
	}
	if closedFirst {
		t.Error("Close returned while the pull it cut still ran: the pull stops its extraction and removes its snapshot after the stop")
	}
	wantPullStopped(t, pulled)
	_, imageID := imageSource(e.srv.Bucket, "w/")
	if im, err := RecordsOf(e.db).GetImage(context.Background(), imageID); err != nil || im != nil && im.FailureReason != "" {
		t.Errorf("after the stop the image is recorded %+v (%v); want no failure recorded: the pull did not fail", im, err)
	}
	if x := e.sn.extractions(t); len(x) != 0 {
		t.Errorf("extraction snapshots left after the stop: %v", x)
	}
}

// pullAsync starts a pull of key named ref and returns where its error
// comes once it returns.
func (e *env) pullAsync(key, ref string) <-chan error {
	pulled := make(chan error, 1)
	go func() {
		_, err := e.pull(key, ref)
		pulled <- err
	}()
	return pulled
}

// closeAsync stops the daemon (Close, 30 s at most) and returns where its
// error comes.
func (e *env) closeAsync() chan error {
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		closed <- e.p.Close(ctx)
	}()
	return closed
}

// wantPullStopped checks that the pull whose error comes on pulled
// returned within 30 s of the stop, told the daemon stopped.
func wantPullStopped(t *testing.T, pulled <-chan error) {
	t.Helper()
	select {
	case err := <-pulled:
		if !errors.Is(err, fsm.ErrClosed) {
			t.Fatalf("the pull the stop cut returned %v; want it told the daemon stopped (fsm.ErrClosed)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the pull the stop cut has not returned 30 s after the stop")
	}
}

// TestPruneWhileAnotherPullIsUnderWay: on a host where some pull is
// always under way, a prune still forgets the objects of an image
// containerd removed and deletes their layer files, and keeps those of the
// pull under way, which then succeeds.
func TestPruneWhileAnotherPullIsUnderWay(t *testing.T) {
	e := newPullEnv(t, nil)
	ctx := context.Background()
	oldTar := layerTar(t, "o1", 3000)
	e.srv.Put(t, "old/1.tar", oldTar)
	old := e.mustPull("old/", "old")
	oldFile := e.p.blobPath(sha(oldTar))
	if _, err := os.Stat(oldFile); err != nil {
		t.Fatalf("layer file of the first image: %v", err)
	}
	for _, key := range []string{old.Snapshot.SnapshotName, old.Layers[0].ChainID} {
		if err := e.sn.Remove(ctx, key); err != nil {
			t.Fatalf("remove %s: %v", key, err)
		}
	}

	e.srv.Put(t, "new/1.tar", layerTar(t, "n1", 3000))
	e.srv.Put(t, "new/2.tar", layerTar(t, "n2", 3000))
	var during PruneResult // summed over the prunes, one per layer awaited
	e.p.hooks = map[string]func(){"download:awaited": func() {
		res, err := e.p.Prune(ctx)
		if err != nil {
			t.Errorf("prune during the pull: %v", err)
		}
		during.Objects += res.Objects
		during.LayerPaths = append(during.LayerPaths, res.LayerPaths...)
	}}
	res, err := e.pull("new/", "new")
	if err != nil {
		t.Fatalf("pull with a prune between its downloads and its unpack: %v", err)
	}
	if during.Objects != 1 || len(during.LayerPaths) != 1 || during.LayerPaths[0] != oldFile {
		t.Errorf("prune during another pull: %+v; want the removed image's object forgotten and its layer file %s deleted", during, oldFile)
	}
	if _, err := os.Stat(oldFile); !os.IsNotExist(err) {
		t.Errorf("layer file %s of the removed image still there after the prune (%v)", oldFile, err)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "n2" {
		t.Errorf("pulled image shows marker %q, want n2", got)
	}
}

// TestPruneSparesAPullWhoseObjectChanged: a pull between its downloads
// and its unpack still reads the files it downloaded after another pull
// recorded its objects' new content under the same keys (the objects were
// overwritten in S3); a prune then keeps those files, and the pull
// succeeds.
func TestPruneSparesAPullWhoseObjectChanged(t *testing.T) {
	e := newPullEnv(t, nil)
	ctx := context.Background()
	e.srv.Put(t, "chg/1.tar", layerTar(t, "c1", 3000))
	e.srv.Put(t, "chg/2.tar", layerTar(t, "c2", 3000))
	var removed []string
	e.p.hooks = map[string]func(){"download:awaited": func() {
		// What a pull of the overwritten objects records.
		for _, k := range []string{"1", "2"} {
			path := filepath.Join(t.TempDir(), "new")
			if err := os.WriteFile(path, []byte("new content"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := RecordsOf(e.db).StoreDownload(ctx, Object{Bucket: e.srv.Bucket, Key: "chg/" + k + ".tar", ETag: `"new"`, SizeBytes: 11, Digest: "sha256:new" + k},
				LayerFile{Digest: "sha256:new" + k, Path: path, SizeBytes: 11}); err != nil {
				t.Fatal(err)
			}
		}
		res, err := e.p.Prune(ctx)
		if err != nil {
			t.Errorf("prune during the pull: %v", err)
		}
		removed = append(removed, res.LayerPaths...)
	}}
	res, err := e.pull("chg/", "chg")
	if err != nil {
		t.Fatalf("pull with its objects recorded anew and a prune between its downloads and its unpack: %v (the prune removed %v)", err, removed)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "c2" {
		t.Errorf("pulled image shows marker %q, want c2", got)
	}
}
