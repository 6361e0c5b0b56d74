//go:build dm

package clients

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/containerd/ociimage"
)

// TestSharedChains: the registry's image pulled with ctr and the S3 image
// whose two lower layers are that image's layers, in one namespace, in
// both orders. Registry first: the S3 pull unpacks only its own third
// layer (containerd's two chains are used as they are) and registers. S3
// first: containerd's unpacker makes no thin device for the registry
// image (it adopts the S3 pull's chains). S3 first across two namespaces:
// the S3 pull extracts its chains once, and containerd may unpack the
// registry image again in the other namespace. Every pull succeeds and
// every name runs; removing the S3 image leaves the registry image running.
func TestSharedChains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	e := setup(t, ctx)
	img := s3Images[2] // the plain one: layers 1 and 2 are the registry image's
	s3Want := s3LayerContent + ociimage.MarkerContent

	runs := func(t *testing.T, ns, ref, id string, paths ...string) string {
		t.Helper()
		var out string
		e.timed(t, "ctr run "+ref+" in "+ns, func() error {
			var err error
			out, err = e.containerOutput(ctx, e.ctrArgv(ns, append([]string{"run", "--rm", "--snapshotter", "flyio", ref, id, "/bin/cat"}, paths...)...))
			return err
		})
		return out
	}
	ctrPull := func(t *testing.T, ns string) {
		t.Helper()
		e.pullWithCtr(t, ctx, "ctr image pull in "+ns, ns, e.imageRef)
	}
	s3Pull := func(t *testing.T, ns string, wantUnpacked int) {
		t.Helper()
		var err error
		e.timed(t, "pull "+img.source()+" in "+ns, func() error {
			r, perr := e.pullS3(ctx, img.source(), "--namespace", ns)
			if perr != nil {
				return perr
			}
			t.Logf("S3 pull in %s: %s, downloaded %d, unpacked %d, top chain %s", ns, r.Ref, r.Downloaded, r.Unpacked, r.TopChainID)
			if r.Unpacked != wantUnpacked {
				err = fmt.Errorf("S3 pull in %s unpacked %d layers, want %d", ns, r.Unpacked, wantUnpacked)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
	// devicesAround returns our pool's thin devices before and after pull.
	devicesAround := func(t *testing.T, pull func()) (before, after []string) {
		t.Helper()
		var err error
		if before, err = e.ourThinDevices(ctx); err != nil {
			t.Fatal(err)
		}
		pull()
		if after, err = e.ourThinDevices(ctx); err != nil {
			t.Fatal(err)
		}
		return before, after
	}
	emptyPool := func(t *testing.T) {
		t.Helper()
		// containerd's collector removes a parent only once its children
		// are gone, which may take it more than one pass.
		var thins []string
		for i := 0; i < 5; i++ {
			if err := e.collectGarbage(ctx); err != nil {
				t.Fatal(err)
			}
			var err error
			if thins, err = e.ourThinDevices(ctx); err != nil {
				t.Fatal(err)
			}
			if len(thins) == 0 {
				return
			}
		}
		t.Fatalf("after removing every image and collecting garbage, our pool holds %v", thins)
	}

	// removeS3ThenRegistry removes the S3 image from ns, checks that the
	// registry image, whose chains the S3 image shared, still runs (as
	// container id), then removes it too and checks that the pool is
	// left empty.
	removeS3ThenRegistry := func(t *testing.T, ns, id string) {
		t.Helper()
		if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", img.defaultRef()); err != nil {
			t.Fatal(err)
		}
		if err := e.collectGarbage(ctx); err != nil {
			t.Fatal(err)
		}
		if out := runs(t, ns, e.imageRef, id, ociimage.MarkerPath); out != ociimage.MarkerContent {
			t.Errorf("registry image, after the S3 image's removal, printed %q", out)
		}
		if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", e.imageRef); err != nil {
			t.Fatal(err)
		}
		emptyPool(t)
	}

	t.Run("registry-first", func(t *testing.T) {
		const ns = "flyio-shared-a"
		ctrPull(t, ns)
		s3Pull(t, ns, 1)
		if out := runs(t, ns, img.defaultRef(), "shared-a-s3", s3LayerPath, ociimage.MarkerPath); out != s3Want {
			t.Errorf("S3 image printed %q, want %q", out, s3Want)
		}
		if out := runs(t, ns, e.imageRef, "shared-a-reg", ociimage.MarkerPath); out != ociimage.MarkerContent {
			t.Errorf("registry image printed %q, want %q", out, ociimage.MarkerContent)
		}
		removeS3ThenRegistry(t, ns, "shared-a-reg2")
	})

	t.Run("s3-first", func(t *testing.T) {
		const ns = "flyio-shared-b"
		s3Pull(t, ns, 3)
		before, after := devicesAround(t, func() { ctrPull(t, ns) })
		if len(after) != len(before) {
			t.Errorf("containerd's unpack of chains the S3 pull made: thin devices %v, were %v (want no new one)", after, before)
		}
		if out := runs(t, ns, e.imageRef, "shared-b-reg", ociimage.MarkerPath); out != ociimage.MarkerContent {
			t.Errorf("registry image printed %q, want %q", out, ociimage.MarkerContent)
		}
		if out := runs(t, ns, img.defaultRef(), "shared-b-s3", s3LayerPath, ociimage.MarkerPath); out != s3Want {
			t.Errorf("S3 image printed %q, want %q", out, s3Want)
		}
		removeS3ThenRegistry(t, ns, "shared-b-reg2")
	})

	t.Run("s3-first-across-namespaces", func(t *testing.T) {
		// containerd keeps its snapshot records per namespace (the
		// containerd.io/namespace.shareable label shares content blobs,
		// never snapshots), so its unpacker in nsB does not see the chains
		// the S3 pull registered in nsA and prepares them again. The
		// snapshotter answers a Prepare whose target chain is committed in
		// the pool with AlreadyExists (no new device here), but containerd
		// may unpack a layer again: at most one new device per registry
		// layer, and the S3 pull's chains stay as they are.
		const nsA, nsB = "flyio-shared-c", "flyio-shared-d"
		s3Pull(t, nsA, 3)
		before, after := devicesAround(t, func() { ctrPull(t, nsB) })
		t.Logf("containerd's unpack in %s made %d thin device(s) beside the S3 pull's %d", nsB, len(after)-len(before), len(before))
		if n := len(after) - len(before); n < 0 || n > 2 {
			t.Errorf("containerd's unpack in %s: thin devices %v, were %v (want at most one new per registry layer)", nsB, after, before)
		}
		if out := runs(t, nsB, e.imageRef, "shared-d-reg", ociimage.MarkerPath); out != ociimage.MarkerContent {
			t.Errorf("registry image in %s printed %q, want %q", nsB, out, ociimage.MarkerContent)
		}
		if out := runs(t, nsA, img.defaultRef(), "shared-c-s3", s3LayerPath, ociimage.MarkerPath); out != s3Want {
			t.Errorf("S3 image in %s printed %q, want %q", nsA, out, s3Want)
		}
		for ns, ref := range map[string]string{nsA: img.defaultRef(), nsB: e.imageRef} {
			if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", ref); err != nil {
				t.Fatal(err)
			}
		}
		emptyPool(t)
	})

	var b strings.Builder
	for _, tm := range e.timings {
		fmt.Fprintf(&b, "| %s | %s |\n", tm.what, tm.took.Round(10*time.Millisecond))
	}
	t.Logf("wall times (TCG VM):\n%s", b.String())
}
