package server

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
)

// slowActivate is a Puller whose Activate takes longer than Serve's
// second of grace and then, once its context is cut, still needs a
// moment to undo what it did (a transaction rolled back, a device
// deactivated) in the database and the pool.
type slowActivate struct {
	entered  chan struct{}
	finished atomic.Bool
}

func (s *slowActivate) Pull(context.Context, api.PullRequest, func(api.Event)) (*api.PullResult, error) {
	return nil, nil
}

func (s *slowActivate) Activate(ctx context.Context, ref string) (*api.ActivateResponse, error) {
	close(s.entered)
	<-ctx.Done()
	time.Sleep(200 * time.Millisecond)
	s.finished.Store(true)
	return nil, ctx.Err()
}

// TestServeReturnsAfterItsHandlers: the daemon closes the pipelines, the
// pool and the database once Serve has returned, so Serve must not return
// while a request it accepted still runs against them.
func TestServeReturnsAfterItsHandlers(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p := &slowActivate{entered: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, lis, p) }()
	go control.NewClient(sock).Activate(context.Background(), "img")
	<-p.entered
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if !p.finished.Load() {
		t.Fatal("Serve returned while an activate it accepted still ran: the daemon would close the database and the pool under it")
	}
}
