package metrics

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/prometheus/client_golang/prometheus"
)

// Fetch counts what the S3 pipelines do: S3 requests by operation and
// outcome, bytes read from S3, requests that repeat a failed one, pulls by
// duration and outcome, and layers rejected by rule. Get it from
// Metrics.Fetch; install S3Middleware on every S3 client.
type Fetch struct {
	requests *prometheus.CounterVec
	bytes    prometheus.Counter
	retries  *prometheus.CounterVec
	pulls    *prometheus.HistogramVec
	rejected *prometheus.CounterVec
	steps    *prometheus.CounterVec

	mu     sync.Mutex
	failed map[string]bool // operation + bucket + key of requests whose last attempt failed

	// last is the outcome of the latest S3 request that was not canceled.
	last atomic.Pointer[S3Request]
}

// S3Request is the outcome of one S3 request, as the health endpoint
// reports the latest.
type S3Request struct {
	// Operation is the S3 operation (GetObject, HeadObject, ListObjectsV2).
	Operation string
	// Outcome is the outcome label s3_requests_total counted it under.
	Outcome string
	// At is when the request ended (for a GetObject whose body broke, when
	// it broke).
	At time.Time
}

// Failed reports whether S3 could not be reached or refused or failed the
// request. A missing object (not_found) or one that changed (changed) is
// an answer, not a failure.
func (r S3Request) Failed() bool {
	switch r.Outcome {
	case s3ClientError, s3ServerError, s3NetworkError:
		return true
	}
	return false
}

// LastS3Request returns the outcome of the latest S3 request that was not
// canceled by its caller, and false when there was none yet.
func (f *Fetch) LastS3Request() (S3Request, bool) {
	if r := f.last.Load(); r != nil {
		return *r, true
	}
	return S3Request{}, false
}

// observe counts one request of op with outcome and, unless the caller
// canceled it, makes it the latest.
func (f *Fetch) observe(op, outcome string) {
	f.requests.WithLabelValues(op, outcome).Inc()
	if outcome != s3Canceled {
		f.last.Store(&S3Request{Operation: op, Outcome: outcome, At: time.Now()})
	}
}

// S3 request outcomes (the outcome label of s3_requests_total).
const (
	s3OK           = "ok"
	s3NotFound     = "not_found"
	s3Changed      = "changed"
	s3ClientError  = "client_error"
	s3ServerError  = "server_error"
	s3NetworkError = "network_error"
	s3Canceled     = "canceled"
)

// Pull outcomes (the outcome label of pull_duration_seconds).
const (
	pullOK       = "ok"
	pullRejected = "rejected"
	pullError    = "error"
	pullCanceled = "canceled"
)

// s3Operations are the S3 operations the pipelines send.
var s3Operations = []string{"GetObject", "HeadObject", "ListObjectsV2"}

// maxFailed bounds the failed requests remembered for retry counting; past
// it the oldest are forgotten (a retry of those is then not counted).
const maxFailed = 4096

// Fetch returns m's fetch counters, registering them on first use.
func (m *Metrics) Fetch() *Fetch {
	m.fetchOnce.Do(func() {
		f := &Fetch{
			requests: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: Namespace, Name: "s3_requests_total",
				Help: "S3 requests by operation (GetObject, HeadObject, ListObjectsV2) and outcome (ok, not_found, changed: the object changed under a read that named its ETag, client_error, server_error, network_error, canceled); a GetObject whose body then breaks counts once more, as network_error.",
			}, []string{"operation", "outcome"}),
			bytes: prometheus.NewCounter(prometheus.CounterOpts{
				Namespace: Namespace, Name: "s3_downloaded_bytes_total",
				Help: "Bytes of object bodies read from S3.",
			}),
			retries: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: Namespace, Name: "s3_retries_total",
				Help: "S3 requests for the same operation, bucket, key (and end of range, for a part of a ranged read) as one that failed (the pipelines' retries and ranged resumes), by operation.",
			}, []string{"operation"}),
			pulls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Namespace: Namespace, Name: "pull_duration_seconds",
				Help: "Duration of S3 image pulls by outcome (ok, rejected, error, canceled: the client went away or the daemon stopped, and the pull's runs go on).",
				// 10 ms (an image already pulled) to ~45 min.
				Buckets: prometheus.ExponentialBuckets(0.01, 2, 19),
			}, []string{"outcome"}),
			rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: Namespace, Name: "layers_rejected_total",
				Help: "Pulls refused by a rule of the extraction or layout policy or the image size limit, by rule.",
			}, []string{"rule"}),
			steps: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: Namespace, Name: "pipeline_step_retries_total",
				Help: "Attempts of a state-machine step that failed and are retried, by machine and step.",
			}, []string{"fsm", "step"}),
			failed: map[string]bool{},
		}
		// Every outcome a rule alerts on is exported at zero from the
		// start: a series that appears with its first failure has no
		// earlier sample, so increase() and rate() would miss that
		// failure.
		for _, op := range s3Operations {
			for _, o := range []string{s3OK, s3NotFound, s3Changed, s3ClientError, s3ServerError, s3NetworkError, s3Canceled} {
				f.requests.WithLabelValues(op, o)
			}
			f.retries.WithLabelValues(op)
		}
		for _, o := range []string{pullOK, pullRejected, pullError, pullCanceled} {
			f.pulls.WithLabelValues(o)
		}
		m.register(f.requests, f.bytes, f.retries, f.pulls, f.rejected, f.steps)
		m.fetch = f
	})
	return m.fetch
}

// StepRetried counts one failed attempt of step of machine fsm that will be
// retried (pipeline.Options.OnRetry).
func (f *Fetch) StepRetried(fsm, step string) { f.steps.WithLabelValues(fsm, step).Inc() }

// ObservePull records one pull that took d: outcome "ok" when err is nil,
// "rejected" (and the rule counted) when rule is not empty, "canceled"
// when its client went away or the daemon stopped it (context.Canceled:
// its runs go on, nothing failed), else "error".
func (f *Fetch) ObservePull(d time.Duration, rule string, err error) {
	outcome := pullOK
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled):
		outcome = pullCanceled
	case rule != "":
		outcome = pullRejected
		f.rejected.WithLabelValues(rule).Inc()
	default:
		outcome = pullError
	}
	f.pulls.WithLabelValues(outcome).Observe(d.Seconds())
}

// S3Middleware is an AWS SDK API option (s3.Options.APIOptions) that
// counts every request of the client it is installed on.
func (f *Fetch) S3Middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("flyioMetrics",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			op := awsmiddleware.GetOperationName(ctx)
			id := op + " " + requestTarget(in.Parameters)
			f.mu.Lock()
			if f.failed[id] {
				f.retries.WithLabelValues(op).Inc()
			}
			f.mu.Unlock()
			out, md, err := next.HandleInitialize(ctx, in)
			outcome := s3Outcome(ctx, err)
			f.observe(op, outcome)
			f.remember(id, outcome != s3OK && outcome != s3NotFound && outcome != s3Changed)
			if g, ok := out.Result.(*s3.GetObjectOutput); ok && err == nil && g.Body != nil {
				g.Body = &countingBody{ReadCloser: g.Body, f: f, op: op, id: id}
			}
			return out, md, err
		}), middleware.After)
}

// remember notes whether the request id's last attempt failed.
func (f *Fetch) remember(id string, failed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !failed {
		delete(f.failed, id)
		return
	}
	if len(f.failed) >= maxFailed {
		for k := range f.failed {
			delete(f.failed, k)
			break
		}
	}
	f.failed[id] = true
}

// requestTarget names the bucket and key (or prefix) of an S3 input.
func requestTarget(params any) string {
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	switch in := params.(type) {
	case *s3.GetObjectInput:
		// A part of a ranged read is a request of its own: its resume (from
		// the byte reached to the same end) repeats it, while the GETs of
		// the object's other parts, in flight meanwhile, do not.
		t := str(in.Bucket) + "/" + str(in.Key)
		if _, end, ok := strings.Cut(str(in.Range), "-"); ok && end != "" {
			t += " to " + end
		}
		return t
	case *s3.HeadObjectInput:
		return str(in.Bucket) + "/" + str(in.Key)
	case *s3.ListObjectsV2Input:
		return str(in.Bucket) + "/" + str(in.Prefix) + "?" + str(in.ContinuationToken)
	}
	return ""
}

// s3Outcome classifies a request's error.
func s3Outcome(ctx context.Context, err error) string {
	var re *smithyhttp.ResponseError
	switch {
	case err == nil:
		return s3OK
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return s3Canceled
	case errors.As(err, &re) && re.Response != nil:
		switch code := re.HTTPStatusCode(); {
		case code == 404:
			return s3NotFound
		case code == 412:
			// If-Match failed: S3 answered that the object is no longer
			// the version being read, which the pipeline handles.
			return s3Changed
		case code >= 500:
			return s3ServerError
		case code >= 400:
			return s3ClientError
		}
	}
	return s3NetworkError
}

// countingBody counts the bytes of a GetObject body; a read error other
// than EOF before Close makes the request a failed one (its resume is a
// retry).
type countingBody struct {
	io.ReadCloser
	f      *Fetch
	op, id string
	// done is set once the body broke or was closed: later errors are
	// not the network's.
	done atomic.Bool
}

// Read reads and counts.
func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.f.bytes.Add(float64(n))
	if err != nil && err != io.EOF && b.done.CompareAndSwap(false, true) {
		b.f.observe(b.op, s3NetworkError)
		b.f.remember(b.id, true)
	}
	return n, err
}

// Close closes the body.
func (b *countingBody) Close() error {
	b.done.Store(true)
	return b.ReadCloser.Close()
}
