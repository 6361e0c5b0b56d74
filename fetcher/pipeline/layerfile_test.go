package pipeline

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// TestUnpackRefusesLayerFileChangedOnDisk: a layer file replaced on disk
// after its download verified it (by an operator, or a disk that lost it)
// is not unpacked: the pull fails naming the file and the rule, commits no
// chain, leaves no extraction, and the next pull downloads the object again
// and unpacks what the bucket holds.
func TestUnpackRefusesLayerFileChangedOnDisk(t *testing.T) {
	e := newPullEnv(t, nil)
	good := layerTar(t, "good", 3000)
	e.srv.Put(t, "t/1.tar", good)
	// A download of an earlier pull: this pull's download finds the file
	// recorded and unpacks it without transferring the object.
	if resp, _, err := e.download("t/1.tar"); err != nil || !resp.Downloaded {
		t.Fatalf("download: %+v, %v", resp, err)
	}
	blob := e.p.blobPath(sha(good))
	var once sync.Once
	e.p.hooks = map[string]func(){"download:awaited": func() {
		once.Do(func() {
			tmp := blob + ".swap"
			if err := os.WriteFile(tmp, layerTar(t, "evil", 3000), 0o600); err != nil {
				t.Error(err)
			}
			if err := os.Rename(tmp, blob); err != nil {
				t.Error(err)
			}
		})
	}}
	_, err := e.pull("t/1.tar", "t")
	if err == nil || !strings.Contains(err.Error(), blob) || !strings.Contains(err.Error(), "changed on disk") {
		t.Fatalf("pull whose layer file was replaced: %v; want a failure naming %s and that it changed on disk", err, blob)
	}
	if chains := e.committedChains(); len(chains) != 0 {
		t.Errorf("chains committed from the replaced file: %v", chains)
	}
	e.assertNoExtraction()
	if f, err := RecordsOf(e.db).LayerFile(context.Background(), sha(good)); err != nil || f != nil {
		t.Errorf("layer record after its file was refused: %+v, %v; want it forgotten", f, err)
	}

	e.p.hooks = nil
	res, err := e.pull("t/1.tar", "t")
	if err != nil {
		t.Fatalf("pull after the refused file: %v", err)
	}
	if got := e.sn.readFile(t, res.TopChainID, "etc/marker"); got != "good" {
		t.Errorf("etc/marker of the pulled image: %q, want the bucket's %q", got, "good")
	}
}

// TestCanceledPullNotRecordedFailed: a pull whose client goes away (Ctrl-C)
// once its runs are started did not fail: `ls images` shows no failure for it, and
// the runs it started go on and record the image pulled.
func TestCanceledPullNotRecordedFailed(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "c/1.tar", layerTar(t, "c", 3000))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Canceled once all its runs are started: the activate run's first step.
	e.p.hooks = map[string]func(){"check-snapshot:started": cancel}
	if _, err := e.p.Pull(ctx, api.PullRequest{Bucket: e.srv.Bucket, Key: "c/", Ref: "c"}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("pull canceled during its activation: %v; want context.Canceled", err)
	}
	_, imageID := imageSource(e.srv.Bucket, "c/")
	if img, err := RecordsOf(e.db).GetImage(context.Background(), imageID); err != nil || (img != nil && img.FailureReason != "") {
		t.Fatalf("image record right after the canceled pull: %+v, %v; want no failure recorded", img, err)
	}
	e.waitNoLiveRun("the canceled pull")
	img, err := RecordsOf(e.db).GetImage(context.Background(), imageID)
	if err != nil || img == nil || img.FailureReason != "" {
		t.Fatalf("image record once the runs ended: %+v, %v; want it pulled, no failure", img, err)
	}
}
