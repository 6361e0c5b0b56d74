package pipeline

import (
	"archive/tar"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// streamWatch records, from the "stream-extract:started" test point,
// whether each stream extraction began while a download was still
// transferring.
type streamWatch struct {
	mu      sync.Mutex
	started int
	overlap int // of those, the ones that began with a download in its transfer
	// validating counts downloads that checked their bytes in-stream
	// themselves, reading the layer files once more after them.
	validating, rereads int
}

func (e *env) watchStreams() *streamWatch {
	w := &streamWatch{}
	count := func(n *int) func() {
		return func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			*n++
		}
	}
	e.p.hooks = map[string]func(){"download:validating": count(&w.validating), "validate:reading": count(&w.rereads), "stream-extract:started": func() {
		runs, err := fsm.NewSQLiteStore(e.db).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMDownload, States: []fsm.State{fsm.StateRunning}})
		w.mu.Lock()
		defer w.mu.Unlock()
		w.started++
		for _, r := range runs {
			if err == nil && r.Transition == "download" {
				w.overlap++
				break
			}
		}
	}}
	return w
}

// unpackResponses are the responses of the unpack runs that completed, by
// chain.
func (e *env) unpackResponses() map[string]UnpackResponse {
	e.t.Helper()
	runs, err := fsm.NewSQLiteStore(e.db).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMUnpack, States: []fsm.State{fsm.StateComplete}})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]UnpackResponse{}
	for _, r := range runs {
		var u UnpackResponse
		if err := json.Unmarshal(r.Response, &u); err != nil {
			e.t.Fatal(err)
		}
		out[u.ChainID] = u
	}
	return out
}

// TestPullExtractsWhileDownloading: each layer whose parent chain is
// committed while it still downloads is extracted as its bytes arrive, and
// its unpack run adopts that extraction instead of extracting the file:
// the image is whole, and no extraction snapshot or mount is left. The
// bottom layer (gzip-compressed) is extracted from its first byte, and
// that extraction also names it (diff ID): its bytes are decompressed once.
// The top one (plain) starts its transfer before its parent is in place,
// so its download checks it in-stream as before.
func TestPullExtractsWhileDownloading(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "s/1.tar.gz", s3test.Gzip(t, layerTar(t, "s1", 200_000)))
	e.srv.Put(t, "s/2.tar", layerTar(t, "s2", 300_000, tarFile{name: "usr/two", body: []byte("2")}))
	// Both transfers are still under way when their parents are committed:
	// the first at once (its parent is the empty chain), the second after
	// the first layer's unpack.
	e.srv.Faults.Delay(1, "s/1.tar.gz", 300*time.Millisecond)
	e.srv.Faults.Delay(1, "s/2.tar", 1500*time.Millisecond)
	w := e.watchStreams()
	// The bottom layer's extraction is asked for before its download run
	// starts, whatever the order the runs are scheduled in.
	var unasked atomic.Int32
	e.p.hooks["download:started"] = func() {
		e.p.streamsMu.Lock()
		defer e.p.streamsMu.Unlock()
		if len(e.p.streams) == 0 {
			unasked.Add(1)
		}
	}
	res := e.mustPull("s/", "s")
	if want := sha(layerTar(t, "s1", 200_000)); res.Layers[0].DiffID != want {
		t.Errorf("bottom layer's diff ID %s, want %s (its uncompressed tar's)", res.Layers[0].DiffID, want)
	}
	if n := unasked.Load(); n != 0 {
		t.Errorf("%d download(s) started before the bottom layer's extraction was asked for", n)
	}
	if w.validating != 1 || w.rereads != 0 {
		t.Errorf("downloads validating in-stream: %d, layer files read again: %d; want 1 (the top layer) and 0", w.validating, w.rereads)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "s2" {
		t.Errorf("image shows marker %q, want s2", got)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "usr/two"); got != "2" {
		t.Errorf("image shows usr/two %q, want 2", got)
	}
	ups := e.unpackResponses()
	for i, l := range res.Layers {
		if u := ups[l.ChainID]; !u.Streamed || !u.Unpacked {
			t.Errorf("layer %d: unpack response %+v, want it unpacked from the extraction made while downloading", i+1, u)
		}
	}
	if w.started != 2 || w.overlap != 2 {
		t.Errorf("stream extractions started %d, %d of them during a transfer; want 2 and 2", w.started, w.overlap)
	}
	e.assertNoExtraction()
	if got := len(e.committedChains()); got != 2 {
		t.Errorf("%d chains committed, want 2", got)
	}
}

// TestPullRejectedWhileExtracting: a layer the policy refuses after its
// extraction began (a device node at its end) fails the pull with the
// rule, and nothing is left: no chain, no extraction snapshot, no mount
// point, no temp file, no object record.
func TestPullRejectedWhileExtracting(t *testing.T) {
	e := newPullEnv(t, nil)
	bad := layerTar(t, "b1", 400_000, tarFile{name: "dev/null", typ: tar.TypeChar})
	e.srv.Put(t, "bad/1.tar", bad)
	e.srv.Faults.Delay(1, "bad/1.tar", 300*time.Millisecond)
	w := e.watchStreams()
	_, err := e.pull("bad/", "bad")
	if err == nil || !strings.Contains(err.Error(), "dev/null") {
		t.Fatalf("pull of a layer with a device node: %v, want a rejection naming dev/null", err)
	}
	// The rejection crosses the state machine typed (the metrics' rule
	// label comes from it).
	if pe := (*tarball.PolicyError)(nil); !errors.As(err, &pe) || pe.Rule != tarball.ErrDeviceNode {
		t.Errorf("pull error %v: want a *tarball.PolicyError of rule %v in its chain", err, tarball.ErrDeviceNode)
	}
	if w.started != 1 {
		t.Fatalf("stream extractions started: %d, want 1 (the rejection must come after the extraction began)", w.started)
	}
	if c := e.committedChains(); len(c) != 0 {
		t.Errorf("chains committed: %v", c)
	}
	e.assertNoExtraction()
	e.assertNothingLeft("bad/1.tar")
}

// TestPullStreamLayoutMismatch: a layer that starts under rootfs/ and then
// leaves it is extracted with rootfs/ stripped while it downloads (its
// first entry says so), which its validation then contradicts: the unpack
// extracts the file as validated instead, and the image has the layer as
// it is.
func TestPullStreamLayoutMismatch(t *testing.T) {
	e := newPullEnv(t, nil)
	layer := buildTar(t, []tarFile{
		{name: "rootfs/", typ: tar.TypeDir}, {name: "rootfs/inside", body: []byte("in")},
		{name: "etc/", typ: tar.TypeDir}, {name: "usr/", typ: tar.TypeDir}, {name: "var/", typ: tar.TypeDir},
		{name: "etc/marker", body: []byte("m1")},
	})
	e.srv.Put(t, "mix/1.tar", layer)
	e.srv.Faults.Delay(1, "mix/1.tar", 300*time.Millisecond)
	w := e.watchStreams()
	res := e.mustPull("mix/", "mix")
	if w.started != 1 {
		t.Errorf("stream extractions started: %d, want 1", w.started)
	}
	if u := e.unpackResponses()[res.TopChainID]; u.Streamed || !u.Unpacked {
		t.Errorf("unpack response %+v, want the layer file extracted (not the stream)", u)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "rootfs/inside"); got != "in" {
		t.Errorf("image shows rootfs/inside %q, want in (the layer as it is)", got)
	}
	e.assertNoExtraction()
}

// TestPullSkipsExtractionOfLayerUnpackedUnderAnotherKey: an image whose
// layers are stored again under other keys (the same bytes, so the same
// ETag and size) is not extracted while it downloads: its downloads check
// the layers in-stream, and its unpack runs find the chains the first
// image unpacked, whatever other objects are recorded as listed alike.
// When a listing's ETag and size match a recorded object of other bytes,
// the guess is wrong: the layer is extracted from its
// file, and the image shows its own bytes.
func TestPullSkipsExtractionOfLayerUnpackedUnderAnotherKey(t *testing.T) {
	e := newPullEnv(t, nil)
	one, two := layerTar(t, "a1", 200_000), layerTar(t, "a2", 300_000, tarFile{name: "usr/two", body: []byte("2")})
	for _, prefix := range []string{"a/", "b/"} {
		e.srv.Put(t, prefix+"1.tar", one)
		e.srv.Put(t, prefix+"2.tar", two)
	}
	first := e.mustPull("a/", "a")
	chains := e.committedChains()
	// A stale record: an object z/1.tar listed with a/1.tar's ETag and
	// size, whose layer (its diff ID sorts first) has no chain. The guess
	// must look past it to a/1.tar's.
	ctx := context.Background()
	a1, err := RecordsOf(e.db).ObjectRecord(ctx, e.srv.Bucket, "a/1.tar")
	if err != nil || a1 == nil {
		t.Fatalf("a/1.tar's record: %+v, %v", a1, err)
	}
	stale := "sha256:" + strings.Repeat("0", 64)
	for _, q := range []struct {
		stmt string
		args []any
	}{
		{`INSERT INTO layers (digest, path, size_bytes, stat_size, stat_mtime_ns, stat_ino, created_ns, diff_id) VALUES (?, '/gone', ?, 0, 0, 0, 0, ?)`, []any{stale, a1.SizeBytes, stale}},
		{`INSERT INTO s3_objects (bucket, key, etag, size_bytes, digest, downloaded_ns) VALUES (?, 'z/1.tar', ?, ?, ?, 0)`, []any{e.srv.Bucket, a1.ETag, a1.SizeBytes, stale}},
	} {
		if _, err := e.db.Statements().ExecContext(ctx, q.stmt, q.args...); err != nil {
			t.Fatal(err)
		}
	}

	w := e.watchStreams()
	second := e.mustPull("b/", "b")
	if second.TopChainID != first.TopChainID {
		t.Errorf("b/ pulled as chain %s, want a/'s %s (the same layers)", second.TopChainID, first.TopChainID)
	}
	if w.started != 0 {
		t.Errorf("%d extraction(s) started while b/'s layers downloaded, want none: a/ unpacked them already", w.started)
	}
	if w.validating != 2 || w.rereads != 0 {
		t.Errorf("downloads validating in-stream: %d, layer files read again: %d; want 2 and 0", w.validating, w.rereads)
	}
	if got := e.committedChains(); !slices.Equal(got, chains) {
		t.Errorf("chains after b/'s pull %v, want a/'s %v", got, chains)
	}
	e.assertNoExtraction()

	// c/1.tar has other bytes of a/1.tar's size; a/1.tar's record is made
	// to say c/1.tar's ETag, as a server whose ETags prove nothing may.
	other := layerTar(t, "c1", 200_000)
	e.srv.Put(t, "c/1.tar", other)
	sum := md5.Sum(other)
	forged := `"` + hex.EncodeToString(sum[:]) + `"`
	if _, err := e.db.Statements().ExecContext(ctx,
		`UPDATE s3_objects SET etag = ? WHERE bucket = ? AND key = 'a/1.tar'`, forged, e.srv.Bucket); err != nil {
		t.Fatal(err)
	}
	w = e.watchStreams()
	third := e.mustPull("c/", "c")
	if w.started != 0 {
		t.Fatalf("%d extraction(s) started while c/1.tar downloaded: its listing did not match the forged record (ETag %s), so the test proves nothing", w.started, forged)
	}
	if want := sha(other); third.Layers[0].DiffID != want {
		t.Errorf("c/1.tar's diff ID %s, want %s (its own bytes')", third.Layers[0].DiffID, want)
	}
	if got := e.sn.readFile(t, third.Snapshot.SnapshotName, "etc/marker"); got != "c1" {
		t.Errorf("c/'s image shows marker %q, want c1", got)
	}
	e.assertNoExtraction()
}
