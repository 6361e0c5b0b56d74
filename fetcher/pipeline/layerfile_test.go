package pipeline

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
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
