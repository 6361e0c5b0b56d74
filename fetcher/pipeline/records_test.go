package pipeline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// recWorld writes what pulls leave on a real database: the pipelines'
// records through Records, the snapshots through the snapshotter's records
// (every snapshot on its own thin device), handing out thin ids.
type recWorld struct {
	t   testing.TB
	ctx context.Context
	db  *metadata.DB
	rec Records
	dev uint32 // last thin id handed out
}

func newRecWorld(t testing.TB) *recWorld {
	t.Helper()
	db := metadatatest.Open(t)
	return &recWorld{t: t, ctx: context.Background(), db: db, rec: RecordsOf(db)}
}

// pulledLayer is one layer of a test image: the object downloaded (its
// Digest the layer's diff ID; the bucket is the image's) and the chain it
// was unpacked as.
type pulledLayer struct {
	obj     Object
	chainID string
}

// layerPath is where the helpers say layer digest's file is.
func layerPath(digest string) string { return "/blobs/" + strings.TrimPrefix(digest, "sha256:") }

// recDeviceName is the dm name the helpers give thin id id.
func recDeviceName(id uint32) string { return fmt.Sprintf("pool-snap-%d", id) }

// twoLayers is a two-layer image's layers under prefix, whose bottom
// layer's content is shared with every other image built from it.
func twoLayers(prefix, top string) []pulledLayer {
	return []pulledLayer{
		{Object{Key: prefix + "1.tar", ETag: `"e1"`, SizeBytes: 1000, Digest: "sha256:d1"}, "sha256:d1"},
		{Object{Key: prefix + "2.tar", ETag: `"e-` + top + `"`, SizeBytes: 2000, Digest: "sha256:d-" + top}, "sha256:c-" + top},
	}
}

func (w *recWorld) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *recWorld) nextDev() uint32 {
	w.dev++
	return w.dev
}

// snapshot records thin device devID in state and the snapshot keyed key
// of kind on it, whose parent is the snapshot keyed parent ("" for none),
// in one transaction.
func (w *recWorld) snapshot(key, kind, parent string, devID uint32, state string) error {
	return w.db.WithTx(w.ctx, func(tx *sql.Tx) error {
		q := snapshotter.RecordsTx(tx)
		var parentID int64
		if parent != "" {
			p, ok, err := q.Snapshot(w.ctx, parent)
			if err != nil || !ok {
				return fmt.Errorf("parent snapshot %s: found %v: %w", parent, ok, err)
			}
			parentID = p.ID
		}
		now := time.Now().UnixNano()
		if err := q.InsertThinDevice(w.ctx, snapshotter.ThinDevice{ID: devID, Name: recDeviceName(devID), Role: snapshotter.ThinRoleSnapshot,
			State: state, SizeBytes: 1 << 30, FSType: "ext4", CreatedNs: now, UpdatedNs: now}); err != nil {
			return fmt.Errorf("thin device %d: %w", devID, err)
		}
		if _, err := q.InsertSnapshot(w.ctx, snapshotter.CDSnapshot{Key: key, Kind: kind, ParentID: parentID, DeviceID: devID, CreatedNs: now, UpdatedNs: now}); err != nil {
			return fmt.Errorf("snapshot %s: %w", key, err)
		}
		return nil
	})
}

// activate records image imageID's activation: an active snapshot keyed
// ActivationKey(imageID) on the committed snapshot of parentChain, on thin
// device devID.
func (w *recWorld) activate(imageID, parentChain string, devID uint32) error {
	return w.snapshot(ActivationKey(imageID), snapshotter.SnapKindActive, parentChain, devID, snapshotter.ThinStateActive)
}

// download records that object o was downloaded as the plain layer file
// of its digest.
func (w *recWorld) download(o Object) {
	w.t.Helper()
	w.must(w.rec.StoreDownload(w.ctx, o,
		LayerFile{Digest: o.Digest, Path: layerPath(o.Digest), SizeBytes: o.SizeBytes, StatSize: o.SizeBytes, StatMtimeNs: 5, StatIno: 7}))
}

// chain records chain c with its committed snapshot unless it is recorded
// already (a chain is shared by the images whose layers start alike).
func (w *recWorld) chain(c Chain) {
	w.t.Helper()
	got, err := w.rec.GetChain(w.ctx, c.ChainID)
	w.must(err)
	if got == nil {
		w.must(w.snapshot(c.ChainID, snapshotter.SnapKindCommitted, c.ParentChainID, w.nextDev(), snapshotter.ThinStateInactive))
		w.must(w.rec.StoreChain(w.ctx, c))
	}
}

// pullNoActivation records everything a pull of imageID from source
// leaves except the activation: downloads, chains and the pulled-image
// record under name.
func (w *recWorld) pullNoActivation(imageID, source, name string, layers ...pulledLayer) {
	w.t.Helper()
	bucket, _, _ := strings.Cut(strings.TrimPrefix(source, "s3://"), "/")
	var recs []ImageLayer
	parent := ""
	for _, l := range layers {
		o := l.obj
		o.Bucket = bucket
		w.download(o)
		w.chain(Chain{ChainID: l.chainID, ParentChainID: parent, DiffID: o.Digest, SizeBytes: 2 * o.SizeBytes, FileCount: 3})
		recs = append(recs, ImageLayer{Key: o.Key, ETag: o.ETag, SizeBytes: o.SizeBytes, ChainID: l.chainID})
		parent = l.chainID
	}
	w.must(w.rec.RecordPulledImage(w.ctx, imageID, source, recs, name))
}

// pull records everything a pull of imageID from source leaves,
// activation included; it returns the activation's thin id.
func (w *recWorld) pull(imageID, source, name string, layers ...pulledLayer) uint32 {
	w.t.Helper()
	w.pullNoActivation(imageID, source, name, layers...)
	id := w.nextDev()
	w.must(w.activate(imageID, layers[len(layers)-1].chainID, id))
	return id
}

// removeSnapshot deletes the snapshot record keyed key, as containerd's
// garbage collector does through the snapshotter.
func (w *recWorld) removeSnapshot(key string) {
	w.t.Helper()
	w.must(w.db.WithTx(w.ctx, func(tx *sql.Tx) error {
		_, _, found, err := snapshotter.RecordsTx(tx).RemoveSnapshot(w.ctx, key, time.Now().UnixNano())
		if err == nil && !found {
			err = fmt.Errorf("no snapshot %s", key)
		}
		return err
	}))
}

func (w *recWorld) exec(q string, args ...any) {
	w.t.Helper()
	if _, err := w.db.Statements().ExecContext(w.ctx, q, args...); err != nil {
		w.t.Fatalf("%s: %v", q, err)
	}
}

func (w *recWorld) count(table string) int {
	w.t.Helper()
	var n int
	w.must(w.db.Statements().QueryRowContext(w.ctx, `SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

// TestCompressedLayerFile: a compressed layer's file is kept by the digest
// of its bytes, and its object answers with the uncompressed tar's diff ID,
// which a plain copy of the same layer has as its digest.
func TestCompressedLayerFile(t *testing.T) {
	w := newRecWorld(t)
	ctx, db := w.ctx, w.rec
	w.download(Object{Bucket: "bkt", Key: "img/b/1.tar", ETag: `"eb"`, SizeBytes: 100, Digest: "sha256:aa"})
	// A compressed layer file: its digest keys the file, its diff ID (the
	// uncompressed tar's) is what the object's chains are named by.
	if err := db.StoreDownload(ctx, Object{Bucket: "bkt", Key: "img/c/1.tar.gz", ETag: `"ec"`, SizeBytes: 40, Digest: "sha256:gz"},
		LayerFile{Digest: "sha256:gz", DiffID: "sha256:aa", Path: layerPath("sha256:gz"), SizeBytes: 40}); err != nil {
		t.Fatal(err)
	}
	if o, _ := db.ObjectRecord(ctx, "bkt", "img/c/1.tar.gz"); o == nil || o.Digest != "sha256:gz" || o.DiffID != "sha256:aa" {
		t.Errorf("compressed object = %+v, want digest sha256:gz and diff ID sha256:aa", o)
	}
	if f, _ := db.LayerFile(ctx, "sha256:gz"); f == nil || f.DiffID != "sha256:aa" {
		t.Errorf("compressed layer file = %+v, want diff ID sha256:aa", f)
	}
	if o, _ := db.ObjectRecord(ctx, "bkt", "img/b/1.tar"); o == nil || o.DiffID != "sha256:aa" {
		t.Errorf("plain object = %+v, want its digest as diff ID", o)
	}

}

// TestStoreDownloadAndForgetLayer: a download records the object and the
// layer file; two keys with the same bytes share one layer; a later
// download of a key replaces its object; forgetLayer forgets the file and
// every object recorded as that content.
func TestStoreDownloadAndForgetLayer(t *testing.T) {
	w := newRecWorld(t)
	ctx, db := w.ctx, w.rec
	a := Object{Bucket: "bkt", Key: "img/a/1.tar", ETag: `"ea"`, SizeBytes: 100, Digest: "sha256:aa"}
	b := Object{Bucket: "bkt", Key: "img/b/1.tar", ETag: `"eb"`, SizeBytes: 100, Digest: "sha256:aa"}
	w.download(a)
	w.download(b)
	w.download(b) // repeating is harmless

	o, err := db.ObjectRecord(ctx, "bkt", "img/a/1.tar")
	if err != nil || o == nil {
		t.Fatalf("ObjectRecord(img/a/1.tar) = %v, %v", o, err)
	}
	if o.ETag != `"ea"` || o.SizeBytes != 100 || o.Digest != "sha256:aa" || o.DownloadedAt.IsZero() {
		t.Errorf("object a = %+v", o)
	}
	f, err := db.LayerFile(ctx, "sha256:aa")
	if err != nil || f == nil {
		t.Fatalf("LayerFile = %v, %v", f, err)
	}
	if f.Path != layerPath("sha256:aa") || f.SizeBytes != 100 || f.StatSize != 100 || f.StatMtimeNs != 5 || f.StatIno != 7 {
		t.Errorf("layer file = %+v", f)
	}
	if n := w.count("layers"); n != 1 {
		t.Errorf("two objects with the same content made %d layer rows, want 1", n)
	}
	if o, err := db.ObjectRecord(ctx, "bkt", "never.tar"); o != nil || err != nil {
		t.Errorf("ObjectRecord of a key never downloaded = %+v, %v; want nil, nil", o, err)
	}
	if o, err := db.ObjectRecord(ctx, "other", "img/a/1.tar"); o != nil || err != nil {
		t.Errorf("ObjectRecord of the key in another bucket = %+v, %v; want nil, nil", o, err)
	}

	// The key was overwritten in S3 and downloaded again.
	w.download(Object{Bucket: "bkt", Key: "img/a/1.tar", ETag: `"ea2"`, SizeBytes: 300, Digest: "sha256:a2"})
	if o, _ := db.ObjectRecord(ctx, "bkt", "img/a/1.tar"); o == nil || o.ETag != `"ea2"` || o.SizeBytes != 300 || o.Digest != "sha256:a2" {
		t.Errorf("object after a new download = %+v, want ETag \"ea2\", 300 bytes, sha256:a2", o)
	}

	// Bad input is refused, naming the object, and leaves nothing behind.
	err = db.StoreDownload(ctx, Object{Bucket: "bkt", Key: "x.tar", Digest: "sha256:x1"}, LayerFile{Digest: "sha256:x2", Path: "/p"})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "s3://bkt/x.tar") {
		t.Errorf("StoreDownload with two digests: err = %v, want ErrInvalidArgument naming s3://bkt/x.tar", err)
	}
	if o, _ := db.ObjectRecord(ctx, "bkt", "x.tar"); o != nil {
		t.Errorf("a refused download left an object: %+v", o)
	}

	if err := db.forgetLayer(ctx, "sha256:aa"); err != nil {
		t.Fatal(err)
	}
	if f, err := db.LayerFile(ctx, "sha256:aa"); f != nil || err != nil {
		t.Errorf("LayerFile after forgetLayer = %+v, %v", f, err)
	}
	if o, _ := db.ObjectRecord(ctx, "bkt", "img/b/1.tar"); o != nil {
		t.Errorf("object of the forgotten content survived: %+v", o)
	}
	if o, _ := db.ObjectRecord(ctx, "bkt", "img/a/1.tar"); o == nil {
		t.Errorf("object of other content was forgotten with sha256:aa")
	}
	if err := db.forgetLayer(ctx, "sha256:aa"); err != nil {
		t.Errorf("forgetLayer of an absent layer: %v", err)
	}
	files, err := db.ListLayerFiles(ctx)
	if err != nil || len(files) != 1 || files[0].Digest != "sha256:a2" {
		t.Errorf("ListLayerFiles = %v, %v; want only sha256:a2", files, err)
	}
}

// TestStoreChainGetChain: chains are read back with their parent; storing
// again refreshes the sizes only; bad input is refused.
func TestStoreChainGetChain(t *testing.T) {
	w := newRecWorld(t)
	ctx, db := w.ctx, w.rec
	w.must(db.StoreChain(ctx, Chain{ChainID: "sha256:c1", DiffID: "sha256:d1", SizeBytes: 10, FileCount: 2}))
	w.must(db.StoreChain(ctx, Chain{ChainID: "sha256:c2", ParentChainID: "sha256:c1", DiffID: "sha256:d2", SizeBytes: 20, FileCount: 4}))
	c, err := db.GetChain(ctx, "sha256:c2")
	if err != nil || c == nil {
		t.Fatalf("GetChain = %v, %v", c, err)
	}
	if c.ParentChainID != "sha256:c1" || c.DiffID != "sha256:d2" || c.SizeBytes != 20 || c.FileCount != 4 || c.UnpackedAt.IsZero() {
		t.Errorf("chain c2 = %+v", c)
	}
	if c, _ := db.GetChain(ctx, "sha256:c1"); c == nil || c.ParentChainID != "" {
		t.Errorf("first-layer chain = %+v, want no parent", c)
	}
	w.must(db.StoreChain(ctx, Chain{ChainID: "sha256:c2", ParentChainID: "sha256:other", DiffID: "sha256:other", SizeBytes: 25, FileCount: 5}))
	if c, _ := db.GetChain(ctx, "sha256:c2"); c == nil || c.SizeBytes != 25 || c.FileCount != 5 || c.ParentChainID != "sha256:c1" || c.DiffID != "sha256:d2" {
		t.Errorf("chain after storing again = %+v, want new sizes and the same parent and diff", c)
	}
	if c, err := db.GetChain(ctx, "sha256:none"); c != nil || err != nil {
		t.Errorf("GetChain of an unknown chain = %+v, %v", c, err)
	}
	for _, bad := range []Chain{{DiffID: "sha256:d"}, {ChainID: "sha256:c"}, {ChainID: "sha256:c", DiffID: "sha256:d", SizeBytes: -1}} {
		if err := db.StoreChain(ctx, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("StoreChain(%+v): err = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if n := w.count("chains"); n != 2 {
		t.Errorf("%d chain rows after refused stores, want 2", n)
	}
	w.must(db.deleteChain(ctx, "sha256:c2"))
	w.must(db.deleteChain(ctx, "sha256:c2"))
	if c, _ := db.GetChain(ctx, "sha256:c2"); c != nil {
		t.Errorf("chain survived deleteChain: %+v", c)
	}
}

// TestRecordPulledImage: a failure is recorded on an image never pulled; a
// successful pull clears it and records the layers and the name; a later
// pull replaces the layers and adds its name.
func TestRecordPulledImage(t *testing.T) {
	w := newRecWorld(t)
	ctx, db := w.ctx, w.rec
	const id, src = "s3-img", "s3://bkt/img/"
	w.must(db.MarkImageFailed(ctx, id, src, "download s3://bkt/img/2.tar: 403 Forbidden"))
	im, err := db.GetImage(ctx, id)
	if err != nil || im == nil || im.FailureReason != "download s3://bkt/img/2.tar: 403 Forbidden" || !im.PulledAt.IsZero() || im.Source != src {
		t.Fatalf("image after a failed first pull = %+v, %v", im, err)
	}
	if st, err := db.pulledImageState(ctx, id); st != nil || err != nil {
		t.Errorf("pulledImageState of a failed image = %+v, %v; want nil", st, err)
	}

	layers := []ImageLayer{
		{Key: "img/1.tar", ETag: `"e1"`, SizeBytes: 10, ChainID: "sha256:c1"},
		{Key: "img/2.tar", ETag: `"e2"`, VersionID: "v2", SizeBytes: 20, ChainID: "sha256:c2"},
	}
	w.must(db.RecordPulledImage(ctx, id, src, layers, "img:v1"))
	im, _ = db.GetImage(ctx, id)
	if im == nil || im.FailureReason != "" || im.PulledAt.IsZero() {
		t.Fatalf("image after a successful pull = %+v, want no failure and a pull time", im)
	}
	got, err := db.imageLayers(ctx, id)
	want := []ImageLayer{{1, "img/1.tar", `"e1"`, "", 10, "sha256:c1"}, {2, "img/2.tar", `"e2"`, "v2", 20, "sha256:c2"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ImageLayers = %+v, %v; want %+v", got, err, want)
	}
	if id2, _ := db.ImageIDByName(ctx, "img:v1"); id2 != id {
		t.Errorf("ImageIDByName(img:v1) = %q, want %q", id2, id)
	}

	// Re-pulled after the prefix changed: one layer now, another name.
	w.must(db.RecordPulledImage(ctx, id, src, []ImageLayer{{Key: "img/3.tar", ETag: `"e3"`, SizeBytes: 30, ChainID: "sha256:c3"}}, "img:v2"))
	got, _ = db.imageLayers(ctx, id)
	if want := []ImageLayer{{1, "img/3.tar", `"e3"`, "", 30, "sha256:c3"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("ImageLayers after a re-pull = %+v, want %+v (replaced)", got, want)
	}
	names, err := db.imageNames(ctx, id)
	if err != nil || fmt.Sprint(names) != "[img:v1 img:v2]" {
		t.Errorf("ImageNames = %v, %v; want [img:v1 img:v2]", names, err)
	}
	// A pull without a name keeps the names.
	w.must(db.RecordPulledImage(ctx, id, src, []ImageLayer{{Key: "img/3.tar", SizeBytes: 30, ChainID: "sha256:c3"}}, ""))
	if names, _ := db.imageNames(ctx, id); len(names) != 2 {
		t.Errorf("names after an unnamed pull = %v", names)
	}

	// A later failure is recorded; the image keeps its layers.
	w.must(db.MarkImageFailed(ctx, id, src, "activate: no space"))
	if im, _ := db.GetImage(ctx, id); im == nil || im.FailureReason != "activate: no space" || im.PulledAt.IsZero() {
		t.Errorf("image after a later failure = %+v", im)
	}
	if ls, _ := db.imageLayers(ctx, id); len(ls) != 1 {
		t.Errorf("a failure dropped the layers: %+v", ls)
	}

	for _, c := range []struct {
		id, src string
		layers  []ImageLayer
	}{{"", src, layers}, {id, "", layers}, {id, src, nil}} {
		if err := db.RecordPulledImage(ctx, c.id, c.src, c.layers, "x"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("RecordPulledImage(%q, %q, %d layers): err = %v, want ErrInvalidArgument", c.id, c.src, len(c.layers), err)
		}
	}
	if err := db.MarkImageFailed(ctx, "", src, "r"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("MarkImageFailed without an id: err = %v, want ErrInvalidArgument", err)
	}
	if id2, _ := db.ImageIDByName(ctx, "x"); id2 != "" {
		t.Errorf("a refused record left the name x on %q", id2)
	}
	imgs, err := db.listImages(ctx)
	if err != nil || len(imgs) != 1 {
		t.Errorf("listImages = %v, %v; want the one image", imgs, err)
	}
}

// TestAddImageNameMoves: a name names one image; giving it to another is
// refused, naming the image that has it, and moves it only when asked to
// (replace); dropping it from an image that does not have it leaves it.
func TestAddImageNameMoves(t *testing.T) {
	w := newRecWorld(t)
	ctx, db := w.ctx, w.rec
	one := []ImageLayer{{Key: "a.tar", SizeBytes: 1, ChainID: "sha256:a"}}
	w.must(db.RecordPulledImage(ctx, "s3-a", "s3://bkt/a.tar", one, "s3://bkt/a.tar"))
	w.must(db.RecordPulledImage(ctx, "s3-b", "s3://bkt/b.tar", one, "s3://bkt/b.tar"))
	w.must(db.AddImageName(ctx, "app:latest", "s3-a", false))
	w.must(db.AddImageName(ctx, "app:latest", "s3-a", false)) // again: nothing to move
	if id, _ := db.ImageIDByName(ctx, "app:latest"); id != "s3-a" {
		t.Fatalf("app:latest names %q, want s3-a", id)
	}
	err := db.AddImageName(ctx, "app:latest", "s3-b", false)
	if !errors.Is(err, errNameTaken) || !strings.Contains(err.Error(), `"app:latest" is the name of image s3-a (s3://bkt/a.tar)`) {
		t.Fatalf("giving s3-a's name to s3-b: %v; want errNameTaken naming s3-a and its source", err)
	}
	if err := db.RecordPulledImage(ctx, "s3-b", "s3://bkt/b.tar", one, "app:latest"); !errors.Is(err, errNameTaken) {
		t.Fatalf("recording s3-b under s3-a's name: %v; want errNameTaken", err)
	}
	if id, _ := db.ImageIDByName(ctx, "app:latest"); id != "s3-a" {
		t.Fatalf("app:latest names %q after the refusals, want s3-a", id)
	}
	w.must(db.dropImageName(ctx, "app:latest", "s3-b"))
	if id, _ := db.ImageIDByName(ctx, "app:latest"); id != "s3-a" {
		t.Fatalf("app:latest names %q after s3-b dropped it, want s3-a", id)
	}
	w.must(db.AddImageName(ctx, "app:latest", "s3-b", true))
	if id, _ := db.ImageIDByName(ctx, "app:latest"); id != "s3-b" {
		t.Errorf("app:latest names %q after the move, want s3-b", id)
	}
	if names, _ := db.imageNames(ctx, "s3-a"); fmt.Sprint(names) != "[s3://bkt/a.tar]" {
		t.Errorf("names of s3-a after the move = %v", names)
	}
	if names, _ := db.imageNames(ctx, "s3-b"); fmt.Sprint(names) != "[s3://bkt/b.tar app:latest]" {
		t.Errorf("names of s3-b after the move = %v", names)
	}
	if id, err := db.ImageIDByName(ctx, "nobody"); id != "" || err != nil {
		t.Errorf("ImageIDByName of an unknown name = %q, %v", id, err)
	}
	if err := db.AddImageName(ctx, "ghost:latest", "s3-none", false); err == nil {
		t.Errorf("AddImageName on an unknown image succeeded")
	}
	// Deleting an image forgets its layers and names, not its chains'
	// or objects' records.
	w.must(db.DeleteImage(ctx, "s3-b"))
	if id, _ := db.ImageIDByName(ctx, "app:latest"); id != "" {
		t.Errorf("name of a deleted image still names %q", id)
	}
	if ls, _ := db.imageLayers(ctx, "s3-b"); len(ls) != 0 {
		t.Errorf("layers of a deleted image: %+v", ls)
	}
	if im, _ := db.GetImage(ctx, "s3-b"); im != nil {
		t.Errorf("GetImage of a deleted image = %+v", im)
	}
	w.must(db.DeleteImage(ctx, "s3-b"))
}

// TestPulledImageState: the re-pull look-up returns the image's state only
// when every chain is recorded with its committed snapshot and the
// activation is an active snapshot on the top chain.
func TestPulledImageState(t *testing.T) {
	w := newRecWorld(t)
	ctx, db := w.ctx, w.rec
	actDev := w.pull("s3-full", "s3://bkt/full/", "full:latest", twoLayers("full/", "full")...)
	w.must(db.AddImageName(ctx, "full:stable", "s3-full", false))
	st, err := db.pulledImageState(ctx, "s3-full")
	if err != nil || st == nil {
		t.Fatalf("pulledImageState of a fully pulled image = %v, %v", st, err)
	}
	if st.Image.ImageID != "s3-full" || st.Image.Source != "s3://bkt/full/" || len(st.Layers) != 2 || st.Layers[1].ChainID != "sha256:c-full" ||
		fmt.Sprint(st.DiffIDs) != "[sha256:d1 sha256:d-full]" || st.ActivationDevice != recDeviceName(actDev) ||
		fmt.Sprint(st.Names) != "[full:latest full:stable]" {
		t.Errorf("state = %+v", st)
	}

	cases := map[string]func(id string){
		"no activation": func(id string) {
			w.pullNoActivation(id, "s3://bkt/"+id+"/", "", twoLayers(id+"/", id)...)
		},
		"activation on the bottom chain": func(id string) {
			w.pullNoActivation(id, "s3://bkt/"+id+"/", "", twoLayers(id+"/", id)...)
			w.must(w.activate(id, "sha256:d1", w.nextDev()))
		},
		"activation is a view": func(id string) {
			w.pullNoActivation(id, "s3://bkt/"+id+"/", "", twoLayers(id+"/", id)...)
			w.must(w.activate(id, "sha256:c-"+id, w.nextDev()))
			w.exec(`UPDATE cd_snapshots SET kind = 'view' WHERE key = ?`, ActivationKey(id))
		},
		"top chain's snapshot gone": func(id string) {
			w.pull(id, "s3://bkt/"+id+"/", "", twoLayers(id+"/", id)...)
			w.removeSnapshot(ActivationKey(id))
			w.removeSnapshot("sha256:c-" + id)
		},
		"top chain's snapshot not committed": func(id string) {
			w.pull(id, "s3://bkt/"+id+"/", "", twoLayers(id+"/", id)...)
			w.exec(`UPDATE cd_snapshots SET kind = 'active' WHERE key = ?`, "sha256:c-"+id)
		},
		"chain row missing": func(id string) {
			w.pull(id, "s3://bkt/"+id+"/", "", twoLayers(id+"/", id)...)
			w.must(db.deleteChain(ctx, "sha256:c-"+id))
		},
		"never pulled": func(id string) {
			w.must(db.MarkImageFailed(ctx, id, "s3://bkt/"+id+"/", "list: 403"))
		},
		"unknown": func(string) {},
	}
	i := 0
	for name, setup := range cases {
		i++
		id := fmt.Sprintf("s3-case%d", i)
		setup(id)
		if st, err := db.pulledImageState(ctx, id); st != nil || err != nil {
			t.Errorf("%s: pulledImageState = %+v, %v; want nil, nil", name, st, err)
		}
	}
	// The other images' changes left the full one intact.
	if st, err := db.pulledImageState(ctx, "s3-full"); st == nil || err != nil {
		t.Errorf("pulledImageState of the full image after the others = %v, %v", st, err)
	}
	// A later pull that failed (S3 unreachable, say) leaves what the
	// earlier one made usable, and says why the later one failed.
	w.pull("s3-refailed", "s3://bkt/s3-refailed/", "", twoLayers("s3-refailed/", "s3-refailed")...)
	w.must(db.MarkImageFailed(ctx, "s3-refailed", "s3://bkt/s3-refailed/", "list: 503"))
	if st, err := db.pulledImageState(ctx, "s3-refailed"); err != nil || st == nil || st.Image.FailureReason != "list: 503" {
		t.Errorf("pulledImageState after a failed re-pull = %+v, %v; want the state, with the failure", st, err)
	}
	w.must(db.clearImageFailure(ctx, "s3-refailed"))
	if im, err := db.GetImage(ctx, "s3-refailed"); err != nil || im.FailureReason != "" {
		t.Errorf("after clearImageFailure: %+v, %v", im, err)
	}
}

// TestImageIDByRef: an image is found by one of its names, or else by its
// source, a prefix with or without its final '/'.
func TestImageIDByRef(t *testing.T) {
	w := newRecWorld(t)
	ctx, db := w.ctx, w.rec
	one := []ImageLayer{{Key: "p/1.tar", SizeBytes: 1, ChainID: "sha256:a"}}
	w.must(db.RecordPulledImage(ctx, "s3-p", "s3://bkt/p/", one, "s3.local/bkt/p:latest"))
	for _, ref := range []string{"s3.local/bkt/p:latest", "s3://bkt/p/", "s3://bkt/p"} {
		if id, err := db.ImageIDByRef(ctx, ref); id != "s3-p" || err != nil {
			t.Errorf("ImageIDByRef(%q) = %q, %v; want s3-p", ref, id, err)
		}
	}
	if id, err := db.ImageIDByRef(ctx, "s3://bkt/q/"); id != "" || err != nil {
		t.Errorf("ImageIDByRef of an unknown source = %q, %v", id, err)
	}
}

// BenchmarkPulledImageState is the look-up of an idempotent re-pull ("is
// this image pulled, unpacked and activated already?"), one read
// transaction, on a database of 1000 pulled and activated images, for an
// image of one layer and one of four. Compare with package metadata's
// BenchmarkPing: it must stay within a small multiple of one round trip,
// whatever the number of layers.
func BenchmarkPulledImageState(b *testing.B) {
	w := newRecWorld(b)
	for i := range 1000 {
		diff := fmt.Sprintf("sha256:w%d", i)
		w.pull(fmt.Sprintf("s3-w%d", i), fmt.Sprintf("s3://bkt/w/%d.tar", i), "",
			pulledLayer{Object{Key: fmt.Sprintf("w/%d.tar", i), ETag: `"e"`, SizeBytes: int64(i), Digest: diff}, diff})
	}
	var deep []pulledLayer
	chain := ""
	for i := range 4 {
		diff := fmt.Sprintf("sha256:deep%d", i)
		chain = ChainID(chain, diff)
		deep = append(deep, pulledLayer{Object{Key: fmt.Sprintf("deep/%d.tar", i), ETag: `"e"`, SizeBytes: int64(i), Digest: diff}, chain})
	}
	w.pull("s3-deep", "s3://bkt/deep/", "", deep...)
	for _, c := range []struct{ name, id string }{{"1-layer", "s3-w500"}, {"4-layers", "s3-deep"}} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				st, err := w.rec.pulledImageState(w.ctx, c.id)
				if err != nil || st == nil {
					b.Fatalf("pulledImageState(%s) = %v, %v", c.id, st, err)
				}
			}
		})
	}
}
