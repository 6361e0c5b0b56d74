package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

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

// serveForTest serves p's control API on a socket in a temporary
// directory until the test ends, checking Serve then returns no error; it
// returns the socket's path.
func serveForTest(t *testing.T, p Puller) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, lis, p) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return sock
}

// TestClientCancelCutsThePull: the client hands progress over as the daemon
// sends it (before any result), and a caller that gives up (Ctrl-C in
// `pull`) gets its context's error back at once while the daemon sees the
// connection go and its request's context end.
func TestClientCancelCutsThePull(t *testing.T) {
	p := fakeStalledPuller{ended: make(chan error, 1)}
	sock := serveForTest(t, p)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var events []api.Event
	_, err := control.NewClient(sock).Pull(ctx, api.PullRequest{Bucket: "b", Key: "img/"}, func(e api.Event) {
		events = append(events, e)
		cancel()
	})
	if len(events) != 1 || events[0].Bytes != 1<<20 || events[0].Total != 4<<20 {
		t.Fatalf("events before the cancel = %+v, want the daemon's one progress event", events)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Pull after the caller cancelled: err %v, want context.Canceled", err)
	}
	p.waitEnded(t, "the client went away")
}

// TestDaemonStopTellsThePullToRunAgain: the daemon stops (systemctl
// restart, an upgrade) while a CLI pull streams. The pull's answer ends
// with a line telling the operator the daemon is stopping and to run the
// same pull again, rather than a stream cut short ("unexpected EOF"), and
// the daemon's pull sees its request's context end.
func TestDaemonStopTellsThePullToRunAgain(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srvCtx, stopSrv := context.WithCancel(context.Background())
	p := fakeStalledPuller{ended: make(chan error, 1)}
	served := make(chan error, 1)
	go func() { served <- Serve(srvCtx, lis, p) }()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = control.NewClient(sock).Pull(ctx, api.PullRequest{Bucket: "b", Key: "img/"}, func(api.Event) {
		go stopSrv() // the daemon is told to stop mid-pull
	})
	if serr := <-served; serr != nil {
		t.Errorf("Serve: %v", serr)
	}
	if err == nil || err.Error() != "daemon stopping: run the same pull again once it is back" {
		t.Errorf("pull across a daemon stop: %v; want the daemon's word that it stops and to run the same pull again", err)
	}
	p.waitEnded(t, "the daemon stopped serving")
}

// waitEnded waits for the daemon's pull to end with its request cancelled,
// at most 10 s after what happened.
func (p fakeStalledPuller) waitEnded(t *testing.T, after string) {
	t.Helper()
	select {
	case err := <-p.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the daemon's pull ended with %v, want its request cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the daemon's pull still runs 10s after %s", after)
	}
}

// TestCutStreamTellsThePullToRunAgain: a daemon that dies mid-pull (killed,
// crashed) cannot send a last line; the client's error then still says
// what happened and to run the same pull again.
func TestCutStreamTellsThePullToRunAgain(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(control.Line{Event: &api.Event{FSM: "download-image", State: "download", Layer: 1}})
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the connection goes without the stream's end
	})}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events := 0
	_, err = control.NewClient(sock).Pull(ctx, api.PullRequest{Bucket: "b", Key: "img/"}, func(api.Event) { events++ })
	if events != 1 || err == nil || !strings.Contains(err.Error(), "the daemon stopped or died during the pull") ||
		!strings.Contains(err.Error(), "run the same pull again once the daemon is back") {
		t.Errorf("pull cut after %d event(s): %v; want the cut stream explained and the same pull to be run again", events, err)
	}
}

// TestPermissionDeniedNamesSocketGroup: a user the socket's mode keeps out
// is told to run as root or in daemon.socket_group's group, not asked
// whether the daemon runs. As root the socket's mode does not keep anyone
// out; the CLI's test runs the client as another user instead.
func TestPermissionDeniedNamesSocketGroup(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root connects whatever the socket's mode")
	}
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if err := os.Chmod(sock, 0); err != nil {
		t.Fatal(err)
	}
	_, err = control.NewClient(sock).Activate(context.Background(), "app")
	if err == nil || !strings.Contains(err.Error(), "control socket "+sock) || !strings.Contains(err.Error(), "permission denied") ||
		!strings.Contains(err.Error(), "run as root or as a member of the group set by daemon.socket_group") ||
		strings.Contains(err.Error(), "is the daemon running?") {
		t.Errorf("activate on a socket that refuses this user: %v; want the socket, and to run as root or in daemon.socket_group", err)
	}
}

// TestWrongSocketSaysWhichSocket: the CLI pointed at the daemon's
// snapshots socket (gRPC, the one containerd uses) instead of its control
// socket is told so, not left with a malformed HTTP answer.
func TestWrongSocketSaysWhichSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "snap.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = control.NewClient(sock).Pull(ctx, api.PullRequest{Bucket: "b", Key: "img/"}, nil)
	if err == nil || !strings.Contains(err.Error(), "daemon.control_socket") {
		t.Errorf("pull on the snapshots socket: %v; want an error naming daemon.control_socket", err)
	}
}
