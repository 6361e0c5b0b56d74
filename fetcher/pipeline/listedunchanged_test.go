package pipeline

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
)

// TestPullChangedOnGetButListedUnchanged: an object whose every GET is
// refused as another version than the one listed (412 on If-Match: a
// replica that lags, a gateway whose GETs give other ETags than its
// listings), while listing it again gives the same ETag, is read once
// more, then fails the pull naming the object and the disagreement,
// instead of saying the object changed during the download, which the
// listing does not show.
func TestPullChangedOnGetButListedUnchanged(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "lu/1.tar", layerTar(t, "one", 300))
	e.srv.Faults.FailNext(100, "lu/1.tar", http.StatusPreconditionFailed, "PreconditionFailed")
	_, err := e.pull("lu/", "lu")
	want := S3URL(e.srv.Bucket, "lu/1.tar") + " is listed unchanged in S3 but its GET says it is another version"
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, s3source.ErrChanged) {
		t.Fatalf("pull of an image whose listed object's GETs are refused as changed: %v; want %q", err, want)
	}
	if n := e.srv.Requests(http.MethodGet, "lu/1.tar"); n != 2 {
		t.Errorf("GETs of the object: %d, want 2 (one more after listing again)", n)
	}
	if n := e.srv.Requests(http.MethodGet, ""); n != 2 {
		t.Errorf("listings: %d, want 2", n)
	}
	img, gerr := RecordsOf(e.db).GetImage(context.Background(), imageIDOf(e.srv.Bucket, "lu/"))
	if gerr != nil || img == nil || !strings.Contains(img.FailureReason, want) {
		t.Errorf("image record %+v, %v; want the failure recorded", img, gerr)
	}
	e.assertNoExtraction()
}

func imageIDOf(bucket, key string) string {
	_, id := imageSource(bucket, key)
	return id
}
