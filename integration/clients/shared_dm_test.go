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
// image (it adopts the S3 pull's chains). Every pull succeeds and every
// name runs; removing the S3 image leaves the registry image running.
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
		e.timed(t, "ctr image pull in "+ns, func() error {
			out, err := e.ctr(ctx, ns, "image", "pull", "--snapshotter", "flyio", "--plain-http", e.imageRef)
			t.Logf("ctr image pull in %s:\n%s", ns, lastLines(out, 3))
			return err
		})
		if err := e.unpackedInFlyio(ctx, ns, e.imageRef); err != nil {
			t.Fatal(err)
		}
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
		if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", img.defaultRef()); err != nil {
			t.Fatal(err)
		}
		if err := e.collectGarbage(ctx); err != nil {
			t.Fatal(err)
		}
		if out := runs(t, ns, e.imageRef, "shared-a-reg2", ociimage.MarkerPath); out != ociimage.MarkerContent {
			t.Errorf("registry image, after the S3 image's removal, printed %q", out)
		}
		if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", e.imageRef); err != nil {
			t.Fatal(err)
		}
		emptyPool(t)
	})

	t.Run("s3-first", func(t *testing.T) {
		const ns = "flyio-shared-b"
		s3Pull(t, ns, 3)
		before, err := e.ourThinDevices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ctrPull(t, ns)
		after, err := e.ourThinDevices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(after) != len(before) {
			t.Errorf("containerd's unpack of chains the S3 pull made: thin devices %v, were %v (want no new one)", after, before)
		}
		if out := runs(t, ns, e.imageRef, "shared-b-reg", ociimage.MarkerPath); out != ociimage.MarkerContent {
			t.Errorf("registry image printed %q, want %q", out, ociimage.MarkerContent)
		}
		if out := runs(t, ns, img.defaultRef(), "shared-b-s3", s3LayerPath, ociimage.MarkerPath); out != s3Want {
			t.Errorf("S3 image printed %q, want %q", out, s3Want)
		}
		if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", img.defaultRef()); err != nil {
			t.Fatal(err)
		}
		if err := e.collectGarbage(ctx); err != nil {
			t.Fatal(err)
		}
		if out := runs(t, ns, e.imageRef, "shared-b-reg2", ociimage.MarkerPath); out != ociimage.MarkerContent {
			t.Errorf("registry image, after the S3 image's removal, printed %q", out)
		}
		if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", e.imageRef); err != nil {
			t.Fatal(err)
		}
		emptyPool(t)
	})

	var b strings.Builder
	for _, tm := range e.timings {
		fmt.Fprintf(&b, "| %s | %s |\n", tm.what, tm.took.Round(10*time.Millisecond))
	}
	t.Logf("wall times (TCG VM):\n%s", b.String())
}
