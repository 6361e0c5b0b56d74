// Package control is the daemon's control socket: an HTTP API over a unix
// socket that the operator CLI uses to pull, activate and remove S3 images
// (the daemon binds it, and checks its callers, in package plugin).
// Requests and answers are JSON; a pull streams JSON lines, one progress
// event per line, then one line with the result or the error.
//
//	POST /v1/pull      {"bucket","key","ref","refresh","cached","namespaces"} → {"event":{...}}... then {"result":{...}} | {"error":"..."}
//	POST /v1/activate  {"ref"}                          → {"result":{...}} | {"error":"..."}
//	POST /v1/rm        {"refs":[...]}                   → {"removed":[...],"error":"..."} (served when the Puller is a Remover)
//
// A pull without a bucket leaves it to the Puller (the daemon's default
// bucket).
package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
)

// Puller is what the control socket serves (*pipeline.Pipelines).
type Puller interface {
	Pull(ctx context.Context, req api.PullRequest, progress func(api.Event)) (*api.PullResult, error)
	Activate(ctx context.Context, ref string) (*api.ActivateResponse, error)
}

// Line is one line of a pull's answer: exactly one field is set.
type Line struct {
	Event  *api.Event      `json:"event,omitempty"`
	Result *api.PullResult `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// ActivateRequest is the body of /v1/activate.
type ActivateRequest struct {
	Ref string `json:"ref"`
}

// ActivateAnswer is the answer of /v1/activate.
type ActivateAnswer struct {
	Result *api.ActivateResponse `json:"result,omitempty"`
	Error  string                `json:"error,omitempty"`
}

// Handler serves the control API of p (and /v1/rm when p is a Remover).
func Handler(p Puller) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pull", func(w http.ResponseWriter, r *http.Request) { servePull(p, w, r) })
	mux.HandleFunc("POST /v1/activate", func(w http.ResponseWriter, r *http.Request) { serveActivate(p, w, r) })
	if rm, ok := p.(Remover); ok {
		mux.HandleFunc("POST /v1/rm", func(w http.ResponseWriter, r *http.Request) { serveRm(rm, w, r) })
	}
	return mux
}

func servePull(p Puller, w http.ResponseWriter, r *http.Request) {
	var req api.PullRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, Line{Error: fmt.Sprintf("pull: request body: %v", err)})
		return
	}
	if req.Key == "" {
		writeJSON(w, http.StatusBadRequest, Line{Error: "pull: key is required"})
		return
	}
	if req.Ref != "" {
		if err := pipeline.CheckName(req.Ref); err != nil {
			writeJSON(w, http.StatusBadRequest, Line{Error: "pull: " + err.Error()})
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	send := func(l Line) {
		mu.Lock()
		defer mu.Unlock()
		if enc.Encode(l) == nil {
			_ = rc.Flush()
		}
	}
	lg := log.G(r.Context()).WithField("bucket", req.Bucket).WithField("key", req.Key).WithField("ref", req.Ref).WithField("replace", req.Replace)
	lg.Info("control: pull")
	res, err := p.Pull(r.Context(), req, func(e api.Event) { send(Line{Event: &e}) })
	if err != nil {
		lg.WithError(err).Warn("control: pull failed")
		send(Line{Error: err.Error()})
		return
	}
	send(Line{Result: res})
}

func serveActivate(p Puller, w http.ResponseWriter, r *http.Request) {
	var req ActivateRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.Ref == "" {
		writeJSON(w, http.StatusBadRequest, ActivateAnswer{Error: fmt.Sprintf("activate: request must name a ref (%v)", err)})
		return
	}
	res, err := p.Activate(r.Context(), req.Ref)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, ActivateAnswer{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, ActivateAnswer{Result: res})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Serve answers on lis until ctx is done, then stops (in-flight pulls are
// cut; their state machines go on in the daemon) and removes the socket.
func Serve(ctx context.Context, lis net.Listener, p Puller) error {
	srv := &http.Server{Handler: Handler(p), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.G(ctx).WithField("socket", lis.Addr().String()).Info("serving control API")
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = srv.Close()
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("control socket: %w", err)
	}
}

// Client talks to a daemon's control socket. Each call is one HTTP/1.1
// exchange on a connection of its own, written and read in the caller's
// goroutine: a CLI process makes one call, so an http.Transport's
// connection pool and the goroutines it starts per connection are work
// the call would pay for and never use.
type Client struct {
	socket string
}

// NewClient returns a client of the control socket at path.
func NewClient(path string) *Client {
	return &Client{socket: path}
}

// post sends body as JSON to path on a new connection and returns the
// answer, whose body reads from that connection and closes it. ctx cuts
// the dial, the exchange and the reading of the body.
func (c *Client) post(ctx context.Context, path string, body any) (*http.Response, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://control"+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Close = true // one exchange per connection
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w (is the daemon running?)", c.socket, err)
	}
	cb := &connBody{ctx: ctx, conn: conn, stop: context.AfterFunc(ctx, func() { conn.Close() })}
	resp, err := c.exchange(req, conn)
	if err != nil {
		cb.Close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("control socket %s: %w", c.socket, cerr)
		}
		return nil, err
	}
	cb.body = resp.Body
	resp.Body = cb
	return resp, nil
}

func (c *Client) exchange(req *http.Request, conn net.Conn) (*http.Response, error) {
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("control socket %s: sending %s: %w", c.socket, req.URL.Path, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: reading the answer to %s: %w", c.socket, req.URL.Path, err)
	}
	return resp, nil
}

// connBody is an answer's body: closing it closes the connection, and a
// read cut by the caller's context reports the context's error.
type connBody struct {
	ctx  context.Context
	conn net.Conn
	stop func() bool
	body io.ReadCloser
}

// Read reads the answer; once the context has ended it reports the
// context's error, not the "use of closed network connection" that the
// context's end caused.
func (b *connBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err != nil && err != io.EOF {
		if cerr := b.ctx.Err(); cerr != nil {
			err = cerr
		}
	}
	return n, err
}

func (b *connBody) Close() error {
	b.stop()
	return b.conn.Close()
}

// Pull asks the daemon to pull req and calls onEvent for each progress
// event; it returns the result, or the daemon's error.
func (c *Client) Pull(ctx context.Context, req api.PullRequest, onEvent func(api.Event)) (*api.PullResult, error) {
	resp, err := c.post(ctx, "/v1/pull", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("control socket %s: bad answer line %q: %w", c.socket, sc.Text(), err)
		}
		switch {
		case l.Error != "":
			return nil, errors.New(l.Error)
		case l.Result != nil:
			return l.Result, nil
		case l.Event != nil && onEvent != nil:
			onEvent(*l.Event)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("control socket %s: reading the answer: %w", c.socket, err)
	}
	return nil, fmt.Errorf("control socket %s: the daemon ended the answer without a result", c.socket)
}

// Activate asks the daemon to activate the pulled image ref.
func (c *Client) Activate(ctx context.Context, ref string) (*api.ActivateResponse, error) {
	resp, err := c.post(ctx, "/v1/activate", ActivateRequest{Ref: ref})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var a ActivateAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return nil, fmt.Errorf("control socket %s: bad answer (status %s): %w", c.socket, resp.Status, err)
	}
	if a.Error != "" {
		return nil, errors.New(a.Error)
	}
	if a.Result == nil {
		return nil, fmt.Errorf("control socket %s: answer without a result (status %s)", c.socket, resp.Status)
	}
	return a.Result, nil
}
