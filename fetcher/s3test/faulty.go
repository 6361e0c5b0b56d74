package s3test

import (
	"errors"
	"net/http"
	"sync"
	"time"
)

// faultyS3 is the fault injector in front of the fake S3 (an http.Handler).
// Each fault applies to the next requests matching its key ("" matches any
// request), as many times as asked, then disarms. It also counts requests
// per method and key, and records each one's conditional headers.
//
// It enforces If-Match on GET and HEAD as S3 does (412
// PreconditionFailed when the object's ETag differs): gofakes3 checks
// If-Match on PUT only. This is a test boundary: a client's own check of
// the answer's ETag is not what a test of If-Match should rely on.
type faultyS3 struct {
	next   http.Handler
	bucket string

	mu      sync.Mutex
	faults  []*fault
	counts  map[string]int
	all     int
	signed  int // requests carrying an Authorization header
	log     []Request
	latency time.Duration // added before every answer (Shape)
	rate    int64         // bytes per second of every answer's body; 0: no cap
}

// Request is what the server recorded of one request.
type Request struct {
	Method  string
	Key     string    // "" for the bucket itself
	Range   string    // the Range header, "" if none
	IfMatch string    // the If-Match header, "" if none
	At      time.Time // when it arrived
}

type faultKind int

const (
	faultStatus   faultKind = iota // answer an S3 error
	faultDrop                      // cut the connection after some body bytes
	faultTruncate                  // send fewer body bytes than declared, then end
	faultDelay                     // wait before answering
	faultAnswer                    // answer a fixed body instead of the fake
	faultStall                     // send some body bytes, then nothing until the client leaves
	faultHook                      // run a function before answering
)

type fault struct {
	kind   faultKind
	key    string
	method string // "" any
	times  int
	status int
	code   string
	after  int64
	delay  time.Duration
	body   func(i int) []byte
	served int    // answers given so far (faultAnswer)
	rng    string // the Range header it applies to (faultHook)
	fn     func() // what to run (faultHook)
	// until, when set, makes a status fault apply to every matching
	// request before it instead of to times of them (FailFor).
	until time.Time
}

func newFaultyS3(next http.Handler, bucket string) *faultyS3 {
	return &faultyS3{next: next, bucket: bucket, counts: map[string]int{}}
}

func (f *faultyS3) add(fl *fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, fl)
}

// FailNext answers the next n requests for key (any key if "") with an S3
// error: status 503 and code "ServiceUnavailable", "SlowDown", or a 403
// "AccessDenied", as given.
func (f *faultyS3) FailNext(n int, key string, status int, code string) {
	f.add(&fault{kind: faultStatus, key: key, times: n, status: status, code: code})
}

// FailFor answers every request for key (any key if "") with an S3 error,
// as FailNext does, for d from now: a burst of throttling (503 SlowDown)
// or of a failing S3, however many requests come meanwhile.
func (f *faultyS3) FailFor(d time.Duration, key string, status int, code string) {
	f.add(&fault{kind: faultStatus, key: key, times: 1, status: status, code: code, until: time.Now().Add(d)})
}

// Fail503 answers the next n requests for key with 503 ServiceUnavailable.
func (f *faultyS3) Fail503(n int, key string) { f.FailNext(n, key, 503, "ServiceUnavailable") }

// DropAfter makes the next n GETs of key send the headers and `after` bytes
// of the body, then close the TCP connection abruptly (hijacked, RST).
func (f *faultyS3) DropAfter(n int, key string, after int64) {
	f.add(&fault{kind: faultDrop, key: key, method: http.MethodGet, times: n, after: after})
}

// Truncate makes the next n GETs of key declare the full Content-Length but
// send only `after` bytes and end the response.
func (f *faultyS3) Truncate(n int, key string, after int64) {
	f.add(&fault{kind: faultTruncate, key: key, method: http.MethodGet, times: n, after: after})
}

// Delay makes the next n requests for key wait d before being answered (or
// until the client gives up).
func (f *faultyS3) Delay(n int, key string, d time.Duration) {
	f.add(&fault{kind: faultDelay, key: key, times: n, delay: d})
}

// Answer makes the next n GETs of key ("" for the bucket itself, such as
// listings) answer 200 with body(i) as XML, i counting from 0, instead of
// the fake's answer: a server making up listings (repeating continuation
// tokens, endless pages, keys outside the prefix, control characters,
// negative sizes).
func (f *faultyS3) Answer(n int, key string, body func(i int) []byte) {
	f.add(&fault{kind: faultAnswer, key: key, method: http.MethodGet, times: n, body: body})
}

// StallAfter makes the next n GETs of key send the headers and `after`
// bytes of the body, then nothing more, holding the connection open until
// the client gives up.
func (f *faultyS3) StallAfter(n int, key string, after int64) {
	f.add(&fault{kind: faultStall, key: key, method: http.MethodGet, times: n, after: after})
}

// BeforeGet runs fn once, before answering the first GET of key whose
// Range header is rng ("" for a GET of the whole object): a test changes
// the object just before a reader's request for a given part. Requests
// answered meanwhile are not held.
func (f *faultyS3) BeforeGet(key, rng string, fn func()) {
	f.add(&fault{kind: faultHook, key: key, method: http.MethodGet, times: 1, rng: rng, fn: fn})
}

// Shape makes every request wait latency before it is answered and every
// answer's body flow at most bytesPerSecond (0: no cap), as a link to a
// distant S3 would, whose throughput is capped per connection. It lasts
// until Reset.
func (f *faultyS3) Shape(latency time.Duration, bytesPerSecond int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latency, f.rate = latency, bytesPerSecond
}

// Recorded returns the requests received so far, in arrival order.
func (f *faultyS3) Recorded() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.log...)
}

// Reset disarms every fault and the shaping, and zeroes the counters and
// the record.
func (f *faultyS3) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = nil
	f.counts = map[string]int{}
	f.all = 0
	f.signed = 0
	f.log = nil
	f.latency, f.rate = 0, 0
}

func (f *faultyS3) count(method, key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[method+" "+key]
}

// Signed is how many requests carried an Authorization header (zero for an
// anonymous client).
func (f *faultyS3) Signed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.signed
}

func (f *faultyS3) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.all
}

// plan is what faultyS3 does to one request.
type plan struct {
	delay, status, cut *fault
	answer             []byte   // body of an Answer fault
	hooks              []func() // BeforeGet functions due
	latency            time.Duration
	rate               int64
}

// take counts and records the request and returns the faults to apply to
// it: the first matching delay, then either the first matching status
// fault or, if there is none, the first matching cut (drop, truncate or
// stall), the body of an Answer fault, and the hooks due. Only the faults
// applied are consumed.
func (f *faultyS3) take(r *http.Request, key string) plan {
	f.mu.Lock()
	defer f.mu.Unlock()
	method := r.Method
	f.all++
	if r.Header.Get("Authorization") != "" {
		f.signed++
	}
	f.counts[method+" "+key]++
	f.log = append(f.log, Request{Method: method, Key: key, Range: r.Header.Get("Range"), IfMatch: r.Header.Get("If-Match"), At: time.Now()})
	p := plan{latency: f.latency, rate: f.rate}
	due := map[*fault]bool{}
	now := time.Now()
	for _, fl := range f.faults {
		if !fl.until.IsZero() && !now.Before(fl.until) {
			fl.times = 0 // over: dropped below
			continue
		}
		if (fl.key != "" && fl.key != key) || (fl.method != "" && fl.method != method) {
			continue
		}
		switch {
		case fl.kind == faultHook && fl.rng != r.Header.Get("Range"):
		case fl.kind == faultHook:
			due[fl] = true
			p.hooks = append(p.hooks, fl.fn)
		case fl.kind == faultDelay && p.delay == nil:
			p.delay = fl
		case (fl.kind == faultStatus || fl.kind == faultAnswer) && p.status == nil:
			p.status = fl
		case (fl.kind == faultDrop || fl.kind == faultTruncate || fl.kind == faultStall) && p.cut == nil:
			p.cut = fl
		}
	}
	if p.status != nil {
		p.cut = nil
	}
	kept := f.faults[:0]
	for _, fl := range f.faults {
		if (fl == p.delay || fl == p.status || fl == p.cut || due[fl]) && fl.until.IsZero() {
			fl.times--
		}
		if fl == p.status && fl.kind == faultAnswer {
			p.answer = fl.body(fl.served)
			fl.served++
		}
		if fl.times > 0 {
			kept = append(kept, fl)
		}
	}
	f.faults = kept
	return p
}

func (f *faultyS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, _ := keyOf(f.bucket, r.URL.Path)
	p := f.take(r, key)
	for _, fn := range p.hooks {
		fn()
	}
	wait := p.latency
	if p.delay != nil {
		wait += p.delay.delay
	}
	if wait > 0 {
		select {
		case <-time.After(wait):
		case <-r.Context().Done():
			return
		}
	}
	if im := r.Header.Get("If-Match"); im != "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		w = &ifMatchWriter{ResponseWriter: w, want: im}
	}
	if p.rate > 0 {
		w = &paceWriter{ResponseWriter: w, rate: p.rate, start: time.Now()}
	}
	switch status, cut := p.status, p.cut; {
	case status != nil && status.kind == faultAnswer:
		w.Header().Set("Content-Type", "application/xml")
		w.Write(p.answer)
	case status != nil:
		s3Error(w, status.status, status.code)
	case cut == nil:
		f.next.ServeHTTP(w, r)
	default:
		cw := &cutWriter{ResponseWriter: w, limit: cut.after, drop: cut.kind == faultDrop}
		if cut.kind == faultStall {
			cw.stall = r.Context().Done()
		}
		f.next.ServeHTTP(cw, r)
	}
}

// ifMatchWriter answers 412 PreconditionFailed, as S3 does, instead of an
// object whose ETag (set by the fake before its status) is not the
// request's If-Match; the fake's body is then dropped.
type ifMatchWriter struct {
	http.ResponseWriter
	want    string
	decided bool
	failed  bool
}

func (w *ifMatchWriter) decide(status int) {
	if w.decided {
		return
	}
	w.decided = true
	if etag := w.Header().Get("ETag"); status < 300 && etag != "" && w.want != "*" && etag != w.want {
		w.failed = true
		h := w.Header()
		for k := range h {
			delete(h, k)
		}
		s3Error(w.ResponseWriter, http.StatusPreconditionFailed, "PreconditionFailed")
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *ifMatchWriter) WriteHeader(status int) { w.decide(status) }

func (w *ifMatchWriter) Write(b []byte) (int, error) {
	w.decide(http.StatusOK)
	if w.failed {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush, Hijack).
func (w *ifMatchWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// paceWriter holds a body to rate bytes per second from start.
type paceWriter struct {
	http.ResponseWriter
	rate  int64
	start time.Time
	sent  int64
}

func (w *paceWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.sent += int64(n)
	due := w.start.Add(time.Duration(float64(w.sent) / float64(w.rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the connection (Flush, Hijack).
func (w *paceWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// cutWriter passes headers through and stops the body after limit bytes:
// dropping the connection (hijack and RST), stalling until the client
// leaves, or simply ending the response, whose declared Content-Length is
// then longer than what was sent.
type cutWriter struct {
	http.ResponseWriter
	limit   int64
	written int64
	drop    bool
	done    bool
	stall   <-chan struct{} // if set, block the cut until it closes (the client left)
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if c.done {
		return len(p), nil // swallow the rest; the client never sees it
	}
	room := c.limit - c.written
	if int64(len(p)) <= room {
		n, err := c.ResponseWriter.Write(p)
		c.written += int64(n)
		return n, err
	}
	if room > 0 {
		n, err := c.ResponseWriter.Write(p[:room])
		c.written += int64(n)
		if err != nil {
			return n, err
		}
	}
	c.done = true
	rc := http.NewResponseController(c.ResponseWriter)
	if err := rc.Flush(); err != nil {
		return 0, err
	}
	if c.stall != nil {
		<-c.stall
		return 0, errors.New("faultyS3: client left a stalled body")
	}
	if c.drop {
		conn, _, err := rc.Hijack()
		if err != nil {
			return 0, err
		}
		if tc, ok := conn.(interface{ SetLinger(int) error }); ok {
			tc.SetLinger(0) // RST, as a dying peer or middlebox would
		}
		conn.Close()
	}
	return len(p), nil
}

// WriteHeader is ignored once the body was cut (the fake may try to report
// the failed write; the client is gone or has its truncated answer).
func (c *cutWriter) WriteHeader(status int) {
	if !c.done {
		c.ResponseWriter.WriteHeader(status)
	}
}
