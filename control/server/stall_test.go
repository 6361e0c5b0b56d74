package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// fakeDetachedPuller injects a daemon whose pull raises many large
// progress events and ends, as the pipelines do: they hand the events to
// progress on a goroutine of their own and, at the end, wait a grace for
// it to take the last ones, then return without waiting on a progress that
// still blocks. delivered is closed once progress has returned on every
// event.
type fakeDetachedPuller struct {
	events    int
	delivered chan struct{}
	ended     chan error
}

func (p fakeDetachedPuller) Pull(ctx context.Context, _ api.PullRequest, progress func(api.Event)) (*api.PullResult, error) {
	pad := strings.Repeat("x", 4<<10)
	go func() {
		defer close(p.delivered)
		for i := 0; i < p.events; i++ {
			progress(api.Event{FSM: "download-image", State: pad, Layer: 1, Bytes: int64(i)})
		}
	}()
	select {
	case <-p.delivered:
	case <-time.After(100 * time.Millisecond):
	}
	p.ended <- nil
	return &api.PullResult{Ref: "app"}, nil
}

func (fakeDetachedPuller) Activate(context.Context, string) (*api.ActivateResponse, error) {
	return nil, nil
}

// handlerRunning reports whether a goroutine still runs f of this package
// (a handler), from the stacks of every goroutine.
func handlerRunning(f string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), "control/server."+f+"(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitHandlerGone waits up to within for no goroutine to run f.
func waitHandlerGone(t *testing.T, f string, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for handlerRunning(f) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: its handler (%s) still runs %v later: it holds a goroutine and a descriptor until the daemon stops", what, f, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStalledPullClientIsDropped: a pull's client that stops reading its
// answer (suspended with Ctrl-Z or SIGSTOP, a script that never reads)
// fills the socket's buffers. The daemon's pull goes on and ends without
// it; the handler then gives the client up once a write has waited
// pullWriteTimeout, rather than wait on it until the daemon stops.
func TestStalledPullClientIsDropped(t *testing.T) {
	defer func(d time.Duration) { pullWriteTimeout = d }(pullWriteTimeout)
	pullWriteTimeout = 300 * time.Millisecond
	p := fakeDetachedPuller{events: 500, delivered: make(chan struct{}), ended: make(chan error, 1)}
	sock := serveForTest(t, p)

	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.UnixConn).SetReadBuffer(4 << 10)
	body := `{"bucket":"b","key":"img/"}`
	if _, err := io.WriteString(c, "POST /v1/pull HTTP/1.1\r\nHost: control\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	<-p.ended // the daemon's pull is over; its client has read nothing
	select {
	case <-p.delivered:
		t.Fatal("every event fit in the socket's buffers: the client never stalled the handler")
	default:
	}
	waitHandlerGone(t, "servePull", pullWriteTimeout+5*time.Second, "a pull whose client stopped reading")
	select {
	case <-p.delivered:
	case <-time.After(5 * time.Second):
		t.Fatal("the progress callback still blocks on a client given up")
	}
	// The client, once it reads again, finds its answer cut short, which
	// its CLI reports with what to do.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(resp.Body)
	if err == nil || strings.Contains(string(rest), `"result"`) {
		t.Errorf("the answer of a client given up: %d bytes, err %v; want it cut short, without a result", len(rest), err)
	}
}

// TestStalledRequestBodyIsDropped: a caller that sends a request's head
// and then not all of the body it announced (a hung script, a client cut
// mid-write that left its socket open) is answered 400 once
// bodyReadTimeout has passed, rather than hold a handler until the daemon
// stops.
func TestStalledRequestBodyIsDropped(t *testing.T) {
	defer func(d time.Duration) { bodyReadTimeout = d }(bodyReadTimeout)
	bodyReadTimeout = 300 * time.Millisecond
	p := fakeStalledPuller{ended: make(chan error, 1)}
	sock := serveForTest(t, p)
	for _, path := range []string{"/v1/pull", "/v1/activate"} {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: control\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"key\":"); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(bodyReadTimeout + 5*time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s with a body that never arrives: no answer within %v: %v", path, bodyReadTimeout+5*time.Second, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "request body") {
			t.Errorf("%s with a body that never arrives: %s %s, want 400 naming the request body", path, resp.Status, raw)
		}
	}
	waitHandlerGone(t, "servePull", 5*time.Second, "a pull whose body never arrived")
	waitHandlerGone(t, "serveActivate", 5*time.Second, "an activate whose body never arrived")
}
