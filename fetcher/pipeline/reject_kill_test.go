package pipeline

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
)

// TestValidateRejectionKilledKeepsItsReason: a daemon killed while the
// validate step carries out a rejection (the hook never returns) resumes
// the download run at the next start, which ends it aborted at validate
// with the same reason, the rejected file and every record of it gone.
func TestValidateRejectionKilledKeepsItsReason(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, time.Minute)
	data := imageTar(t, 64<<10, 5)
	e.srv.Put(t, "changed/1.tar", data)
	path := filepath.Join(e.dir, "images", "blobs", "sha256", strings.TrimPrefix(sha(data), "sha256:"))
	release := make(chan struct{})
	defer close(release)
	killed := make(chan struct{}, 1)
	e.p.hooks = map[string]func(){
		"validate:started": func() {
			// Someone cuts the blob between download and validate: the
			// validate step rejects it.
			if err := os.WriteFile(path+".new", data[:len(data)-1024], 0o600); err != nil {
				t.Error(err)
			}
			if err := os.Rename(path+".new", path); err != nil {
				t.Error(err)
			}
		},
		"validate:rejecting": func() { killed <- struct{}{}; <-release },
	}
	obj := e.stat("changed/1.tar")
	dr := &DownloadRequest{S3Key: obj.Key, Bucket: e.srv.Bucket, Size: obj.Size, ETag: obj.ETag}
	runID, err := e.p.startDownload(ctx, objectRunID(dr), dr, fsm.WithQueue(QueueDownloads))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatal("the rejection was never reached")
	}

	// The next start: new pipelines on the same database and directory.
	p2, err := New(ctx, e.options())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p2.Close(context.Background()) })
	if err := p2.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = fsm.Await[DownloadResponse](actx, p2.m, runID)
	rec, rerr := p2.m.Run(ctx, runID)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, fsm.ErrAborted) || rec.Transition != "validate" || !strings.Contains(rec.LastError, "changed/1.tar: malformed tar") {
		t.Fatalf("resumed rejected download: err %v at %q (%s); want aborted at validate with the rejection's reason", err, rec.Transition, rec.LastError)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("rejected file still on disk (stat err %v)", err)
	}
	if f, err := RecordsOf(e.db).LayerFile(ctx, sha(data)); err != nil || f != nil {
		t.Errorf("layer row of the rejected file left: %+v, %v", f, err)
	}
	e.p = p2
	e.assertNothingLeft("changed/1.tar")
}
