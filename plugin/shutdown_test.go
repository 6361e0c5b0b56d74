package plugin

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// TestServeStopBoundsEveryEndpoint: ServeOptions.ShutdownTimeout bounds the
// whole graceful stop (the daemon's unit gives the stop 90 s for a 30 s
// timeout, the database close and the pipelines'), and a request that an
// endpoint still serves when it has passed is cut off rather than left
// running once Serve has returned (and the daemon has closed the
// database and pool it reads).
func TestServeStopBoundsEveryEndpoint(t *testing.T) {
	const timeout = 300 * time.Millisecond
	sn := &stallingSnapshotter{Snapshotter: newNative(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(sn.release)
	socket := filepath.Join(t.TempDir(), "s.sock")
	dlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inHandler := make(chan struct{}, 1)
	handlerDone := make(chan struct{})
	stuck := make(chan struct{})
	defer close(stuck)
	debug := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handlerDone)
		inHandler <- struct{}{}
		select { // a wedged /healthz, or /debug/pprof/profile?seconds=60
		case <-stuck:
		case <-r.Context().Done():
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- Serve(ctx, sn, ServeOptions{Socket: socket, ShutdownTimeout: timeout, DebugListener: dlis, Debug: debug, Ready: func() { close(ready) }})
	}()
	<-ready
	client := DialProxy(t, socket)
	go client.Prepare(namespaces.WithNamespace(context.Background(), "default"), "inflight", "")
	<-sn.entered
	go http.Get("http://" + dlis.Addr().String() + "/healthz")
	<-inHandler

	start := time.Now()
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	took := time.Since(start)
	if took > timeout+timeout/2 {
		t.Errorf("Serve took %v to stop with ShutdownTimeout %v: the timeout does not bound the stop", took.Round(time.Millisecond), timeout)
	}
	select {
	case <-handlerDone:
	case <-time.After(time.Second):
		t.Errorf("a debug request still runs a second after Serve returned")
	}
}
