package server

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
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

// failingListener is a unix listener whose Accept fails, as a listener
// whose socket broke does, once fail is closed.
type failingListener struct {
	net.Listener
	fail chan struct{}
}

func (l *failingListener) Accept() (net.Conn, error) {
	type accepted struct {
		c   net.Conn
		err error
	}
	got := make(chan accepted, 1)
	go func() { c, err := l.Listener.Accept(); got <- accepted{c, err} }()
	select {
	case a := <-got:
		return a.c, a.err
	case <-l.fail:
		return nil, errors.New("accept: the socket broke")
	}
}

// TestServeReturnsAfterItsHandlersWhenItsSocketFails: a listener that
// fails ends Serve with its error, but only once the requests under way,
// which go on on their own connections, have ended: the daemon goes on
// serving containerd, and its stop closes what the handlers use once Serve
// has returned. A stop meanwhile cuts them.
func TestServeReturnsAfterItsHandlersWhenItsSocketFails(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	inner, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	lis := &failingListener{Listener: inner, fail: make(chan struct{})}
	p := &slowActivate{entered: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, lis, p) }()
	go control.NewClient(sock).Activate(context.Background(), "img")
	<-p.entered
	close(lis.fail)
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) when its listener failed, while an activate it accepted still ran", err)
	case <-time.After(500 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "the socket broke") {
			t.Fatalf("Serve over a failed listener: %v, want its error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return once stopped after its listener failed")
	}
	if !p.finished.Load() {
		t.Fatal("Serve returned while an activate it accepted still ran: the daemon would close the database and the pool under it")
	}
}

// TestDaemonStopTellsActivateToRunAgain: the daemon stops while an
// activate waits for its run (past Serve's second of grace). Its answer
// says the daemon is stopping and to run the activate again once it is
// back, as a pull's does, rather than the "context canceled" its cut
// request met, which says neither what happened nor what to do.
func TestDaemonStopTellsActivateToRunAgain(t *testing.T) {
	p := &slowActivate{entered: make(chan struct{})}
	checkStopAnswer(t, p, p.entered, "activate", func(c *control.Client) error {
		_, err := c.Activate(context.Background(), "img")
		return err
	})
}

// slowRm is slowActivate serving rm too: its Remove waits past Serve's
// second of grace, until its context is cut.
type slowRm struct{ *slowActivate }

func (s slowRm) Remove(ctx context.Context, refs []string) ([]api.Removed, error) {
	close(s.entered)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestDaemonStopTellsRmToRunAgain: as for activate, an rm the daemon's
// stop cuts is answered that the daemon stops and to run it again.
func TestDaemonStopTellsRmToRunAgain(t *testing.T) {
	p := slowRm{&slowActivate{entered: make(chan struct{})}}
	checkStopAnswer(t, p, p.entered, "rm", func(c *control.Client) error {
		_, err := c.Remove(context.Background(), []string{"img"})
		return err
	})
}

// checkStopAnswer serves p, makes the request call, stops the daemon once
// p has entered it (entered closed), and checks that the request's answer
// says the daemon stops and to run the what again.
func checkStopAnswer(t *testing.T, p Puller, entered <-chan struct{}, what string, call func(*control.Client) error) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, lis, p) }()
	answered := make(chan error, 1)
	go func() { answered <- call(control.NewClient(sock)) }()
	<-entered
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	want := "daemon stopping: run the same " + what + " again once it is back"
	select {
	case err := <-answered:
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s across a daemon stop: %v; want the daemon's word that it stops and to run the %s again", what, err, what)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the %s has no answer 10 s after the daemon stopped", what)
	}
}
