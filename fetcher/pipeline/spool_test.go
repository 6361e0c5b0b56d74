package pipeline

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// spoolWatch counts, from test points, the layers whose validation kept
// their tar stream, the extractions that read one, and the layer files
// read again by validate.
type spoolWatch struct {
	mu                         sync.Mutex
	spooling, spooled, rereads int
	// held is what SpoolBytes said when the last spooled extraction began.
	held int64
}

func (e *env) watchSpools() *spoolWatch {
	w := &spoolWatch{}
	count := func(n *int) func() {
		return func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			*n++
		}
	}
	e.p.hooks = map[string]func(){"download:spooling": count(&w.spooling), "validate:reading": count(&w.rereads), "extract:spooled": func() {
		held := e.p.SpoolBytes()
		w.mu.Lock()
		defer w.mu.Unlock()
		w.spooled++
		w.held = held
	}}
	return w
}

// assertNoSpool checks that no spool is on disk or counted.
func (e *env) assertNoSpool() {
	e.t.Helper()
	if m, _ := filepath.Glob(filepath.Join(e.p.opts.tmpDir(), "*"+spoolSuffix)); len(m) != 0 {
		e.t.Errorf("spools left on disk: %v", m)
	}
	e.p.spools.mu.Lock()
	defer e.p.spools.mu.Unlock()
	if e.p.spools.used != 0 || len(e.p.spools.byID) != 0 {
		e.t.Errorf("spools left counted: %d bytes, %d spools", e.p.spools.used, len(e.p.spools.byID))
	}
}

// waitingLayers stores a two-layer gzip image under prefix whose bottom
// layer arrives slowly, so that the top one is all in, and validated,
// before its parent chain is committed. It returns the top layer's tar.
func waitingLayers(t *testing.T, e *env, prefix string, top []byte) {
	t.Helper()
	e.srv.Put(t, prefix+"1.tar.gz", s3test.Gzip(t, layerTar(t, "w1", 200_000, tarFile{name: "etc/gone", body: []byte("x")})))
	e.srv.Put(t, prefix+"2.tar.gz", s3test.Gzip(t, top))
	e.srv.Faults.Delay(1, prefix+"1.tar.gz", time.Second)
}

// TestPullSpoolsWaitingLayer: a compressed layer that is downloaded while
// its parent is still being unpacked keeps its tar stream from the
// download's validation, and its unpack extracts that instead of
// decompressing the file again: the image is whole (its whiteout applied),
// the layer file is not read again, the spool counts its tar stream while
// it is read, and once the pull is over no spool is left on disk or
// counted.
func TestPullSpoolsWaitingLayer(t *testing.T) {
	e := newPullEnv(t, nil)
	top := layerTar(t, "w2", 300_000, tarFile{name: "usr/two", body: []byte("2")}, tarFile{name: "etc/.wh.gone"})
	waitingLayers(t, e, "w/", top)
	w := e.watchSpools()
	res := e.mustPull("w/", "w")
	if w.spooling != 1 || w.spooled != 1 || w.rereads != 0 {
		t.Errorf("spooling validations %d, spooled extractions %d, layer files read again %d; want 1, 1, 0", w.spooling, w.spooled, w.rereads)
	}
	if w.held != int64(len(top)) {
		t.Errorf("SpoolBytes while the spool was read: %d, want the top layer's %d-byte tar stream", w.held, len(top))
	}
	if want := sha(top); res.Layers[1].DiffID != want {
		t.Errorf("top layer's diff ID %s, want %s", res.Layers[1].DiffID, want)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "usr/two"); got != "2" {
		t.Errorf("image shows usr/two %q, want 2", got)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "w2" {
		t.Errorf("image shows etc/marker %q, want w2", got)
	}
	if _, err := os.Stat(e.sn.devicePath(t, res.Snapshot.SnapshotName, "etc/gone")); !os.IsNotExist(err) {
		t.Errorf("etc/gone, whited out by the spooled layer: %v, want it gone", err)
	}
	e.assertNoExtraction()
	e.assertNoSpool()
	if tmps, _ := os.ReadDir(e.p.opts.tmpDir()); len(tmps) != 0 {
		t.Errorf("temp files left: %v", tmps)
	}
}

// TestPullSpoolOverLimit: a layer whose tar stream would not fit in
// pipeline.spool_size is not spooled: its unpack decompresses the file as
// before, and nothing of the partial spool is left.
func TestPullSpoolOverLimit(t *testing.T) {
	e := newPullEnvWith(t, nil, func(o *Options) { o.SpoolSize = 64 << 10 })
	top := layerTar(t, "w2", 300_000)
	waitingLayers(t, e, "big/", top)
	w := e.watchSpools()
	res := e.mustPull("big/", "big")
	if w.spooling != 1 || w.spooled != 0 {
		t.Errorf("spooling validations %d, spooled extractions %d; want 1 and 0 (over the limit)", w.spooling, w.spooled)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "w2" {
		t.Errorf("image shows etc/marker %q, want w2", got)
	}
	e.assertNoSpool()
}

// TestPullSpoolParentRejected: when the layer below a spooled one is
// refused, the pull fails with the rule and the spool goes with it.
func TestPullSpoolParentRejected(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "rj/1.tar", layerTar(t, "r1", 400_000, tarFile{name: "dev/null", typ: tar.TypeChar}))
	e.srv.Put(t, "rj/2.tar.gz", s3test.Gzip(t, layerTar(t, "r2", 300_000)))
	e.srv.Faults.Delay(1, "rj/1.tar", time.Second)
	w := e.watchSpools()
	_, err := e.pull("rj/", "rj")
	if err == nil || !strings.Contains(err.Error(), "dev/null") {
		t.Fatalf("pull over a layer with a device node: %v, want a rejection naming dev/null", err)
	}
	if w.spooling != 1 || w.spooled != 0 {
		t.Errorf("spooling validations %d, spooled extractions %d; want 1 and 0", w.spooling, w.spooled)
	}
	if c := e.committedChains(); len(c) != 0 {
		t.Errorf("chains committed: %v", c)
	}
	e.assertNoExtraction()
	e.assertNoSpool()
}

// TestSpoolsRemovedAtStart: a spool an earlier process left (it was
// killed) is removed by start-up's sweep, before any pull could ask for
// it.
func TestSpoolsRemovedAtStart(t *testing.T) {
	e := newPullEnv(t, nil)
	stray := filepath.Join(e.p.opts.tmpDir(), "sha256:0123"+spoolSuffix)
	if err := os.WriteFile(stray, []byte("tar"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.p.Close(context.Background())
	e.reopen(nil)
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Fatalf("spool of an earlier process: %v, want it removed at start", err)
	}
}
