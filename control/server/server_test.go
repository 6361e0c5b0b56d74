package server

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
)

// TestSocketCarriesErrors serves real pipelines that have no snapshotter
// (host: no device-mapper) and a collector over an empty pool, and checks
// the socket's mode and that failures and refusals reach the client with
// their reason.
func TestSocketCarriesErrors(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	db := metadatatest.OpenPath(t, filepath.Join(dir, "m.db"))
	p, err := pipeline.New(ctx, pipeline.Options{DB: db, DownloadDir: filepath.Join(dir, "dl"),
		Sources: func(ctx context.Context, b string) (*s3source.Source, error) {
			return s3source.New(ctx, s3source.Config{Bucket: b})
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	sock := filepath.Join(dir, "run", "control.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	// The daemon's listener (private bind, group, mode, caller check) is
	// plugin.ListenUnix, tested there; any unix listener serves here.
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	col, err := gc.New(gc.Options{DB: db, Snapshots: fakeEmptyPool{}, Guard: pipeline.GuardChain,
		Usage: func(context.Context) (gc.Usage, error) { return gc.Usage{DataTotal: 1 << 30, MetaTotal: 1 << 20}, nil },
		Prune: func(ctx context.Context) error { _, err := p.Prune(ctx); return err }})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- Serve(ctx, lis, struct {
			*pipeline.Pipelines
			*gc.Collector
		}{p, col})
	}()
	c := control.NewClient(sock)
	_, err = c.Pull(ctx, api.PullRequest{Bucket: "b", Key: "img/"}, nil)
	if err == nil || !strings.Contains(err.Error(), "no snapshotter") {
		t.Errorf("pull without a snapshotter: err %v, want the daemon's reason", err)
	}
	_, err = c.Pull(ctx, api.PullRequest{Bucket: "b", Key: "img/", Ref: "Bad Name", Replace: true}, nil)
	if err == nil || !strings.Contains(err.Error(), `image name "Bad Name": invalid reference format`) {
		t.Errorf("pull under a name that is no reference: err %v, want the name and the rule", err)
	}
	_, err = c.Activate(ctx, "never-pulled")
	if err == nil || !strings.Contains(err.Error(), "never-pulled") {
		t.Errorf("activate of an unknown ref: err %v, want a reason naming it", err)
	}
	removed, err := c.Remove(ctx, []string{"never-pulled"})
	if len(removed) != 0 || err == nil || !strings.Contains(err.Error(), "rm never-pulled: no image pulled under that name") {
		t.Errorf("rm of a name never pulled: removed %v, err %v", removed, err)
	}
	// Malformed requests are refused with the rule they break, and the
	// client reports them as *control.RequestError (a CLI's usage error).
	var refused *control.RequestError
	if _, err := c.Remove(ctx, nil); !errors.As(err, &refused) || err.Error() != "rm: request must name at least one image" {
		t.Errorf("rm of nothing: %v, want a refusal saying it must name an image", err)
	}
	if _, err := c.Activate(ctx, ""); !errors.As(err, &refused) || err.Error() != "activate: request must name a ref" {
		t.Errorf("activate of an empty ref: %v, want a refusal saying it must name a ref", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
