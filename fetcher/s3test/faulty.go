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
// per method and key.
type faultyS3 struct {
	next   http.Handler
	bucket string

	mu     sync.Mutex
	faults []*fault
	counts map[string]int
	all    int
	signed int // requests carrying an Authorization header
}

type faultKind int

const (
	faultStatus   faultKind = iota // answer an S3 error
	faultDrop                      // cut the connection after some body bytes
	faultTruncate                  // send fewer body bytes than declared, then end
	faultDelay                     // wait before answering
	faultAnswer                    // answer a fixed body instead of the fake
	faultStall                     // send some body bytes, then nothing until the client leaves
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
	served int // answers given so far (faultAnswer)
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

// Reset disarms every fault and zeroes the counters.
func (f *faultyS3) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = nil
	f.counts = map[string]int{}
	f.all = 0
	f.signed = 0
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

// take counts the request and returns the faults to apply to it: the first
// matching delay, then either the first matching status fault or, if there
// is none, the first matching cut (drop, truncate or stall), and the body of
// an Answer fault. Only the faults applied are consumed.
func (f *faultyS3) take(method, key string, signed bool) (delay, status, cut *fault, answer []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.all++
	if signed {
		f.signed++
	}
	f.counts[method+" "+key]++
	for _, fl := range f.faults {
		if (fl.key != "" && fl.key != key) || (fl.method != "" && fl.method != method) {
			continue
		}
		switch {
		case fl.kind == faultDelay && delay == nil:
			delay = fl
		case (fl.kind == faultStatus || fl.kind == faultAnswer) && status == nil:
			status = fl
		case (fl.kind == faultDrop || fl.kind == faultTruncate || fl.kind == faultStall) && cut == nil:
			cut = fl
		}
	}
	if status != nil {
		cut = nil
	}
	kept := f.faults[:0]
	for _, fl := range f.faults {
		if fl == delay || fl == status || fl == cut {
			fl.times--
		}
		if fl == status && fl.kind == faultAnswer {
			answer = fl.body(fl.served)
			fl.served++
		}
		if fl.times > 0 {
			kept = append(kept, fl)
		}
	}
	f.faults = kept
	return delay, status, cut, answer
}

func (f *faultyS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, _ := keyOf(f.bucket, r.URL.Path)
	delay, status, cut, answer := f.take(r.Method, key, r.Header.Get("Authorization") != "")
	if delay != nil {
		select {
		case <-time.After(delay.delay):
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case status != nil && status.kind == faultAnswer:
		w.Header().Set("Content-Type", "application/xml")
		w.Write(answer)
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
