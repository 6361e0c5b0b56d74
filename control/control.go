// Package control is the protocol of the daemon's control socket, an HTTP
// API over a unix socket through which the operator CLI pulls, activates
// and removes S3 images, and its client. The daemon serves it with
// control/server and binds the socket, checking its callers, in package
// plugin. Requests and answers are JSON; a pull streams JSON lines, one
// progress event per line, then one line with the result or the error.
//
//	POST /v1/pull      {"bucket","key","ref","refresh","cached","namespaces"} → {"event":{...}}... then {"result":{...}} | {"error":"..."}
//	POST /v1/activate  {"ref"}                          → {"result":{...}} | {"error":"..."}
//	POST /v1/rm        {"refs":[...]}                   → {"removed":[...],"error":"..."} (served when the daemon collects garbage)
//
// A pull's client that leaves (Ctrl-C) cancels its pull: the call ends,
// while the pull's Download, Unpack and Activate runs go on in the daemon
// and record the image when they end; the same pull run again picks them
// up. A client that takes none of its answer for a minute (suspended with
// Ctrl-Z or SIGSTOP, a script that never reads) is given up the same way,
// its answer cut without a last line, so that it holds nothing in the
// daemon.
//
// A pull without a bucket leaves it to the daemon (its default bucket). A
// request the daemon refuses as malformed is answered with status 400, and
// the client's error is then a *RequestError.
//
// The package links only the standard library, go-toml and package api,
// so that a client built on it starts fast.
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
	"syscall"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

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
		return nil, fmt.Errorf("control socket %s: %w (%s)", c.socket, err, dialHint(err))
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

// dialHint is what the operator can do about a failed dial: a refused
// permission means the socket's mode (0660, group daemon.socket_group)
// keeps the caller out, whether or not the daemon runs.
func dialHint(err error) string {
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		return "the socket lets in only root and its group: run as root or as a member of the group set by daemon.socket_group"
	}
	return "is the daemon running?"
}

func (c *Client) exchange(req *http.Request, conn net.Conn) (*http.Response, error) {
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("control socket %s: sending %s: %w", c.socket, req.URL.Path, err)
	}
	br := bufio.NewReader(conn)
	if head, err := br.Peek(len("HTTP/")); err == nil && string(head) != "HTTP/" {
		// The daemon's other socket speaks gRPC, whose first frame is
		// not an HTTP/1 status line.
		return nil, fmt.Errorf("control socket %s: the answer to %s is not HTTP (it starts %q): this socket does not serve the control API; is it daemon.socket, the gRPC socket containerd uses, instead of daemon.control_socket?",
			c.socket, req.URL.Path, head)
	}
	resp, err := http.ReadResponse(br, req)
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

// RequestError is the daemon's refusal of a malformed request (status
// 400): a bad image name, no key, no ref. A CLI reports it as a usage
// error.
type RequestError struct {
	// Msg is the daemon's reason, naming the value and the rule it broke.
	Msg string
}

// Error returns the daemon's reason, as it sent it.
func (e *RequestError) Error() string { return e.Msg }

// answerError is the error of an answer carrying msg: a *RequestError
// when the daemon refused the request as malformed.
func answerError(resp *http.Response, msg string) error {
	if resp.StatusCode == http.StatusBadRequest {
		return &RequestError{Msg: msg}
	}
	return errors.New(msg)
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
			return nil, answerError(resp, l.Error)
		case l.Result != nil:
			return l.Result, nil
		case l.Event != nil && onEvent != nil:
			onEvent(*l.Event)
		}
	}
	err = sc.Err()
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("control socket %s: reading the answer: %w", c.socket, err)
	}
	// A daemon that stops says so in a last line; one that dies, or is
	// killed, leaves the stream cut short, and so does one that gave up a
	// client that stopped reading. Either way the pull's runs go on, or
	// resume when the daemon starts again.
	const hint = "the daemon stopped or died during the pull, or gave this client up after a minute without reading its answer: run the same pull again once the daemon is back"
	if err != nil {
		return nil, fmt.Errorf("control socket %s: reading the answer: %w (%s)", c.socket, err, hint)
	}
	return nil, fmt.Errorf("control socket %s: the daemon ended the answer without a result (%s)", c.socket, hint)
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
		return nil, answerError(resp, a.Error)
	}
	if a.Result == nil {
		return nil, fmt.Errorf("control socket %s: answer without a result (status %s)", c.socket, resp.Status)
	}
	return a.Result, nil
}

// RmRequest is the body of /v1/rm: the names (or s3:// sources) of the
// images to remove.
type RmRequest struct {
	Refs []string `json:"refs"`
}

// RmAnswer is the answer of /v1/rm: the images removed and, when some were
// not (in use, never pulled, or their removal failed), why.
type RmAnswer struct {
	Removed []api.Removed `json:"removed"`
	Error   string        `json:"error,omitempty"`
}

// Remove asks the daemon to remove the pulled images refs. It returns the
// images removed, and an error saying why the others were not.
func (c *Client) Remove(ctx context.Context, refs []string) ([]api.Removed, error) {
	resp, err := c.post(ctx, "/v1/rm", RmRequest{Refs: refs})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		return nil, fmt.Errorf("control socket %s: the daemon does not serve rm (status %s)", c.socket, resp.Status)
	}
	var a RmAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return nil, fmt.Errorf("control socket %s: bad answer (status %s): %w", c.socket, resp.Status, err)
	}
	if a.Error != "" {
		return a.Removed, answerError(resp, a.Error)
	}
	return a.Removed, nil
}
