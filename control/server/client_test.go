package server

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
)

// fakeStalledPuller injects a daemon whose pull reports one progress event
// and then never ends: it waits for its request's context and reports on
// ended how that context ended.
type fakeStalledPuller struct{ ended chan error }

func (p fakeStalledPuller) Pull(ctx context.Context, _ api.PullRequest, progress func(api.Event)) (*api.PullResult, error) {
	progress(api.Event{FSM: "download-image", State: "download", Layer: 1, Bytes: 1 << 20, Total: 4 << 20})
	<-ctx.Done()
	p.ended <- ctx.Err()
	return nil, ctx.Err()
}

func (fakeStalledPuller) Activate(context.Context, string) (*api.ActivateResponse, error) {
	return nil, errors.New("not served")
}

// TestClientCancelCutsThePull: the client hands progress over as the daemon
// sends it (before any result), and a caller that gives up (Ctrl-C in
// `pull`) gets its context's error back at once while the daemon sees the
// connection go and its request's context end.
func TestClientCancelCutsThePull(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srvCtx, stopSrv := context.WithCancel(context.Background())
	p := fakeStalledPuller{ended: make(chan error, 1)}
	served := make(chan error, 1)
	go func() { served <- Serve(srvCtx, lis, p) }()
	defer func() {
		stopSrv()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var events []api.Event
	_, err = control.NewClient(sock).Pull(ctx, api.PullRequest{Bucket: "b", Key: "img/"}, func(e api.Event) {
		events = append(events, e)
		cancel()
	})
	if len(events) != 1 || events[0].Bytes != 1<<20 || events[0].Total != 4<<20 {
		t.Fatalf("events before the cancel = %+v, want the daemon's one progress event", events)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Pull after the caller cancelled: err %v, want context.Canceled", err)
	}
	select {
	case err := <-p.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the daemon's pull ended with %v, want its request cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the daemon's pull still runs 10s after the client went away")
	}
}
