package gc

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter/snapshottertest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

const mib = 1 << 20

// fakeNames is a fake of containerd, over the snapshotter: it lists the
// images it is given (PoolImages), records the S3 names removed, and
// removes a registry image the way containerd does: the record, then what
// its garbage collection would remove through the proxy plugin (the
// snapshots containerd committed in that namespace, top first, that no
// other image of the namespace has; RemoveIf refuses one with children).
type fakeNames struct {
	snaps *snapshotter.Snapshotter

	mu         sync.Mutex
	removed    []string // S3 names unregistered
	images     []pipeline.PoolImage
	regRemoved []string // "NAMESPACE/NAME" removed
	// absent makes PoolImages answer as containerd's registrar does when
	// containerd's socket is absent.
	absent bool
}

func (n *fakeNames) Unregister(_ context.Context, name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.removed = append(n.removed, name)
	n.images = slices.DeleteFunc(n.images, func(pi pipeline.PoolImage) bool { return pi.Ours && pi.Name == name })
	return nil
}

func (n *fakeNames) PoolImages(context.Context) ([]pipeline.PoolImage, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.absent {
		return nil, fmt.Errorf("containerd at /run/containerd/containerd.sock: %w", pipeline.ErrContainerdAbsent)
	}
	return slices.Clone(n.images), nil
}

func (n *fakeNames) RemoveImage(ctx context.Context, ns, name string) error {
	n.mu.Lock()
	i := slices.IndexFunc(n.images, func(pi pipeline.PoolImage) bool { return pi.Namespace == ns && pi.Name == name })
	if i < 0 {
		n.mu.Unlock()
		return nil
	}
	gone := n.images[i]
	n.images = slices.Delete(n.images, i, i+1)
	n.regRemoved = append(n.regRemoved, ns+"/"+name)
	held := map[string]bool{}
	for _, pi := range n.images {
		if pi.Namespace == ns {
			for _, ch := range pi.Chains {
				held[ch] = true
			}
		}
	}
	n.mu.Unlock()
	for j := len(gone.Chains) - 1; j >= 0; j-- {
		ch := gone.Chains[j]
		if held[ch] {
			break
		}
		err := n.snaps.RemoveIf(ctx, registryKey(ns, ch), nil)
		if errdefs.IsNotFound(err) {
			continue // not containerd's own: an S3 chain it adopted
		}
		if err != nil {
			break // containerd's collector keeps what something is on
		}
	}
	return nil
}

// registryKey is the key containerd's unpacker commits chain under in our
// snapshotter, in namespace ns.
func registryKey(ns, chain string) string { return ns + "/1/" + chain }

// counts is an Observer that counts.
type counts struct {
	mu      sync.Mutex
	runs    int
	removed map[string]int
	freed   int64
}

func (c *counts) Ran(string, time.Duration) { c.mu.Lock(); c.runs++; c.mu.Unlock() }

func (c *counts) ran() int { c.mu.Lock(); defer c.mu.Unlock(); return c.runs }
func (c *counts) Removed(cause, source string, freed int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed[cause]++
	c.removed[cause+"/"+source]++
	c.freed += freed
}
func (c *counts) Freed(cause, source string, freed int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.freed += freed
}

// harness is a collector over the real snapshotter on a fake thin pool,
// the fake containerd and a real database.
type harness struct {
	t     *testing.T
	db    *metadata.DB
	snaps *snapshotter.Snapshotter
	pool  *thinpooltest.FakePool
	names *fakeNames
	obs   *counts
	c     *Collector
	dir   string

	mu      sync.Mutex
	total   uint64 // the pool's data bytes
	reads   int    // usage calls
	glances int    // glance calls
}

func newHarness(t *testing.T, total uint64, opts Options) *harness {
	t.Helper()
	db := metadatatest.Open(t)
	h := &harness{t: t, db: db, total: total, obs: &counts{removed: map[string]int{}}, dir: t.TempDir()}
	h.snaps, h.pool = snapshottertest.New(t, db, snapshotter.DefaultConfig())
	h.names = &fakeNames{snaps: h.snaps}
	opts.DB, opts.Snapshots, opts.Usage, opts.Names, opts.Observer = db, h.snaps, h.usage, h.names, h.obs
	opts.Guard = pipeline.GuardChain
	opts.Prune = func(ctx context.Context) error {
		res, err := pipeline.RecordsOf(db).PruneOrphans(ctx, true)
		for _, p := range res.LayerPaths {
			os.Remove(p)
		}
		return err
	}
	var err error
	if h.c, err = New(opts); err != nil {
		t.Fatal(err)
	}
	return h
}

// sectorBytes is the size of the sectors thin devices map.
const sectorBytes = 512

// add makes snapshot key on parent through the snapshotter, as containerd
// does, its device holding bytes of data: an active one is prepared (with
// labels) and written; a committed one is prepared, written and committed
// (with labels).
func (h *harness) add(key, parent, kind string, labels map[string]string, bytes uint64) {
	h.t.Helper()
	ctx := context.Background()
	active := key
	switch kind {
	case snapshotter.SnapKindActive:
		if _, err := h.snaps.Prepare(ctx, key, parent, snapshots.WithLabels(labels)); err != nil {
			h.t.Fatalf("prepare %s: %v", key, err)
		}
	case snapshotter.SnapKindCommitted:
		active = "extract " + key
		if _, err := h.snaps.Prepare(ctx, active, parent); err != nil {
			h.t.Fatalf("prepare %s to commit as %s: %v", active, key, err)
		}
	default:
		h.t.Fatalf("add %s: kind %q: want active or committed", key, kind)
	}
	h.write(active, bytes)
	if kind == snapshotter.SnapKindCommitted {
		if err := h.snaps.Commit(ctx, key, active, snapshots.WithLabels(labels)); err != nil {
			h.t.Fatalf("commit %s as %s: %v", active, key, err)
		}
	}
}

// write makes the device of snapshot key map bytes more of data.
func (h *harness) write(key string, bytes uint64) {
	h.t.Helper()
	_, _, id, err := h.snaps.DeviceOf(context.Background(), key)
	if err != nil {
		h.t.Fatalf("device of %s: %v", key, err)
	}
	if err := h.pool.Write(id, bytes/sectorBytes); err != nil {
		h.t.Fatalf("write %d bytes to %s: %v", bytes, key, err)
	}
}

// usage is the pool's usage as the fake pool reports it: the data its
// devices map, of the harness's total.
func (h *harness) usage(context.Context) (Usage, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reads++
	return h.now(), nil
}

// glance is the harness's Options.Glance: the same usage as usage's (the
// fake pool has no commits to skip), counted apart. Set it in the options
// given to newHarness through a variable holding the harness.
func (h *harness) glance(context.Context) (Usage, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.glances++
	return h.now(), nil
}

// now is the fake pool's usage; the caller holds h.mu.
func (h *harness) now() Usage {
	return Usage{DataUsed: h.pool.UsedSectors() * sectorBytes, DataTotal: h.total, MetaUsed: 10, MetaTotal: 1000,
		DataReserve: uint64(float64(h.total) * h.pool.Reserve() / 100)}
}

// layer is one layer of a test image: its chain and the bytes its device
// holds.
type layer struct {
	chain string
	bytes uint64
}

// image records what a pull of image id (named name) leaves: a layer file
// and object per layer, each chain's committed snapshot (made once, shared
// by the images that have it), the chain rows, the activation and the
// image's records. It returns the layer files.
func (h *harness) image(id, name string, layers ...layer) []string {
	h.t.Helper()
	ctx := context.Background()
	source := "s3://bucket/" + id + "/"
	var (
		recs  []pipeline.ImageLayer
		files []string
		prev  string
	)
	for i, l := range layers {
		key := fmt.Sprintf("%s/%d.tar", id, i+1)
		digest := "sha256:diff-" + l.chain
		if c, err := pipeline.RecordsOf(h.db).GetChain(ctx, l.chain); err != nil {
			h.t.Fatal(err)
		} else if c == nil {
			h.add(l.chain, prev, snapshotter.SnapKindCommitted, map[string]string{pipeline.LabelSource: source}, l.bytes)
			if err := pipeline.RecordsOf(h.db).StoreChain(ctx, pipeline.Chain{ChainID: l.chain, ParentChainID: prev, DiffID: digest, SizeBytes: int64(l.bytes)}); err != nil {
				h.t.Fatal(err)
			}
		}
		path := filepath.Join(h.dir, "blob-"+l.chain)
		if err := os.WriteFile(path, []byte("tarball"), 0o600); err != nil {
			h.t.Fatal(err)
		}
		files = append(files, path)
		if err := pipeline.RecordsOf(h.db).StoreDownload(ctx, pipeline.Object{Bucket: "bucket", Key: key, ETag: "e", SizeBytes: 7, Digest: digest},
			pipeline.LayerFile{Digest: digest, Path: path, SizeBytes: 7}); err != nil {
			h.t.Fatal(err)
		}
		recs = append(recs, pipeline.ImageLayer{Key: key, ETag: "e", SizeBytes: 7, ChainID: l.chain})
		prev = l.chain
	}
	h.add(pipeline.ActivationKey(id), prev, snapshotter.SnapKindActive, map[string]string{pipeline.LabelPrivate: "activation"}, mib)
	if err := pipeline.RecordsOf(h.db).RecordPulledImage(ctx, id, source, recs, name); err != nil {
		h.t.Fatal(err)
	}
	return files
}

// gone checks that nothing is left of image id: no image, name, chain or
// snapshot record, no device in the pool, no layer file.
func (h *harness) gone(id, name string, chains []string, files []string) {
	h.t.Helper()
	ctx := context.Background()
	if im, err := pipeline.RecordsOf(h.db).GetImage(ctx, id); err != nil || im != nil {
		h.t.Errorf("image %s still recorded: %+v %v", id, im, err)
	}
	if got, _ := pipeline.RecordsOf(h.db).ImageIDByName(ctx, name); got != "" {
		h.t.Errorf("name %s still recorded (image %s)", name, got)
	}
	for _, key := range append([]string{pipeline.ActivationKey(id)}, chains...) {
		if _, ok, _ := snapshotter.ReadRecords(h.db).Snapshot(ctx, key); ok {
			h.t.Errorf("snapshot %s of image %s still recorded", key, id)
		}
		if c, _ := pipeline.RecordsOf(h.db).GetChain(ctx, key); c != nil {
			h.t.Errorf("chain %s of image %s still recorded", key, id)
		}
	}
	if devs, _ := snapshotter.ReadRecords(h.db).ThinDevices(ctx, snapshotter.ThinStateRemoved); len(devs) != 0 {
		h.t.Errorf("removed devices not deleted from the pool: %+v", devs)
	}
	for _, f := range files {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			h.t.Errorf("layer file %s of image %s still there (%v)", f, id, err)
		}
	}
	if !slices.Contains(h.names.removed, name) {
		h.t.Errorf("name %s not removed from containerd (removed: %v)", name, h.names.removed)
	}
}

func (h *harness) present(ids ...string) {
	h.t.Helper()
	for _, id := range ids {
		if im, err := pipeline.RecordsOf(h.db).GetImage(context.Background(), id); err != nil || im == nil {
			h.t.Errorf("image %s was removed", id)
		}
		if _, ok, _ := snapshotter.ReadRecords(h.db).Snapshot(context.Background(), pipeline.ActivationKey(id)); !ok {
			h.t.Errorf("activation of image %s was removed", id)
		}
	}
}

func TestCollectRemovesLeastRecentlyUsedUntilUnderLow(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	var files [][]string
	for i := 1; i <= 4; i++ {
		files = append(files, h.image(fmt.Sprintf("img%d", i), fmt.Sprintf("name%d", i), layer{fmt.Sprintf("c%d", i), 200 * mib}))
	}
	// 4 × 201 MiB: 80.4%, under the high threshold: nothing to do.
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil || len(rep.Removed) != 0 {
		t.Fatalf("under the high threshold: removed %v, %v", rep.Removed, err)
	}
	// img1 used after the others: img2 is now the least recently used.
	if err := pipeline.RecordsOf(h.db).TouchImage(ctx, "img1"); err != nil {
		t.Fatal(err)
	}
	files = append(files, h.image("img5", "name5", layer{"c5", 200 * mib})) // 100.5%
	rep, err = h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("usage %s → %s, removed %d", rep.Before, rep.After, len(rep.Removed))
	// 100.5% → 80.4% (img2) → 60.3% (img3): two removals to get under 80%.
	if len(rep.Removed) != 2 || rep.Removed[0].ImageID != "img2" || rep.Removed[1].ImageID != "img3" {
		t.Fatalf("removed %+v, want img2 then img3", rep.Removed)
	}
	if rep.After.DataPercent() >= DefaultLowThreshold {
		t.Errorf("after collection the pool is %s, not under %v%%", rep.After, DefaultLowThreshold)
	}
	if rep.Removed[0].Freed != 201*mib || !strings.Contains(rep.Removed[0].Reason, "unused since") {
		t.Errorf("removal of img2: freed %d, reason %q", rep.Removed[0].Freed, rep.Removed[0].Reason)
	}
	h.gone("img2", "name2", []string{"c2"}, files[1])
	h.gone("img3", "name3", []string{"c3"}, files[2])
	h.present("img1", "img4", "img5")
	if h.obs.runs != 1 || h.obs.removed["usage"] != 2 || h.obs.freed != 2*201*mib {
		t.Errorf("observed %d runs, %v removals, %d bytes freed; want 1, 2, %d", h.obs.runs, h.obs.removed, h.obs.freed, 2*201*mib)
	}
}

func TestCollectKeepsImagesInUse(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{Pinned: []string{"pinned-by-config"}})
	h.image("img1", "pinned-by-config", layer{"c1", 150 * mib})
	h.image("img2", "pinned-in-containerd", layer{"c2", 150 * mib})
	h.names.images = append(h.names.images, pipeline.PoolImage{Namespace: "default", Name: "pinned-in-containerd", Ours: true, Chains: []string{"c2"}, Pinned: true})
	h.image("img3", "with-container", layer{"c3a", 100 * mib}, layer{"c3b", 50 * mib})
	h.add("default/7/container", "c3a", snapshotter.SnapKindActive, nil, mib)
	h.image("img4", "being-pulled", layer{"c4", 150 * mib})
	end := h.c.Begin("img4")
	defer end()
	h.image("img5", "live-run", layer{"c5", 150 * mib})
	if err := h.db.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO fsm_runs (run_id, fsm, idempotency_id, request, transition, state, created_at, updated_at)
			VALUES ('r1', ?, 'c5', '{"chain_id":"c5"}', 'verify-layout', 'running', 1, 1)`, api.FSMUnpack)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	files := h.image("img6", "unused", layer{"c6", 150 * mib}) // 5 × 151 + 152 MiB: 91%
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || rep.Removed[0].ImageID != "img6" {
		t.Fatalf("removed %+v, want img6 alone", rep.Removed)
	}
	// The live run defers pruning the objects and layer files (checked at
	// the end).
	h.gone("img6", "unused", []string{"c6"}, nil)
	h.present("img1", "img2", "img3", "img4", "img5")
	for id, want := range map[string]string{"img1": "[gc] pinned", "img2": pipeline.LabelPinned, "img3": `"default/7/container"`,
		"img4": "pull of it is under way", "img5": "live run"} {
		if !strings.Contains(rep.Kept[id], want) {
			t.Errorf("image %s kept because %q, want it to say %q", id, rep.Kept[id], want)
		}
	}
	// Nothing else can go: a pull that needs more than is free is refused,
	// naming the free space and the layer.
	err = h.makeRoom(ctx, "s3://bucket/big/", []pipeline.LayerNeed{{Position: 1, Key: "big/1.tar", Bytes: 100 * mib}, {Position: 2, Key: "big/2.tar", Bytes: 200 * mib}})
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("MakeRoom = %v, want ErrNoRoom", err)
	}
	for _, want := range []string{"layer 2 (big/2.tar, 200.0 MiB)", "244.0 MiB free", "5 image(s) in use kept"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("MakeRoom error %q does not say %q", err, want)
		}
	}
	h.present("img1", "img2", "img3", "img4", "img5")
	// A pull that fits is let through.
	if err := h.makeRoom(ctx, "s3://bucket/small/", []pipeline.LayerNeed{{Position: 1, Key: "small/1.tar", Bytes: 100 * mib}}); err != nil {
		t.Errorf("MakeRoom of a layer that fits: %v", err)
	}
	// Once the live run is over, the next prune removes img6's layer file.
	if err := h.db.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE fsm_runs SET state = 'failed' WHERE run_id = 'r1'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.c.opts.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	h.gone("img6", "unused", []string{"c6"}, files)
}

func TestCollectKeepsSharedChains(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	h.image("old", "old", layer{"base", 400 * mib}, layer{"old-top", 200 * mib})
	h.image("new", "new", layer{"base", 400 * mib}, layer{"new-top", 300 * mib}) // 902 MiB
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || rep.Removed[0].ImageID != "old" || rep.Removed[0].Freed != 201*mib {
		t.Fatalf("removed %+v, want old with 201 MiB freed", rep.Removed)
	}
	h.gone("old", "old", []string{"old-top"}, nil)
	h.present("new")
	if c, _ := pipeline.RecordsOf(h.db).GetChain(ctx, "base"); c == nil {
		t.Errorf("the shared chain was removed with the old image")
	}
}

func TestMakeRoomCollectsFirst(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	files := h.image("img1", "one", layer{"c1", 300 * mib})
	h.image("img2", "two", layer{"c2", 300 * mib}) // 60.2%
	// 300 MiB more, with the margin 337.5 MiB: 94%, past the high threshold.
	if err := h.makeRoom(ctx, "s3://bucket/img3/", []pipeline.LayerNeed{{Position: 1, Key: "img3/1.tar", Bytes: 300 * mib}}); err != nil {
		t.Fatal(err)
	}
	h.gone("img1", "one", []string{"c1"}, files)
	h.present("img2")
}

func TestRemove(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 10000*mib, Options{})
	files := h.image("img1", "one", layer{"c1", 100 * mib})
	h.image("img2", "two", layer{"c2", 100 * mib})
	h.add("container", "c2", snapshotter.SnapKindActive, nil, mib)
	removed, err := h.c.Remove(ctx, []string{"one", "two", "three"})
	if len(removed) != 1 || removed[0].ImageID != "img1" || removed[0].Reason != "removed by rm one" {
		t.Errorf("removed %+v, want img1", removed)
	}
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), `rm two: image img2 is in use (snapshot "container" (a container's) is on layer 1)`) {
		t.Errorf("rm of an image with a container: %v", err)
	}
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "rm three: no image pulled under that name") {
		t.Errorf("rm of a name never pulled: %v", err)
	}
	h.gone("img1", "one", []string{"c1"}, files)
	h.present("img2")
	if h.obs.removed["rm"] != 1 {
		t.Errorf("observed removals %v, want one rm", h.obs.removed)
	}
}

// TestRemoveRefusesImageWhosePullRunsGoOn: a pull whose client went away
// (Ctrl-C) leaves its runs going on in the daemon, and its activate run
// records and registers the image when it ends. rm of that image refuses
// until then instead of answering "removed" for an image that comes back;
// once the runs have ended, rm removes it.
func TestRemoveRefusesImageWhosePullRunsGoOn(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 10000*mib, Options{})
	const source = "s3://bucket/undo/"
	if err := pipeline.RecordsOf(h.db).MarkImageFailed(ctx, "undo", source, "pull s3://bucket/undo/: context canceled"); err != nil {
		t.Fatal(err)
	}
	if err := h.db.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO fsm_runs (run_id, fsm, idempotency_id, request, transition, state, created_at, updated_at)
			VALUES ('r1', ?, 'undo', '{"image_id":"undo","layers":[]}', 'check-snapshot', 'pending', 1, 1)`, api.FSMActivate)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	removed, err := h.c.Remove(ctx, []string{source})
	if len(removed) != 0 || !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "its runs go on") {
		t.Fatalf("rm of an image whose pull's runs go on: removed %+v, %v; want refused as in use, saying its runs go on", removed, err)
	}
	// A first pull's runs record the image only when they end: its source
	// and its name are refused alike meanwhile.
	if err := h.db.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO fsm_runs (run_id, fsm, idempotency_id, request, transition, state, created_at, updated_at)
			VALUES ('r2', ?, 'first', '{"image_id":"first","source":"s3://bucket/first/","ref":"first:v1","layers":[]}', 'check-snapshot', 'pending', 1, 1)`, api.FSMActivate)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"s3://bucket/first", "s3://bucket/first/", "first:v1"} {
		if _, err := h.c.Remove(ctx, []string{ref}); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "its runs go on") {
			t.Errorf("rm %s while the first pull's runs go on: %v; want refused as in use, saying its runs go on", ref, err)
		}
	}
	if im, err := pipeline.RecordsOf(h.db).GetImage(ctx, "undo"); err != nil || im == nil {
		t.Fatalf("image record after the refused rm: %+v, %v; want it kept", im, err)
	}
	if err := h.db.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE fsm_runs SET state = 'failed' WHERE run_id = 'r1'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if removed, err := h.c.Remove(ctx, []string{source}); err != nil || len(removed) != 1 || removed[0].ImageID != "undo" {
		t.Fatalf("rm once the runs ended: removed %+v, %v; want the image removed", removed, err)
	}
}

func TestNewRejectsBadThresholds(t *testing.T) {
	h := newHarness(t, 1000*mib, Options{})
	for _, c := range [][2]float64{{80, 85}, {101, 50}, {85, -1}, {50, 50}} {
		if _, err := New(Options{DB: &metadata.DB{}, Snapshots: h.snaps, Usage: h.usage, Guard: pipeline.GuardChain,
			Prune: func(context.Context) error { return nil }, HighThreshold: c[0], LowThreshold: c[1]}); err == nil ||
			!strings.Contains(err.Error(), "must be 0 < low < high <= 100") {
			t.Errorf("high %v low %v: %v", c[0], c[1], err)
		}
	}
}

func TestDisabledCollectsNothingButRemoveWorks(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{Disabled: true})
	files := h.image("img1", "one", layer{"c1", 500 * mib})
	h.image("img2", "two", layer{"c2", 400 * mib}) // 90.2%
	h.c.Pulled(ctx, "img2")
	if err := h.makeRoom(ctx, "s3://bucket/img3/", []pipeline.LayerNeed{{Position: 1, Key: "img3/1.tar", Bytes: 50 * mib}}); err != nil {
		t.Errorf("MakeRoom with collection disabled: %v", err)
	}
	h.present("img1", "img2")
	end := h.c.Begin("img2")
	if _, err := h.c.Remove(ctx, []string{"two"}); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "a pull of it is under way") {
		t.Errorf("rm of an image being pulled: %v", err)
	}
	end()
	if removed, err := h.c.Remove(ctx, []string{"one"}); err != nil || len(removed) != 1 {
		t.Fatalf("rm with collection disabled: %v %v", removed, err)
	}
	h.gone("img1", "one", []string{"c1"}, files)
}

// TestCollectWhenHostFilesystemLow: with the pool's data far from its
// threshold, a host filesystem past the high threshold (what the removed
// images held there counting) makes a collection remove the least recently
// used unused image until it is under the low threshold.
func TestCollectWhenHostFilesystemLow(t *testing.T) {
	ctx := context.Background()
	h := newHostHarness(t, func(u Usage) uint64 { return 900*mib + u.DataUsed })
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || rep.Removed[0].ImageID != "img1" || rep.After.HostPercent() >= 80 || rep.Before.DataPercent() > 10 {
		t.Fatalf("collection: removed %+v, before %s, after %s; want img1 removed for the host filesystem", rep.Removed, rep.Before, rep.After)
	}
	t.Logf("before %s, after %s", rep.Before, rep.After)
}

// newHostHarness is a 10000 MiB pool with four unused 200 MiB images,
// img1 the least recently used, on a 2000 MiB host filesystem of which
// hostUsed(the pool's usage) is used.
func newHostHarness(t *testing.T, hostUsed func(Usage) uint64) *harness {
	h := newHarness(t, 10000*mib, Options{})
	for _, id := range []string{"img1", "img2", "img3", "img4"} {
		h.image(id, "name-"+id, layer{"c-" + id, 200 * mib})
	}
	poolUsage := h.c.opts.Usage
	h.c.opts.Usage = func(ctx context.Context) (Usage, error) {
		u, err := poolUsage(ctx)
		u.HostTotal, u.HostUsed = 2000*mib, hostUsed(u)
		return u, err
	}
	return h
}

// TestCollectStopsWhenHostFilesystemIsNotTheImages: a host filesystem
// past the threshold for another reason than the images (the pool's loop
// files keep every block the pool ever wrote) costs at most the one
// removal that shows it: removing an image that frees nothing there stops
// the collection, instead of removing every unused image.
func TestCollectStopsWhenHostFilesystemIsNotTheImages(t *testing.T) {
	ctx := context.Background()
	h := newHostHarness(t, func(Usage) uint64 { return 1800 * mib })
	rep, err := h.c.Collect(ctx, "timer", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) > 1 {
		t.Fatalf("collection removed %d images for a host filesystem that removing them does not free (%s -> %s)", len(rep.Removed), rep.Before, rep.After)
	}
	h.present("img2", "img3", "img4")
}

// TestHostUsageLeavesOutLoopFiles: the host filesystem's usage collection
// watches does not count the blocks of the pool's loop files, which no
// removal of images frees.
func TestHostUsageLeavesOutLoopFiles(t *testing.T) {
	dir := t.TempDir()
	loop := filepath.Join(dir, "data")
	if err := os.WriteFile(loop, bytes.Repeat([]byte{1}, 64<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(loop, &st); err != nil {
		t.Fatal(err)
	}
	blocks := uint64(st.Blocks) * 512
	all, total, err := HostUsage(nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	less, total2, err := HostUsage([]string{loop, filepath.Join(dir, "missing")}, dir)
	if err != nil {
		t.Fatal(err)
	}
	// Other writers on the filesystem may move its usage a little between
	// the two calls.
	if d := int64(all) - int64(less) - int64(blocks); total != total2 || d < -8<<20 || d > 8<<20 {
		t.Errorf("usage %d without the loop file, %d with it left out (totals %d, %d); want less by its %d bytes", all, less, total, total2, blocks)
	}
}

// TestMakeRoomGrowsPool: when collection leaves too little room (the images
// are in use), a pool that may grow is grown step by step until the pull's
// layers fit, and no further; once it may not grow, the pull is refused.
func TestMakeRoomGrowsPool(t *testing.T) {
	ctx := context.Background()
	grows, maxTotal := 0, uint64(1600*mib)
	var h *harness
	h = newHarness(t, 1000*mib, Options{Grow: func(context.Context) (bool, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.total+200*mib > maxTotal {
			return false, nil
		}
		h.total += 200 * mib
		grows++
		return true, nil
	}})
	for _, id := range []string{"img1", "img2"} {
		h.image(id, "name-"+id, layer{"c-" + id, 450 * mib})
		h.add("ctr-"+id, "c-"+id, snapshotter.SnapKindActive, nil, 0) // in use: nothing to collect
	}
	// 300 MiB with the margin: 337.5 MiB; 98 MiB free, 298 after one step.
	if err := h.makeRoom(ctx, "s3://bucket/img3/", []pipeline.LayerNeed{{Position: 1, Key: "img3/1.tar", Bytes: 300 * mib}}); err != nil {
		t.Fatalf("MakeRoom with growth allowed: %v", err)
	}
	if grows != 2 || h.total != 1400*mib {
		t.Fatalf("grew %d times to %d MiB; want twice, to 1400 MiB", grows, h.total/mib)
	}
	h.present("img1", "img2")
	err := h.makeRoom(ctx, "s3://bucket/img4/", []pipeline.LayerNeed{{Position: 1, Key: "img4/1.tar", Bytes: 800 * mib}})
	if !errors.Is(err, ErrNoRoom) || h.total != 1600*mib {
		t.Fatalf("MakeRoom past the growth limit: %v (pool %d MiB); want ErrNoRoom at 1600 MiB", err, h.total/mib)
	}
}

// registry records what containerd's unpacker leaves of a registry image
// name in namespace ns: each chain committed under registryKey (made once
// per namespace, on the chain below), labelled snapshot.ref = its chain
// ID as containerd's metadata store passes it on, and the image in the
// fake containerd, last used at used. A layer whose chain is in ours is
// an S3 chain containerd adopted: nothing is made for it.
func (h *harness) registry(ns, name string, used time.Time, ours map[string]bool, layers ...layer) *pipeline.PoolImage {
	h.t.Helper()
	ctx := context.Background()
	pi := pipeline.PoolImage{Namespace: ns, Name: name, UsedAt: used}
	parent := ""
	for _, l := range layers {
		key := l.chain
		if !ours[l.chain] {
			key = registryKey(ns, l.chain)
			if _, ok, err := snapshotter.ReadRecords(h.db).Snapshot(ctx, key); err != nil {
				h.t.Fatal(err)
			} else if !ok {
				h.add(key, parent, snapshotter.SnapKindCommitted, map[string]string{snapshots.LabelSnapshotRef: l.chain}, l.bytes)
			}
		}
		pi.Chains = append(pi.Chains, l.chain)
		parent = key
	}
	h.names.images = append(h.names.images, pi)
	return &h.names.images[len(h.names.images)-1]
}

// snapshotGone fails unless key's snapshot record is gone and no device is
// left to delete.
func (h *harness) snapshotGone(keys ...string) {
	h.t.Helper()
	ctx := context.Background()
	for _, key := range keys {
		if _, ok, _ := snapshotter.ReadRecords(h.db).Snapshot(ctx, key); ok {
			h.t.Errorf("snapshot %s still recorded", key)
		}
	}
	if devs, _ := snapshotter.ReadRecords(h.db).ThinDevices(ctx, snapshotter.ThinStateRemoved); len(devs) != 0 {
		h.t.Errorf("removed devices not deleted from the pool: %+v", devs)
	}
}

// TestCollectCoversRegistryImages: registry images containerd unpacked in
// the pool, in two namespaces, are collected with the S3 images, least
// recently used first whatever their source, until the pool is under the
// low threshold; one with a container, under a lease, pinned (label or
// config) or below a container's snapshot is kept, with the reason.
func TestCollectCoversRegistryImages(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 2000*mib, Options{Pinned: []string{"reg/config-pinned"}})
	now := time.Now()
	old := now.Add(-time.Hour)
	// Older than any S3 image, but each held by something.
	h.registry("a", "reg/with-container", old.Add(-9*time.Minute), nil, layer{"rc1", 100 * mib}).Containers = []string{"ctr1"}
	h.registry("a", "reg/leased", old.Add(-8*time.Minute), nil, layer{"rl1", 100 * mib}).Lease = "pull-lease"
	h.registry("b", "reg/label-pinned", old.Add(-7*time.Minute), nil, layer{"rp1", 100 * mib}).Pinned = true
	h.registry("b", "reg/config-pinned", old.Add(-6*time.Minute), nil, layer{"rq1", 100 * mib})
	h.registry("b", "reg/base", old.Add(-5*time.Minute), nil, layer{"rb1", 100 * mib}, layer{"rb2", 50 * mib})
	h.add("b/9/running", registryKey("b", "rb1"), snapshotter.SnapKindActive, nil, mib)
	// The unused ones: the oldest registry image, then an S3 image, then
	// a registry image in the other namespace, then the newest S3 image.
	h.registry("a", "reg/oldest", old.Add(-time.Minute), nil, layer{"ro1", 200 * mib}, layer{"ro2", 100 * mib})
	s3Files := h.image("s3-old", "s3/old", layer{"s1", 300 * mib})
	h.registry("b", "reg/middle", now.Add(time.Hour), nil, layer{"rm1", 300 * mib})
	h.image("s3-new", "s3/new", layer{"s2", 300 * mib})
	h.registry("a", "reg/newest", now.Add(2*time.Hour), nil, layer{"rn1", 300 * mib}) // 1904 MiB: 95.2%
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	got := removedKinds(rep)
	// 95.2% → 80.2% (reg/oldest) → 65.2% (s3/old): under 80%.
	if want := []string{"registry:reg/oldest", "s3:s3/old"}; !slices.Equal(got, want) {
		t.Fatalf("removed %v, want %v", got, want)
	}
	if rep.Removed[0].Namespace != "a" || rep.Removed[0].Freed != 300*mib {
		t.Errorf("registry removal %+v: want namespace a, 300 MiB freed", rep.Removed[0])
	}
	if rep.After.DataPercent() >= DefaultLowThreshold {
		t.Errorf("after collection the pool is %s, not under %v%%", rep.After, DefaultLowThreshold)
	}
	if !slices.Equal(h.names.regRemoved, []string{"a/reg/oldest"}) {
		t.Errorf("containerd removed %v, want a/reg/oldest alone", h.names.regRemoved)
	}
	h.snapshotGone(registryKey("a", "ro1"), registryKey("a", "ro2"))
	h.gone("s3-old", "s3/old", []string{"s1"}, s3Files)
	h.present("s3-new")
	for id, want := range map[string]string{
		"a/reg/with-container": `container "ctr1"`,
		"a/reg/leased":         `lease "pull-lease"`,
		"b/reg/label-pinned":   pipeline.LabelPinned,
		"b/reg/config-pinned":  "[gc] pinned",
		"b/reg/base":           `"b/9/running" (a container's) is on layer 1`,
	} {
		if !strings.Contains(rep.Kept[id], want) {
			t.Errorf("image %s kept because %q, want it to say %q", id, rep.Kept[id], want)
		}
	}
	if h.obs.removed["usage/registry"] != 1 || h.obs.removed["usage/s3"] != 1 {
		t.Errorf("observed removals %v, want one of each source", h.obs.removed)
	}
	// Nothing else is past the high threshold: a second collection does
	// nothing.
	if rep, err := h.c.Collect(ctx, "test", 0); err != nil || len(rep.Removed) != 0 {
		t.Errorf("second collection removed %+v, %v", rep.Removed, err)
	}
}

// TestCollectSharedChainsAcrossSources: a registry image containerd
// unpacked on an S3 image's chain (a shared base layer) and an S3 image
// whose base is a chain containerd unpacked. Removing the S3 image keeps
// the base the registry image's layer sits on; removing the registry
// image keeps the chain the S3 image built on, and its S3 base.
func TestCollectSharedChainsAcrossSources(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	old := time.Now().Add(-time.Hour)
	h.image("s3-base", "s3/base", layer{"base", 300 * mib}, layer{"s3-top", 100 * mib})
	ours := map[string]bool{"base": true}
	h.registry("a", "reg/on-s3", old, ours, layer{"base", 0}, layer{"reg-top", 200 * mib})
	h.registry("a", "reg/new", time.Now().Add(time.Hour), nil, layer{"other", 300 * mib}) // 903 MiB: 90.3%
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	// reg/on-s3 goes first (the least recently used): containerd removes
	// its own top (200 MiB) and keeps the S3 base it adopted, which the S3
	// image still has: 70.1%, under the low threshold.
	got := removedKinds(rep)
	if want := []string{"registry:reg/on-s3"}; !slices.Equal(got, want) {
		t.Fatalf("removed %v, want %v", got, want)
	}
	h.snapshotGone(registryKey("a", "reg-top"))
	h.present("s3-base")
	if _, ok, _ := snapshotter.ReadRecords(h.db).Snapshot(ctx, "base"); !ok {
		t.Error("the S3 image's base chain went with the registry image on it")
	}
	// The other way round: a registry layer on the S3 base keeps it when
	// the S3 image goes.
	h.registry("a", "reg/on-s3-again", time.Now().Add(2*time.Hour), ours, layer{"base", 0}, layer{"reg-top2", 100 * mib})
	removed, err := h.c.Remove(ctx, []string{"s3/base"})
	if err != nil || len(removed) != 1 {
		t.Fatalf("rm s3/base: %+v, %v", removed, err)
	}
	if _, ok, _ := snapshotter.ReadRecords(h.db).Snapshot(ctx, "base"); !ok {
		t.Error("the S3 image's base chain, under a registry image's layer, was removed with the S3 image")
	}
	h.snapshotGone("s3-top")
	if im, _ := pipeline.RecordsOf(h.db).GetImage(ctx, "s3-base"); im != nil {
		t.Errorf("S3 image still recorded after rm: %+v", im)
	}
}

// TestCommittedWakesLoop: a registry image's layers land in the pool
// without a pull of ours; containerd's commit (Committed, which never
// blocks, however often it comes) makes Loop collect at once, long before
// its interval.
func TestCommittedWakesLoop(t *testing.T) {
	h := newHarness(t, 1000*mib, Options{Interval: time.Hour})
	h.registry("a", "reg/old", time.Now().Add(-time.Hour), nil, layer{"r1", 500 * mib})
	h.registry("a", "reg/new", time.Now(), nil, layer{"r2", 400 * mib}) // 90%
	ctx := h.runLoop()
	for range 10 {
		h.c.Committed(ctx, "a/2/r2", "a/3/extract-1 r2")
	}
	// The name goes first and the snapshots with containerd's collection,
	// later in the same run: wait for the run to end before looking.
	deadline := time.Now().Add(10 * time.Second)
	for h.obs.ran() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no collection 10 s after containerd's commit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.names.mu.Lock()
	removed := slices.Clone(h.names.regRemoved)
	h.names.mu.Unlock()
	if !slices.Equal(removed, []string{"a/reg/old"}) {
		t.Fatalf("removed %v, want a/reg/old", removed)
	}
	h.snapshotGone(registryKey("a", "r1"))
}

// removedKinds lists rep's removals in order as "kind:name,name".
func removedKinds(rep *Report) []string {
	var got []string
	for _, r := range rep.Removed {
		got = append(got, r.Kind+":"+strings.Join(r.Names, ","))
	}
	return got
}

// TestPreparingCollectsWhileApplying: containerd prepares a snapshot to
// apply a registry layer into (Preparing) and writes it with no lock
// held; the pool passes the high threshold meanwhile, and Loop collects
// then, before containerd's commit. The watch ends at the commit, at the
// snapshot's removal, and after ApplyWatch when neither comes.
func TestPreparingCollectsWhileApplying(t *testing.T) {
	h := newHarness(t, 1000*mib, Options{Interval: time.Hour, ApplyPoll: 10 * time.Millisecond})
	h.registry("a", "reg/old", time.Now().Add(-time.Hour), nil, layer{"r1", 500 * mib})
	ctx := h.runLoop()

	key := "a/3/extract-1 sha256:r2"
	h.add(key, "", snapshotter.SnapKindActive, map[string]string{snapshots.LabelSnapshotRef: "r2"}, 0)
	h.c.Preparing(ctx, key)
	h.waitReads(2) // watched, under the threshold: nothing to do
	if removed := h.names.removedRegistry(); len(removed) != 0 {
		t.Fatalf("removed %v at 50%%", removed)
	}
	h.write(key, 400*mib) // the layer's blocks: 90%
	deadline := time.Now().Add(10 * time.Second)
	for h.obs.ran() == 0 { // a collection done
		if time.Now().After(deadline) {
			t.Fatal("no collection 10 s after the pool passed the high threshold while containerd applied a layer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if removed := h.names.removedRegistry(); !slices.Equal(removed, []string{"a/reg/old"}) {
		t.Fatalf("removed %v, want a/reg/old", removed)
	}
	h.snapshotGone(registryKey("a", "r1"))
	h.c.Committed(ctx, "a/4/r2", key)
	h.watchEnded("the commit")

	h.c.Preparing(ctx, "a/5/extract-2 sha256:r3")
	h.waitReads(2)
	h.c.Dropped(ctx, "a/5/extract-2 sha256:r3")
	h.watchEnded("the removal")

	b := newHarness(t, 1000*mib, Options{Interval: time.Hour, ApplyPoll: 10 * time.Millisecond, ApplyWatch: 50 * time.Millisecond})
	b.runLoop()
	b.c.Preparing(ctx, "a/6/extract-3 sha256:r4")
	b.waitReads(1)
	b.watchEnded("ApplyWatch")
}

// TestApplyWatchGlances: with Options.Glance set, the watch of
// containerd's write polls with it alone while the pool is under the high
// threshold, so no poll makes the kernel commit the pool's metadata
// (Usage); once a glance is past the threshold, the collection reads Usage
// and removes what it must.
func TestApplyWatchGlances(t *testing.T) {
	var h *harness
	h = newHarness(t, 1000*mib, Options{Interval: time.Hour, ApplyPoll: 10 * time.Millisecond,
		Glance: func(ctx context.Context) (Usage, error) { return h.glance(ctx) }})
	h.registry("a", "reg/old", time.Now().Add(-time.Hour), nil, layer{"r1", 500 * mib})
	ctx := h.runLoop()
	key := "a/3/extract-1 sha256:r2"
	h.add(key, "", snapshotter.SnapKindActive, map[string]string{snapshots.LabelSnapshotRef: "r2"}, 0)
	reads := h.readCount()
	h.c.Preparing(ctx, key)
	deadline := time.Now().Add(10 * time.Second)
	for h.glanceCount() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("%d glances in 10 s of containerd's write, want 5: the watch does not poll with Glance", h.glanceCount())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := h.readCount() - reads; n != 0 {
		t.Errorf("Usage read %d times over %d polls at 50%%, want none: the polls make the kernel commit", n, h.glanceCount())
	}
	h.write(key, 400*mib) // the layer's blocks: 90%
	for h.obs.ran() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no collection 10 s after a glance showed the pool past the high threshold")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if removed := h.names.removedRegistry(); !slices.Equal(removed, []string{"a/reg/old"}) {
		t.Fatalf("removed %v, want a/reg/old", removed)
	}
	if h.readCount() == reads {
		t.Error("the collection removed an image without reading Usage")
	}
}

// runLoop runs h's Loop until the test ends, and returns its context.
func (h *harness) runLoop() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.c.Loop(ctx) }()
	h.t.Cleanup(func() { cancel(); <-done })
	return ctx
}

// glanceCount is how many times the pool's usage was glanced at so far.
func (h *harness) glanceCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.glances
}

// readCount is how many times the pool's usage was read so far.
func (h *harness) readCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reads
}

// waitReads waits until the pool's usage was read n more times.
func (h *harness) waitReads(n int) {
	h.t.Helper()
	want := h.readCount() + n
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := h.readCount()
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("usage read %d times in 10 s, want %d: containerd's write is not watched", got-want+n, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// watchEnded fails unless the pool's usage stops being read once after
// is past (the watch polls every 10 ms).
func (h *harness) watchEnded(after string) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		before := h.readCount()
		time.Sleep(100 * time.Millisecond)
		if h.readCount() == before {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("usage still read every poll 10 s after %s: the watch did not end", after)
		}
	}
}

// removedRegistry lists the registry images removed so far.
func (n *fakeNames) removedRegistry() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.regRemoved)
}

// TestDirtyOf: the page cache waiting to be written back is Dirty plus
// Writeback, in kB.
func TestDirtyOf(t *testing.T) {
	got, err := dirtyOf("MemTotal:        4028160 kB\nDirty:              2048 kB\nWriteback:           512 kB\nWritebackTmp:          0 kB\n")
	if err != nil || got != 2560<<10 {
		t.Fatalf("dirtyOf: %d, %v; want %d", got, err, 2560<<10)
	}
	if _, err := dirtyOf("Dirty: lots kB\n"); err == nil {
		t.Error("dirtyOf accepted a malformed line")
	}
	if _, err := DirtyBytes(context.Background()); err != nil {
		t.Errorf("DirtyBytes on this host: %v", err)
	}
}

// TestApplyWatchBoundsOtherWrites: while containerd applies a layer, the
// host's dirty pages count as the pool's only up to the band between the
// thresholds, so a host writing a lot elsewhere does not empty the pool
// (here 100 GiB dirty against a pool half full of 1000 MiB: nothing is
// removed); and a pool past the threshold with nothing it may remove is
// checked again only every applyStuckPolls polls, not at each.
func TestApplyWatchBoundsOtherWrites(t *testing.T) {
	h := newHarness(t, 1000*mib, Options{Interval: time.Hour, ApplyPoll: 10 * time.Millisecond,
		Pending: func(context.Context) (uint64, error) { return 100 << 30, nil }})
	h.registry("a", "reg/old", time.Now().Add(-time.Hour), nil, layer{"r1", 500 * mib})
	ctx := h.runLoop()
	h.c.Preparing(ctx, "a/3/extract-1 sha256:r2")
	h.waitReads(6) // three polls
	if removed := h.names.removedRegistry(); len(removed) != 0 {
		t.Fatalf("removed %v at 50%% with the host's dirty pages counted whole", removed)
	}

	// Past the threshold, the only image has a container: nothing to remove.
	s := newHarness(t, 1000*mib, Options{Interval: time.Hour, ApplyPoll: 10 * time.Millisecond})
	s.registry("a", "reg/used", time.Now().Add(-time.Hour), nil, layer{"u1", 900 * mib}).Containers = []string{"c1"}
	s.runLoop()
	s.c.Preparing(ctx, "a/4/extract-2 sha256:u2")
	s.waitReads(1)
	time.Sleep(200 * time.Millisecond) // 20 polls at ApplyPoll
	s.mu.Lock()
	reads := s.reads
	s.mu.Unlock()
	if reads > 6 {
		t.Errorf("usage read %d times in 200 ms past the threshold with nothing to remove, want the polls slowed to one in %d", reads, applyStuckPolls)
	}
}

// TestCollectKeepsImagePinnedBySource: [gc] pinned names an S3 image by its
// source, with or without a prefix's final '/'.
func TestCollectKeepsImagePinnedBySource(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{Pinned: []string{"s3://bucket/img1/", "s3://bucket/img2"}})
	h.image("img1", "one", layer{"c1", 300 * mib})
	h.image("img2", "two", layer{"c2", 300 * mib})
	files := h.image("img3", "three", layer{"c3", 300 * mib}) // 90.3%
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || rep.Removed[0].ImageID != "img3" {
		t.Fatalf("removed %+v, want img3 alone", rep.Removed)
	}
	h.gone("img3", "three", []string{"c3"}, files)
	h.present("img1", "img2")
	for id, want := range map[string]string{"img1": `source "s3://bucket/img1/" is in [gc] pinned`, "img2": `source "s3://bucket/img2" is in [gc] pinned`} {
		if !strings.Contains(rep.Kept[id], want) {
			t.Errorf("image %s kept because %q, want it to say %q", id, rep.Kept[id], want)
		}
	}
}

// TestCollectRemovesChainSharedByRemovedImages: one collection removing two
// images that share a chain removes the chain with the second.
func TestCollectRemovesChainSharedByRemovedImages(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{Pinned: []string{"keep"}})
	a := h.image("imgA", "a", layer{"base", 400 * mib})
	b := h.image("imgB", "b", layer{"base", 400 * mib}, layer{"b2", 100 * mib})
	h.image("imgK", "keep", layer{"k", 400 * mib}) // pinned; 90.3% in all
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 2 {
		t.Fatalf("removed %+v, want imgA and imgB", rep.Removed)
	}
	h.gone("imgA", "a", []string{"base"}, a)
	h.gone("imgB", "b", []string{"base", "b2"}, b)
	h.present("imgK")
	if got := rep.After.DataUsed; got != 401*mib {
		t.Errorf("pool data after = %d MiB, want 401 (the pinned image alone)", got/mib)
	}
}

// failedPull records what a pull of source leaves when it fails after
// unpacking its layers (its layout refused, its name taken): committed
// chains with their rows, and the image with its failure only.
func (h *harness) failedPull(id, source string, layers ...layer) {
	h.t.Helper()
	ctx := context.Background()
	prev := ""
	for i, l := range layers {
		h.add(l.chain, prev, snapshotter.SnapKindCommitted, map[string]string{pipeline.LabelSource: fmt.Sprintf("%s%d.tar", source, i+1)}, l.bytes)
		if err := pipeline.RecordsOf(h.db).StoreChain(ctx, pipeline.Chain{ChainID: l.chain, ParentChainID: prev, DiffID: "sha256:diff-" + l.chain}); err != nil {
			h.t.Fatal(err)
		}
		prev = l.chain
	}
	if err := pipeline.RecordsOf(h.db).MarkImageFailed(ctx, id, source, "activate: image layout: no etc/"); err != nil {
		h.t.Fatal(err)
	}
}

// TestCollectRemovesChainsOfNoImage: the chains a failed pull left, which
// no image names, go first when the pool is past the high threshold, but
// not while a pull is under way (it may be about to name them), and not
// one a container's snapshot is on.
func TestCollectRemovesChainsOfNoImage(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	h.failedPull("failed", "s3://bucket/distroless/", layer{"f1", 500 * mib}, layer{"f2", 300 * mib})
	h.image("img1", "one", layer{"c1", 100 * mib}) // 90.1%
	h.add("container", "f1", snapshotter.SnapKindActive, nil, 0)

	end := h.c.Begin("other")
	rep, err := h.c.Collect(ctx, "test", 0)
	end()
	if err != nil {
		t.Fatal(err)
	}
	h.snapshotPresent("f1", "f2")
	if len(rep.Removed) != 1 || rep.Removed[0].ImageID != "img1" {
		t.Fatalf("removed %+v during a pull, want img1 alone (the chains of no image wait)", rep.Removed)
	}

	h.image("img2", "two", layer{"c2", 100 * mib}) // 90.1% again
	if rep, err = h.c.Collect(ctx, "test", 0); err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 0 {
		t.Errorf("removed %+v, want no image: the failed pull's top chain frees enough", rep.Removed)
	}
	if h.obs.removed["usage"] != 1 {
		t.Errorf("observed removals %v, want img1 alone: a failed pull's chains are no image", h.obs.removed)
	}
	h.snapshotGone("f2")
	h.snapshotPresent("f1") // a container's snapshot is on it
	h.present("img2")
	if got := rep.After.DataUsed; got != 601*mib {
		t.Errorf("pool data after = %d MiB, want 601 (f1 and img2)", got/mib)
	}
	if c, _ := pipeline.RecordsOf(h.db).GetChain(ctx, "f2"); c != nil {
		t.Errorf("chain f2 still recorded")
	}
	if c, _ := pipeline.RecordsOf(h.db).GetChain(ctx, "f1"); c == nil {
		t.Errorf("chain f1, under a container's snapshot, forgotten")
	}
}

// TestRemoveTakesChainsOfItsFailedPull: rm of an image whose pull failed
// after its unpacks removes the chains that pull left, and only those.
func TestRemoveTakesChainsOfItsFailedPull(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 10000*mib, Options{})
	h.failedPull("failed", "s3://bucket/distroless/", layer{"f1", 500 * mib}, layer{"f2", 300 * mib})
	h.failedPull("other", "s3://bucket/other/", layer{"o1", 100 * mib})
	h.failedPull("near", "s3://bucket/distroless-2/", layer{"n1", 100 * mib})
	removed, err := h.c.Remove(ctx, []string{"s3://bucket/distroless"})
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0].ImageID != "failed" || removed[0].Freed != 800*mib {
		t.Errorf("removed %+v, want image failed with 800 MiB freed", removed)
	}
	// The chains are no image: the one image rm removed is counted once,
	// and the chains' space among the bytes freed.
	if h.obs.removed["rm"] != 1 || h.obs.freed != 800*mib {
		t.Errorf("observed removals %v and %d MiB freed, want one rm image and 800 MiB", h.obs.removed, h.obs.freed/mib)
	}
	h.snapshotGone("f1", "f2")
	h.snapshotPresent("o1", "n1")
}

// TestMakeRoomRefusesPullLargerThanPoolAtOnce: a pull that would not fit
// even in an empty pool is refused before any image is removed.
func TestMakeRoomRefusesPullLargerThanPoolAtOnce(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	for i := 1; i <= 4; i++ {
		h.image(fmt.Sprintf("img%d", i), fmt.Sprintf("name%d", i), layer{fmt.Sprintf("c%d", i), 150 * mib})
	}
	err := h.makeRoom(ctx, "s3://bucket/huge/", []pipeline.LayerNeed{{Position: 1, Key: "huge/1.tar", Bytes: 2000 * mib}})
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "pull s3://bucket/huge/: its layers need 2.20 GiB, more than the pool's whole data space (1000.0 MiB)") {
		t.Fatalf("MakeRoom = %v, want ErrNoRoom naming the pull, its need and the pool's size", err)
	}
	h.present("img1", "img2", "img3", "img4")
}

func (h *harness) snapshotPresent(keys ...string) {
	h.t.Helper()
	for _, k := range keys {
		if _, ok, err := snapshotter.ReadRecords(h.db).Snapshot(context.Background(), k); err != nil || !ok {
			h.t.Errorf("snapshot %s was removed (%v)", k, err)
		}
	}
}

// TestCollectCountsRepullWithoutTouch: an image whose re-pull recorded it
// (the activate run registers it, pulled_ns now) is used now, even when
// nothing touched used_ns after (the pull's client went away and its runs
// ended in the daemon): its earlier last use must not make it the least
// recently used.
func TestCollectCountsRepullWithoutTouch(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	h.image("repulled", "repulled", layer{"c1", 300 * mib})
	h.image("other", "other", layer{"c2", 300 * mib})
	old := time.Now().Add(-2 * time.Hour).UnixNano()
	if err := h.db.WithTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE s3_images SET used_ns = ?, pulled_ns = ? WHERE image_id = 'repulled'`, old, old)
		if err == nil {
			_, err = tx.ExecContext(ctx, `UPDATE s3_images SET used_ns = ?, pulled_ns = ? WHERE image_id = 'other'`, old+int64(time.Hour), old+int64(time.Hour))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The re-pull's activate run records the image again, now.
	if err := pipeline.RecordsOf(h.db).RecordPulledImage(ctx, "repulled", "s3://bucket/repulled/",
		[]pipeline.ImageLayer{{Key: "repulled/1.tar", ETag: "e", SizeBytes: 7, ChainID: "c1"}}, ""); err != nil {
		t.Fatal(err)
	}
	h.image("third", "third", layer{"c3", 300 * mib}) // 90.6%
	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || rep.Removed[0].ImageID != "other" {
		t.Fatalf("removed %+v, want other (last used an hour ago), not the image re-pulled now", rep.Removed)
	}
	h.present("repulled", "third")
}

// TestApplyWatchStopsWhenHostFilesystemIsNotTheImages: while containerd
// writes a layer, a host filesystem past the threshold for another reason
// than the images costs the one removal that shows it, as one collection
// does, not one more image at every poll of the watch.
func TestApplyWatchStopsWhenHostFilesystemIsNotTheImages(t *testing.T) {
	h := newHostHarness(t, func(Usage) uint64 { return 1800 * mib })
	h.c.opts.ApplyPoll = 10 * time.Millisecond
	h.c.opts.Interval = time.Hour
	ctx := h.runLoop()
	key := "a/3/extract-1 sha256:r2"
	h.add(key, "", snapshotter.SnapKindActive, map[string]string{snapshots.LabelSnapshotRef: "r2"}, 0)
	h.c.Preparing(ctx, key)
	time.Sleep(500 * time.Millisecond) // 50 polls
	h.c.Dropped(ctx, key)
	h.watchEnded("the removal")
	h.obs.mu.Lock()
	removed := h.obs.removed["usage"]
	h.obs.mu.Unlock()
	if removed > 1 {
		t.Fatalf("the watch of containerd's write removed %d images for a host filesystem that removing them does not free", removed)
	}
}

// TestMakeRoomWithCollectionDisabledStillRefusesWhatCannotFit: with
// collection disabled no image is removed for a pull, but a pull whose
// layers cannot fit is still refused before any device is made, and the
// pool still grows for it.
func TestMakeRoomWithCollectionDisabledStillRefusesWhatCannotFit(t *testing.T) {
	ctx := context.Background()
	var h *harness
	h = newHarness(t, 1000*mib, Options{Disabled: true, Grow: func(context.Context) (bool, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.total >= 1200*mib {
			return false, nil
		}
		h.total += 200 * mib
		return true, nil
	}})
	h.image("img1", "one", layer{"c1", 500 * mib})
	err := h.makeRoom(ctx, "s3://bucket/big/", []pipeline.LayerNeed{{Position: 1, Key: "big/1.tar", Bytes: 2000 * mib}})
	if !errors.Is(err, ErrNoRoom) {
		t.Errorf("MakeRoom of a 2000 MiB layer in a 1000 MiB pool with collection disabled: %v, want ErrNoRoom", err)
	}
	h.present("img1")
	if err := h.makeRoom(ctx, "s3://bucket/mid/", []pipeline.LayerNeed{{Position: 1, Key: "mid/1.tar", Bytes: 550 * mib}}); err != nil {
		t.Errorf("MakeRoom of a layer that fits once the pool grew, collection disabled: %v", err)
	}
	if h.total != 1200*mib {
		t.Errorf("pool %d MiB after MakeRoom with collection disabled, want grown to 1200 MiB", h.total/mib)
	}
	h.present("img1")
}

// TestMakeRoomLeavesTheReserve: a pull MakeRoom lets through must be able
// to make its devices: the pool refuses new devices under its reserve
// (pool.min_free_space), so layers that fit only into the reserve are
// refused before any download, not at the pull's next Prepare.
func TestMakeRoomLeavesTheReserve(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	const blockSectors = 128 // 64 KiB blocks
	space := func() {
		h.pool.SetSpace(thinpool.PoolStatus{BlockSizeSectors: blockSectors,
			UsedDataBlocks: h.pool.UsedSectors() / blockSectors, TotalDataBlocks: 1000 * mib / sectorBytes / blockSectors,
			UsedMetadataBlocks: 10, TotalMetadataBlocks: 1000}, 10)
	}
	space()
	h.image("img1", "one", layer{"c1", 600 * mib})
	h.add("ctr", "c1", snapshotter.SnapKindActive, nil, 0) // in use: nothing to collect
	space()
	// 300 MiB with the margin: 337.5 MiB, of 398 MiB free, 298 of them
	// above the 100 MiB reserve.
	err := h.makeRoom(ctx, "s3://bucket/img2/", []pipeline.LayerNeed{{Position: 1, Key: "img2/1.tar", Bytes: 300 * mib}})
	if errors.Is(err, ErrNoRoom) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	// The pull: its layer's extraction, then its activation.
	h.add("c2", "", snapshotter.SnapKindCommitted, nil, 300*mib+300*mib/8)
	space()
	if _, err := h.snaps.Prepare(ctx, "activation", "c2"); err != nil {
		t.Fatalf("MakeRoom let the pull through, then its next device was refused: %v", err)
	}
}

// TestRemovalRefusedHalfWayLeavesRecordsOfWhatIsLeft: a removal refused
// at a lower layer (a pull began to build on it since the image was
// checked) has removed the layers above it already: the records must not
// say those are still unpacked, and their devices are deleted.
func TestRemovalRefusedHalfWayLeavesRecordsOfWhatIsLeft(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	calls := 0
	h := newHarness(t, 1000*mib, Options{})
	h.c.opts.Guard = func(chain string) snapshotter.RemoveGuard {
		return func(ctx context.Context, tx *sql.Tx) error {
			if chain != "low" {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			if calls++; calls > 1 { // the check passes, the removal is refused
				return fmt.Errorf("remove %s: a pull under way builds on it: %w", chain, errdefs.ErrFailedPrecondition)
			}
			return nil
		}
	}
	h.image("img1", "one", layer{"low", 300 * mib}, layer{"top", 300 * mib})
	h.image("img2", "two", layer{"c2", 300 * mib})         // 90.3%
	h.add("ctr", "c2", snapshotter.SnapKindActive, nil, 0) // in use
	rep, err := h.c.Collect(ctx, "test", 0)
	if err == nil || len(rep.Removed) != 0 {
		t.Fatalf("collection: removed %+v, %v; want img1's removal refused at its lower layer", rep.Removed, err)
	}
	h.snapshotGone("top")
	if c, _ := pipeline.RecordsOf(h.db).GetChain(ctx, "top"); c != nil {
		t.Errorf("chain top is still recorded as unpacked after its snapshot was removed")
	}
	if devs, _ := snapshotter.ReadRecords(h.db).ThinDevices(ctx, snapshotter.ThinStateRemoved); len(devs) != 0 {
		t.Errorf("devices of the removed layers not deleted from the pool: %+v", devs)
	}
}

// TestImageKeptWhileItsActivationIsOpen: an S3 image's activation device
// is what an operator hands a VM, or mounts, by its path, which no record
// says. While the kernel counts an open of it, neither a collection nor
// rm removes the image, and both say why; once it is closed, rm does.
func TestImageKeptWhileItsActivationIsOpen(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	h.image("img1", "vm-disk", layer{"c1", 450 * mib})
	h.image("img2", "idle", layer{"c2", 450 * mib}) // 902 MiB: 90%
	act, ok, err := snapshotter.ReadRecords(h.db).Snapshot(ctx, pipeline.ActivationKey("img1"))
	if err != nil || !ok {
		t.Fatalf("img1's activation: %v, %v", ok, err)
	}
	h.pool.Hold(act.DeviceName)

	rep, err := h.c.Collect(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || rep.Removed[0].ImageID != "img2" {
		t.Fatalf("removed %+v, want img2 alone, the least recently used image, img1, being open", rep.Removed)
	}
	if want := "its activation's device"; !strings.Contains(rep.Kept["img1"], want) {
		t.Errorf("img1 kept because %q, want it to say %q", rep.Kept["img1"], want)
	}
	h.present("img1")

	_, err = h.c.Remove(ctx, []string{"vm-disk"})
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "is open: a VM, a mount or a process uses it") {
		t.Errorf("rm of an image whose activation is open: %v, want it refused as in use", err)
	}
	h.present("img1")

	h.pool.Release(act.DeviceName)
	if removed, err := h.c.Remove(ctx, []string{"vm-disk"}); err != nil || len(removed) != 1 {
		t.Errorf("rm once the activation is closed: %+v, %v; want img1 removed", removed, err)
	}
}

// TestMakeRoomRefusesPullLargerThanPoolAboveReserveAtOnce: the pool
// refuses new devices under its reserve, so a pull needing more than the
// pool holds above it would not fit with every image removed either: it is
// refused before any image is removed for it, as a pull larger than the
// whole pool is.
func TestMakeRoomRefusesPullLargerThanPoolAboveReserveAtOnce(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	// A pool with room for every device the test makes, and the default
	// 10% reserve (100 MiB).
	h.pool.SetSpace(thinpool.PoolStatus{BlockSizeSectors: 128, TotalDataBlocks: 1000 * mib / sectorBytes / 128,
		UsedMetadataBlocks: 10, TotalMetadataBlocks: 1000}, 10)
	for i := 1; i <= 4; i++ {
		h.image(fmt.Sprintf("img%d", i), fmt.Sprintf("name%d", i), layer{fmt.Sprintf("c%d", i), 150 * mib})
	}
	// 840 MiB with the margin: 945 MiB, under the pool's 1000 MiB but over
	// the 900 MiB above its reserve.
	err := h.makeRoom(ctx, "s3://bucket/big/", []pipeline.LayerNeed{{Position: 1, Key: "big/1.tar", Bytes: 840 * mib}})
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("MakeRoom of 945 MiB in a pool of 1000 MiB with a 100 MiB reserve: %v, want ErrNoRoom", err)
	}
	if !strings.Contains(err.Error(), "more than the pool's whole data space (1000.0 MiB) holds above its reserve of 100.0 MiB") {
		t.Errorf("MakeRoom's refusal %q does not name the pool's size and its reserve", err)
	}
	h.present("img1", "img2", "img3", "img4")
}

// TestMakeRoomDoesNotGrowFailedPool: a failed pool's status has no block
// counts (the kernel prints "Fail"), so its usage says no data space at
// all. A pull then is refused at once, saying the pool gave no size; the
// pool is not grown for it step after step up to pool.max_data_size,
// each growth reloading the table of a pool that needs repair.
func TestMakeRoomDoesNotGrowFailedPool(t *testing.T) {
	ctx := context.Background()
	grows := 0
	// fakeGrow: a growth of a loop-file pool that succeeds while the
	// failed pool's status still has no block counts, up to ten steps.
	fakeGrow := func(context.Context) (bool, error) {
		if grows == 10 {
			return false, nil
		}
		grows++
		return true, nil
	}
	h := newHarness(t, 0, Options{Grow: fakeGrow})
	err := h.makeRoom(ctx, "s3://bucket/img/", []pipeline.LayerNeed{{Position: 1, Key: "img/1.tar", Bytes: 10 * mib}})
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "no block counts") {
		t.Errorf("MakeRoom on a pool whose status has no block counts: %v, want ErrNoRoom saying so", err)
	}
	if grows != 0 {
		t.Errorf("MakeRoom grew a failed pool %d times", grows)
	}
}

// TestMakeRoomRemovesChainsOfNoImageForItsPull: the collection a pull asks
// for room with (MakeRoom, called while that pull is under way) removes
// the chains failed pulls left, which no image names: the pull asking is
// no other pull that could be about to name them. A pull that fits once
// they are gone is let through, not refused while they hold the room.
func TestMakeRoomRemovesChainsOfNoImageForItsPull(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	h.failedPull("failed", "s3://bucket/distroless/", layer{"f1", 500 * mib})
	h.image("img1", "one", layer{"c1", 200 * mib})
	h.add("container", "c1", snapshotter.SnapKindActive, nil, 0) // in use: nothing else to collect
	end := h.c.Begin("s3-new")
	defer end()
	// 300 MiB with the margin: 337.5 MiB, more than the 299 MiB free
	// with the chain of no image, less than the 799 MiB without it.
	err := h.makeRoom(ctx, "s3://bucket/new/", []pipeline.LayerNeed{{Position: 1, Key: "new/1.tar", Bytes: 300 * mib}})
	if err != nil {
		t.Fatalf("MakeRoom for the one pull under way, with 500 MiB held by the chain of no image: %v", err)
	}
	h.snapshotGone("f1")
	h.present("img1")
}

// TestPulledRemovesChainsOfNoImage: the collection after a pull (Pulled,
// called before that pull ends) removes the chains failed pulls left, as
// a collection with no pull under way does: the pull that ended recorded
// its image, so none of them is its own.
func TestPulledRemovesChainsOfNoImage(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	h.failedPull("failed", "s3://bucket/distroless/", layer{"f1", 500 * mib})
	end := h.c.Begin("img1")
	defer end()
	h.image("img1", "one", layer{"c1", 400 * mib}) // 90.1%
	h.c.Pulled(ctx, "img1")
	h.snapshotGone("f1")
	h.present("img1")
}

// TestMakeRoomCountsRoomGivenToPullsUnderWay: two pulls asking for room
// at once each fit alone but not together; the room made for the first
// is not there for the second until the first ends, or both are let
// through and their layers' writes go into the reserve and on to a full
// pool.
func TestMakeRoomCountsRoomGivenToPullsUnderWay(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	// 480 MiB with the margin: 540 MiB each, 1080 MiB together, of a
	// 1000 MiB pool.
	needs := func(id string) []pipeline.LayerNeed {
		return []pipeline.LayerNeed{{Position: 1, Key: id + "/1.tar", Bytes: 480 * mib}}
	}
	release, err := h.c.MakeRoom(ctx, "s3://bucket/a/", needs("a"))
	if err != nil {
		t.Fatalf("MakeRoom of the first pull: %v", err)
	}
	_, err = h.c.MakeRoom(ctx, "s3://bucket/b/", needs("b"))
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("MakeRoom of a second pull while the first is under way = %v; want ErrNoRoom: together they need 1080 MiB of the pool's 1000 MiB", err)
	}
	if want := "less the 540.0 MiB given to 1 other pull(s) under way"; !strings.Contains(err.Error(), want) {
		t.Errorf("MakeRoom error %q does not say %q", err, want)
	}
	// The first pull ends (its layers, had it written them, would show in
	// the pool's usage from now): its room is free again.
	release()
	release()
	release, err = h.c.MakeRoom(ctx, "s3://bucket/b/", needs("b"))
	if err != nil {
		t.Fatalf("MakeRoom of the second pull once the first ended: %v", err)
	}
	release()
}

// makeRoom is MakeRoom for a pull that ends at once: the room it was
// given is released before it returns.
func (h *harness) makeRoom(ctx context.Context, source string, needs []pipeline.LayerNeed) error {
	release, err := h.c.MakeRoom(ctx, source, needs)
	release()
	return err
}

// TestMakeRoomCountsTheLoopFilesFilesystem: a pool on loop files has the
// room its filesystem can still back, whatever the pool's own counts say
// (sparse files larger than the filesystem's free space, which logs and
// downloads fill): a pull whose layers the filesystem cannot hold is
// refused before any device, not let through to writes the loop device
// fails with EIO.
func TestMakeRoomCountsTheLoopFilesFilesystem(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	// fakeUsage: the pool's usage, its loop files' filesystem able to back
	// 200 MiB more of its data.
	fakeUsage := func(ctx context.Context) (Usage, error) {
		u, err := h.usage(ctx)
		u.Backed, u.BackingRoom = true, 200*mib
		return u, err
	}
	h.c.opts.Usage = fakeUsage
	err := h.makeRoom(ctx, "s3://bucket/img/", []pipeline.LayerNeed{{Position: 1, Key: "img/1.tar", Bytes: 300 * mib}})
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("MakeRoom of 337.5 MiB in an empty pool whose loop files' filesystem backs 200 MiB more = %v; want ErrNoRoom", err)
	}
	if want := "the filesystem under the pool's loop files can back only 200.0 MiB more"; !strings.Contains(err.Error(), want) {
		t.Errorf("MakeRoom error %q does not say %q", err, want)
	}
	if err := h.makeRoom(ctx, "s3://bucket/img/", []pipeline.LayerNeed{{Position: 1, Key: "img/1.tar", Bytes: 150 * mib}}); err != nil {
		t.Errorf("MakeRoom of 168.75 MiB the filesystem backs: %v", err)
	}
}

// TestCollectWhenTheLoopFilesFilesystemCannotBackThePool: a pool on loop
// files whose filesystem can back little more of its data (logs and other
// programs filled it) is as full as that lets it be, whatever its own
// counts say: collection removes unused images there, which gives their
// blocks back to the pool to write again, before the pool's next writes
// fail in the loop device.
func TestCollectWhenTheLoopFilesFilesystemCannotBackThePool(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, 1000*mib, Options{})
	h.image("img1", "one", layer{"c1", 100 * mib})
	h.image("img2", "two", layer{"c2", 100 * mib})
	h.image("img3", "three", layer{"c3", 100 * mib}) // 30% of the pool's own 1000 MiB
	// fakeUsage: the data file holds 301 MiB of the filesystem, which has
	// 20 MiB more to give it: a removed image's blocks stay in the file,
	// for the pool to write again.
	fakeUsage := func(ctx context.Context) (Usage, error) {
		u, err := h.usage(ctx)
		u.Backed, u.BackingRoom = true, 20*mib+(301*mib-min(u.DataUsed, 301*mib))
		return u, err
	}
	h.c.opts.Usage = fakeUsage
	rep, err := h.c.Collect(ctx, "timer", 0)
	if err != nil {
		t.Fatal(err)
	}
	// 301 MiB of the 321 MiB the filesystem backs: 93.8%, past 85%; one
	// removal brings it to 62.5%.
	if len(rep.Removed) != 1 || rep.Removed[0].ImageID != "img1" {
		t.Fatalf("collection on a pool whose loop files' filesystem backs 20 MiB more removed %+v; want img1, the least recently used", rep.Removed)
	}
	h.present("img2", "img3")
}
