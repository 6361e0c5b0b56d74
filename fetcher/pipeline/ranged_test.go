package pipeline

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
)

// newRangedEnv is a pull environment whose S3 source reads objects larger
// than s3source.MinPartSize as concurrent ranged parts, 2 at a time.
func newRangedEnv(t *testing.T) *env {
	return newRangedEnvConns(t, 2)
}

// newRangedEnvConns is newRangedEnv reading conns parts at a time.
func newRangedEnvConns(t *testing.T, conns int) *env {
	e := newPullEnv(t, nil)
	opts := e.options()
	opts.Sources = func(ctx context.Context, bucket string) (*s3source.Source, error) {
		return s3source.New(ctx, s3source.Config{Bucket: bucket, Region: "us-east-1", Endpoint: e.srv.URL, PathStyle: true, Anonymous: true,
			PartSize: s3source.MinPartSize, ConnectionsPerObject: conns})
	}
	opts.Snapshots, opts.ThinExists = e.sn, e.sn.ThinExists
	p, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	e.sn.attach(p)
	e.p = p
	return e
}

// partRange is the Range header of part i of an object read in parts of
// s3source.MinPartSize.
func partRange(i int) string {
	return fmt.Sprintf("bytes=%d-%d", int64(i)*s3source.MinPartSize, int64(i+1)*s3source.MinPartSize-1)
}

// TestPullResetMidPart: a connection cut in the middle of a ranged part is
// resumed from the byte reached, and the image is whole.
func TestPullResetMidPart(t *testing.T) {
	e := newRangedEnv(t)
	data := layerTar(t, "reset", 3*s3source.MinPartSize)
	e.srv.Put(t, "reset/1.tar", data)
	e.srv.Faults.DropAfter(1, "reset/1.tar", s3source.MinPartSize/2)
	res := e.mustPull("reset/", "reset")
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "reset" {
		t.Errorf("image shows marker %q, want reset", got)
	}
	if res.Layers[0].DiffID != sha(data) {
		t.Errorf("layer's diff ID %s, want %s", res.Layers[0].DiffID, sha(data))
	}
	ranged := 0
	for _, r := range e.srv.Faults.Recorded() {
		if r.Method == "GET" && strings.HasPrefix(r.Range, "bytes=") && r.Key == "reset/1.tar" {
			ranged++
		}
	}
	if ranged < 5 {
		t.Errorf("%d ranged GETs of the object, want its 4 parts and a resume", ranged)
	}
	e.assertNoExtraction()
}

// TestPullRidesOutASlowDownBurst: S3 answering SlowDown to every GET of
// a layer for two seconds in the middle of its ranged download (a fleet
// pulling one image at once) slows the download down; the parts already
// received are kept, not thrown away for a download of the object from
// its first byte again.
func TestPullRidesOutASlowDownBurst(t *testing.T) {
	e := newRangedEnvConns(t, 4)
	data := layerTar(t, "burst", 8*s3source.MinPartSize)
	e.srv.Put(t, "burst/1.tar", data)
	// Part 4 is asked for once part 0 was handed out in full: from then
	// on no GET of part 0 is due but a download's from its start.
	e.srv.Faults.BeforeGet("burst/1.tar", partRange(4), func() { e.srv.Faults.FailFor(2*time.Second, "burst/1.tar", 503, "SlowDown") })
	res := e.mustPull("burst/", "burst")
	if res.Layers[0].DiffID != sha(data) {
		t.Errorf("layer's diff ID %s, want %s", res.Layers[0].DiffID, sha(data))
	}
	first := 0
	for _, r := range e.srv.Faults.Recorded() {
		if r.Method == "GET" && r.Key == "burst/1.tar" && r.Range == partRange(0) {
			first++
		}
	}
	if first != 1 {
		t.Errorf("the layer's first part asked for %d times, want once: the download started over", first)
	}
}

// TestPullOverwrittenBetweenParts: an object overwritten in S3 between two
// of its ranged parts ends that download (the part carries the listed
// ETag), and the pull pulls the image as S3 lists it now: the image is the
// new version, whole, and nothing of the old one is recorded.
func TestPullOverwrittenBetweenParts(t *testing.T) {
	e := newRangedEnv(t)
	v1 := layerTar(t, "v1", 3*s3source.MinPartSize)
	v2 := layerTar(t, "v2", 3*s3source.MinPartSize+4096)
	e.srv.Put(t, "ow/1.tar", v1)
	e.srv.Faults.BeforeGet("ow/1.tar", partRange(2), func() { e.srv.Put(t, "ow/1.tar", v2) })
	res := e.mustPull("ow/", "ow")
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "v2" {
		t.Errorf("image shows marker %q, want v2 (the object as it is now)", got)
	}
	if res.Layers[0].DiffID != sha(v2) {
		t.Errorf("layer's diff ID %s, want the new version's %s", res.Layers[0].DiffID, sha(v2))
	}
	if o, err := RecordsOf(e.db).ObjectRecord(context.Background(), e.srv.Bucket, "ow/1.tar"); err != nil || o == nil || o.Digest != sha(v2) {
		t.Errorf("object record %+v, %v; want the new version's", o, err)
	}
	runs, err := fsm.NewSQLiteStore(e.db).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMDownload, States: []fsm.State{fsm.StateAborted}})
	if err != nil || len(runs) != 1 || runs[0].Attempts != 1 || !strings.Contains(runs[0].LastError, s3source.ErrChanged.Error()) {
		t.Errorf("aborted download runs %+v, %v; want the first version's, ended at its first attempt on the change", runs, err)
	}
	e.assertNoExtraction()
}

// TestPullRangedLayersInOrder: layers read as ranged parts transfer one
// after another in layer order, each filling the link alone, so that each
// arrives while the one below it is already in place: on a link slower
// than extraction, every layer is extracted while it downloads.
func TestPullRangedLayersInOrder(t *testing.T) {
	e := newRangedEnv(t)
	e.srv.Put(t, "seq/1.tar", layerTar(t, "q1", 3*s3source.MinPartSize))
	e.srv.Put(t, "seq/2.tar", layerTar(t, "q2", 3*s3source.MinPartSize, tarFile{name: "usr/two", body: []byte("2")}))
	e.srv.Put(t, "seq/3.tar", layerTar(t, "q3", 3*s3source.MinPartSize, tarFile{name: "usr/three", body: []byte("3")}))
	e.srv.Faults.Shape(0, 8<<20) // 8 MiB/s per answer: each layer takes a while
	w := e.watchStreams()
	// The link is slower than extraction: layer n's last part comes once
	// layer n's extraction follows its transfer (layer n-1 is in place),
	// whatever else the machine is doing meanwhile. A minute at most: a
	// pull that never starts it fails the checks below.
	for n, key := range map[int]string{2: "seq/2.tar", 3: "seq/3.tar"} {
		e.srv.Faults.BeforeGet(key, partRange(2), func() {
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				w.mu.Lock()
				started := w.started
				w.mu.Unlock()
				if started >= n {
					return
				}
			}
		})
	}
	var (
		mu        sync.Mutex
		overlaps  int // transfers that started while another was under way
		transfers int
	)
	e.p.hooks["download:started"] = func() {
		e.p.streamsMu.Lock()
		under := len(e.p.growing)
		e.p.streamsMu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		transfers++
		if under > 0 {
			overlaps++
		}
	}
	res := e.mustPull("seq/", "seq")
	e.srv.Faults.Reset()
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "usr/two") + e.sn.readFile(t, res.Snapshot.SnapshotName, "usr/three"); got != "23" {
		t.Errorf("image's usr/two and usr/three: %q, want 2 and 3", got)
	}
	runs, err := fsm.NewSQLiteStore(e.db).ListRuns(context.Background(), fsm.RunFilter{FSM: api.FSMDownload})
	if err != nil || len(runs) != 3 {
		t.Fatalf("download runs %d, %v; want 3", len(runs), err)
	}
	if transfers != 3 || overlaps != 0 {
		t.Errorf("%d transfers, %d of them started while another was under way; want 3 and 0", transfers, overlaps)
	}
	ups := e.unpackResponses()
	for i, l := range res.Layers {
		if !ups[l.ChainID].Streamed {
			t.Errorf("layer %d was not extracted while it downloaded", i+1)
		}
	}
	if w.started != 3 {
		t.Errorf("stream extractions started: %d, want 3", w.started)
	}
}

// TestPullNextRangedLayerDuringExtraction: the next ranged layer's transfer
// starts once the one below it has all its bytes, while that layer is
// still being extracted, not once its download run ends: a run followed
// by an extraction lasts as long as the extraction, and the link would
// stand idle meanwhile. Here the bottom layer's extraction waits until
// the second layer's transfer has started (or 10 s): waiting for the run
// instead would hold the second transfer back for those 10 s.
func TestPullNextRangedLayerDuringExtraction(t *testing.T) {
	e := newRangedEnv(t)
	e.srv.Put(t, "next/1.tar", layerTar(t, "n1", 3*s3source.MinPartSize))
	e.srv.Put(t, "next/2.tar", layerTar(t, "n2", 3*s3source.MinPartSize, tarFile{name: "usr/two", body: []byte("2")}))
	w := e.watchStreams()
	var (
		once          sync.Once
		secondStarted = make(chan struct{})
		transfers     atomic.Int32
		waited        time.Duration
	)
	e.p.hooks["download:started"] = func() {
		if transfers.Add(1) == 2 {
			once.Do(func() { close(secondStarted) })
		}
	}
	streamStarted := e.p.hooks["stream-extract:started"]
	var first sync.Once
	e.p.hooks["stream-extract:started"] = func() {
		streamStarted()
		first.Do(func() {
			t0 := time.Now()
			select {
			case <-secondStarted:
			case <-time.After(10 * time.Second):
			}
			waited = time.Since(t0)
		})
	}
	res := e.mustPull("next/", "next")
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "usr/two"); got != "2" {
		t.Errorf("image's usr/two: %q, want 2", got)
	}
	select {
	case <-secondStarted:
	default:
		t.Fatal("the second layer was never transferred")
	}
	if waited >= 10*time.Second {
		t.Errorf("the second layer's transfer waited for the bottom layer's extraction (%s)", waited)
	}
	ups := e.unpackResponses()
	if !ups[res.Layers[0].ChainID].Streamed {
		t.Error("the bottom layer was not extracted while it downloaded")
	}
	if w.started < 1 {
		t.Errorf("stream extractions started: %d, want at least 1", w.started)
	}
	e.assertNoExtraction()
}
