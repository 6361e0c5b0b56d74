package inventory

import (
	"context"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// TestImageStateFailedWhateverItsActivation: an image's state is failed
// when its last pull failed (ImageStateFailed), whether the activation an
// earlier pull made is still there or not.
func TestImageStateFailedWhateverItsActivation(t *testing.T) {
	ctx, db := context.Background(), metadatatest.Open(t)
	w := seed.NewWorld(t, db)
	w.Pull("s3-a", "s3://bkt/a/", "a:latest", seed.TwoLayers("a/", "a")...)
	w.PullNoActivation("s3-b", "s3://bkt/b/", "b:latest", seed.TwoLayers("b/", "b")...)
	for _, id := range []string{"s3-a", "s3-b"} {
		w.Must(seed.MarkImageFailed(ctx, db, id, "s3://bkt/"+id[3:]+"/", "list s3://bkt: access denied"))
	}
	imgs, err := Images(ctx, db)
	if err != nil || len(imgs) != 2 {
		t.Fatalf("Images = %+v, %v", imgs, err)
	}
	for _, v := range imgs {
		if v.State != ImageStateFailed {
			t.Errorf("image %s, whose last pull failed (%q), active snapshots %d: state %s, want %s", v.ImageID, v.FailureReason, v.ActiveSnapshots, v.State, ImageStateFailed)
		}
	}
}
