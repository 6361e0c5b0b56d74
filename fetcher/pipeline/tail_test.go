package pipeline

import (
	"os"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestPullRefusesDataAfterEndMarker: the download's in-stream validator
// refuses a layer with more zeros after its end-of-archive marker than
// tarball.MaxPadding (a small zstd object of 64 MiB of zeros), or with a
// byte that is not zero there; nothing of either is kept.
func TestPullRefusesDataAfterEndMarker(t *testing.T) {
	e := newPullEnv(t, nil)
	layer := layerTar(t, "tail", 3000)
	e.srv.Put(t, "zeros/1.tar.zst", s3test.Zstd(t, append(layer, make([]byte, 64<<20)...)))
	e.srv.Put(t, "junk/1.tar", append(append(layer, make([]byte, 4096)...), "junk"...))
	for _, key := range []string{"zeros/", "junk/"} {
		_, err := e.pull(key, "")
		if err == nil || !strings.Contains(err.Error(), "validate s3://"+e.srv.Bucket+"/"+key) || !strings.Contains(err.Error(), "data after the end-of-archive marker") {
			t.Errorf("pull %s: %v; want the trailing data refused, naming the object", key, err)
		}
	}
	if files, _ := os.ReadDir(e.p.opts.blobDir()); len(files) != 0 {
		t.Errorf("layer files left: %v", files)
	}
	if chains := e.committedChains(); len(chains) != 0 {
		t.Errorf("chains left: %v", chains)
	}
}
