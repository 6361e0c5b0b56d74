package control

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// TestSocketCarriesErrors serves real pipelines that have no snapshotter
// (host: no device-mapper) and checks the socket's mode and that failures
// reach the client with their reason.
func TestSocketCarriesErrors(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	db, err := metadata.Open(ctx, metadata.Options{Path: filepath.Join(dir, "m.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
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
	go func() { done <- Serve(ctx, lis, p) }()
	c := NewClient(sock)
	_, err = c.Pull(ctx, pipeline.PullRequest{Bucket: "b", Key: "img/"}, nil)
	if err == nil || !strings.Contains(err.Error(), "no snapshotter") {
		t.Errorf("pull without a snapshotter: err %v, want the daemon's reason", err)
	}
	_, err = c.Activate(ctx, "never-pulled")
	if err == nil || !strings.Contains(err.Error(), "never-pulled") {
		t.Errorf("activate of an unknown ref: err %v, want a reason naming it", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
