// Package server serves the control API (package control) of the
// daemon's pipelines and garbage collector on a listener the daemon binds.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
)

// Puller is what the control socket serves (*pipeline.Pipelines).
type Puller interface {
	Pull(ctx context.Context, req api.PullRequest, progress func(api.Event)) (*api.PullResult, error)
	Activate(ctx context.Context, ref string) (*api.ActivateResponse, error)
}

// Remover removes pulled images (*gc.Collector). Handler serves /v1/rm when
// the Puller it is given is one too.
type Remover interface {
	Remove(ctx context.Context, refs []string) ([]api.Removed, error)
}

// Handler serves the control API of p (and /v1/rm when p is a Remover).
func Handler(p Puller) http.Handler {
	return handler(p, context.Background())
}

// handler is Handler whose pulls in flight are cut when stopping ends,
// with stopping's cause as their last line.
func handler(p Puller, stopping context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pull", func(w http.ResponseWriter, r *http.Request) { servePull(stopping, p, w, r) })
	mux.HandleFunc("POST /v1/activate", func(w http.ResponseWriter, r *http.Request) { serveActivate(p, w, r) })
	if rm, ok := p.(Remover); ok {
		mux.HandleFunc("POST /v1/rm", func(w http.ResponseWriter, r *http.Request) { serveRm(rm, w, r) })
	}
	return mux
}

func servePull(stopping context.Context, p Puller, w http.ResponseWriter, r *http.Request) {
	var req api.PullRequest
	if err := readBody(w, r, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, control.Line{Error: fmt.Sprintf("pull: request body: %v", err)})
		return
	}
	if req.Key == "" {
		writeJSON(w, http.StatusBadRequest, control.Line{Error: "pull: key is required"})
		return
	}
	if req.Ref != "" {
		if err := pipeline.CheckName(req.Ref); err != nil {
			writeJSON(w, http.StatusBadRequest, control.Line{Error: err.Error()})
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	lg := log.G(r.Context()).WithField("bucket", req.Bucket).WithField("key", req.Key).WithField("ref", req.Ref).WithField("replace", req.Replace)
	lg.Info("control: pull")
	ctx, cut := context.WithCancelCause(r.Context())
	defer cut(nil)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	// ended: the answer's last line is sent, or its client is given up.
	var ended bool
	// send writes one line, under mu. A client that takes none of it for
	// pullWriteTimeout (suspended, or never reading) is given up: its
	// answer is cut, and its pull with it, as when a client leaves (the
	// runs go on in the daemon), so that neither the pull's end nor this
	// handler waits on it.
	send := func(l control.Line) {
		if ended {
			return
		}
		_ = rc.SetWriteDeadline(time.Now().Add(pullWriteTimeout))
		err := enc.Encode(l)
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			ended = true
			if errors.Is(err, os.ErrDeadlineExceeded) {
				lg.WithError(err).WithField("timeout", pullWriteTimeout).Warn("control: pull's client takes no answer; giving it up")
				err = fmt.Errorf("control: the pull's client took no answer for %v: %w", pullWriteTimeout, err)
			} else {
				lg.WithError(err).Info("control: pull's client is gone")
				err = fmt.Errorf("control: the pull's client is gone: %w", err)
			}
			cut(err)
		}
	}
	// last sends the answer's last line, the result or the error, once:
	// the first of the pull's end and the daemon's stop writes it.
	last := func(l control.Line) {
		mu.Lock()
		defer mu.Unlock()
		send(l)
		ended = true
	}
	// A daemon that stops cuts the pull (its runs resume at the next
	// start) and tells the client why and what to do, rather than closing
	// the connection on a stream without a last line.
	stopped := context.AfterFunc(stopping, func() {
		cause := context.Cause(stopping)
		last(control.Line{Error: cause.Error()})
		cut(cause)
	})
	defer stopped()
	res, err := p.Pull(ctx, req, func(e api.Event) {
		mu.Lock()
		defer mu.Unlock()
		send(control.Line{Event: &e})
	})
	if err != nil {
		lg.WithError(err).Warn("control: pull failed")
		last(control.Line{Error: err.Error()})
		return
	}
	last(control.Line{Result: res})
}

func serveActivate(p Puller, w http.ResponseWriter, r *http.Request) {
	var req control.ActivateRequest
	if err := readBody(w, r, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, control.ActivateAnswer{Error: fmt.Sprintf("activate: request body: %v", err)})
		return
	}
	if req.Ref == "" {
		writeJSON(w, http.StatusBadRequest, control.ActivateAnswer{Error: "activate: request must name a ref"})
		return
	}
	res, err := p.Activate(r.Context(), req.Ref)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, control.ActivateAnswer{Error: stoppedAnswer(r, "activate", err)})
		return
	}
	writeJSON(w, http.StatusOK, control.ActivateAnswer{Result: res})
}

// maxBody is the largest request body: a request names one image, or a
// list of names, far below it.
const maxBody = 1 << 20

// bodyReadTimeout is how long a request's body may take to arrive once its
// head has: the CLI sends both at once, and a caller that stops half-way
// must not hold a handler until the daemon stops.
var bodyReadTimeout = 10 * time.Second

// readBody reads r's JSON body into v, all of it, within bodyReadTimeout.
// Once it is read, the connection's read deadline is lifted: the server
// goes on reading it only to see the client leave, which cancels the
// request, and a pull or an activate may take longer than the deadline.
func readBody(w http.ResponseWriter, r *http.Request, v any) error {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("not all of it arrived within %v", bodyReadTimeout)
		}
		return err
	}
	if len(raw) > maxBody {
		return fmt.Errorf("over %d bytes", maxBody)
	}
	_ = rc.SetReadDeadline(time.Time{})
	return json.NewDecoder(bytes.NewReader(raw)).Decode(v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("encoding the answer: %v", err), http.StatusInternalServerError)
		return
	}
	// With its length the answer is whole once flushed (Serve flushes it
	// as its handler returns), without the end of a chunked body, which
	// net/http writes only after the handler has returned.
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// idleTimeout is how long a connection with no request under way stays
// open: the CLI sends one request a connection, and a client that keeps
// one open and quiet must not hold it for the daemon's life.
const idleTimeout = 10 * time.Second

// pullWriteTimeout is how long a write of a pull's answer may wait on its
// client before the client is given up: long enough for a terminal's
// Ctrl-Z and fg, short enough that a client that never reads does not hold
// a handler and a descriptor for the daemon's life.
var pullWriteTimeout = time.Minute

// errDaemonStopping is the error a pull in flight is answered with, and
// its context cancelled with, when Serve stops: it tells the operator what
// to do, since the pull's runs resume when the daemon starts again.
var errDaemonStopping = errors.New("daemon stopping: run the same pull again once it is back")

// stoppedAnswer is the error answered to request r, a what ("activate",
// "rm"), that failed with err: when the daemon's stop cut it (Serve), what
// to do, as a pull is told, rather than the canceled context it met.
func stoppedAnswer(r *http.Request, what string, err error) string {
	if errors.Is(context.Cause(r.Context()), errDaemonStopping) {
		return fmt.Sprintf("daemon stopping: run the same %s again once it is back (%v)", what, err)
	}
	return err.Error()
}

// Serve answers on lis until ctx is done, then stops and removes the
// socket. A pull in flight is then answered with errDaemonStopping and its
// context cancelled with it (its state machines go on in the daemon, which
// resumes them at its next start); other requests get a second to finish,
// then are cut and answered that the daemon stops (stoppedAnswer).
func Serve(ctx context.Context, lis net.Listener, p Puller) error {
	stopping, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stop(nil)
	// Requests run on base, cut when the grace has passed; Serve returns
	// only once every handler has, since the daemon then closes what they
	// use (the pipelines, the pool, the database).
	base, cutRequests := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cutRequests(nil)
	var running handlers
	h := handler(p, stopping)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !running.begin() {
			http.Error(w, errDaemonStopping.Error(), http.StatusServiceUnavailable)
			return
		}
		defer running.wg.Done()
		h.ServeHTTP(w, r)
		// The answer reaches its connection before the handler counts as
		// ended: once every handler has, a stopping Serve closes the
		// connections, and what net/http still held would be lost.
		_ = http.NewResponseController(w).Flush()
	}), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout,
		BaseContext: func(net.Listener) context.Context { return base }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.G(ctx).WithField("socket", lis.Addr().String()).Info("serving control API")
	select {
	case <-ctx.Done():
		stop(errDaemonStopping)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		cutRequests(errDaemonStopping)
		// The requests cut answer on their connections, still open, that
		// the daemon stops (stoppedAnswer), for a second at most; then
		// the connections are closed under any handler still writing.
		ended := make(chan struct{})
		go func() { running.wait(); close(ended) }()
		answer := time.NewTimer(time.Second)
		select {
		case <-ended:
		case <-answer.C:
		}
		answer.Stop()
		_ = srv.Close()
		<-ended
		return nil
	case err := <-errc:
		// The socket failed; the daemon goes on serving containerd, and
		// the requests under way go on, on their own connections. Serve
		// still returns only once they have ended, since the daemon's stop
		// waits for it before closing what they use; a stop meanwhile cuts
		// them.
		defer context.AfterFunc(ctx, func() {
			stop(errDaemonStopping)
			cutRequests(errDaemonStopping)
		})()
		running.wait()
		_ = srv.Close()
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("control socket: %w", err)
	}
}

// handlers counts the requests being handled; once wait has begun, no
// new one starts.
type handlers struct {
	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup
}

func (h *handlers) begin() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return false
	}
	h.wg.Add(1)
	return true
}

func (h *handlers) wait() {
	h.mu.Lock()
	h.stopped = true
	h.mu.Unlock()
	h.wg.Wait()
}

func serveRm(rm Remover, w http.ResponseWriter, r *http.Request) {
	var req control.RmRequest
	if err := readBody(w, r, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, control.RmAnswer{Error: fmt.Sprintf("rm: request body: %v", err)})
		return
	}
	if len(req.Refs) == 0 {
		writeJSON(w, http.StatusBadRequest, control.RmAnswer{Error: "rm: request must name at least one image"})
		return
	}
	for _, ref := range req.Refs {
		if ref == "" {
			writeJSON(w, http.StatusBadRequest, control.RmAnswer{Error: "rm: an image name must not be empty"})
			return
		}
	}
	removed, err := rm.Remove(r.Context(), req.Refs)
	a := control.RmAnswer{Removed: removed}
	status := http.StatusOK
	if err != nil {
		log.G(r.Context()).WithError(err).WithField("refs", req.Refs).Warn("control: rm refused or failed")
		a.Error, status = stoppedAnswer(r, "rm", err), http.StatusConflict
	}
	writeJSON(w, status, a)
}
