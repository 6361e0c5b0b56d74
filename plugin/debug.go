package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sync/singleflight"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// healthCheckTimeout bounds each check of one /healthz request, so a
// wedged pool or database answers "unhealthy" instead of hanging the
// prober.
const healthCheckTimeout = 5 * time.Second

// HealthSources are what /healthz reads. Pool and DB are required; S3 is
// nil when no S3 request can be observed.
type HealthSources struct {
	// Pool reads the thin pool's status (*thinpool.Pool).
	Pool interface {
		Name() string
		Status(ctx context.Context) (thinpool.PoolStatus, error)
	}
	// DB pings the metadata database (*metadata.DB).
	DB interface {
		Path() string
		Ping(ctx context.Context) error
	}
	// S3 returns the latest S3 request's outcome, false before the first
	// (metrics.Fetch.LastS3Request).
	S3 func() (metrics.S3Request, bool)
}

// Health is the /healthz answer.
type Health struct {
	// Healthy is true when the pool is read-write, the database answers
	// and the latest S3 request, if any, did not fail.
	Healthy  bool           `json:"healthy"`
	Pool     PoolHealth     `json:"pool"`
	Database DatabaseHealth `json:"database"`
	S3       S3Health       `json:"s3"`
}

// PoolHealth is the thin pool's part of Health.
type PoolHealth struct {
	Name string `json:"name"`
	// Mode is the pool's mode (rw, ro, out_of_data_space, fail, error);
	// empty when its status could not be read.
	Mode string `json:"mode"`
	// ReadWrite is true in mode rw only: out of data space, writes that
	// need a new block wait or fail.
	ReadWrite  bool   `json:"read_write"`
	NeedsCheck bool   `json:"needs_check"`
	Error      string `json:"error,omitempty"`
}

// DatabaseHealth is the metadata database's part of Health.
type DatabaseHealth struct {
	Path string `json:"path"`
	// Open is true when a read of the schema answered.
	Open  bool   `json:"open"`
	Error string `json:"error,omitempty"`
}

// S3Health is S3's part of Health.
type S3Health struct {
	// LastRequest is the latest S3 request that its caller did not
	// cancel; null before the first.
	LastRequest *S3RequestHealth `json:"last_request"`
}

// S3RequestHealth is one S3 request's outcome.
type S3RequestHealth struct {
	Operation string `json:"operation"`
	// Outcome is its s3_requests_total outcome label.
	Outcome string    `json:"outcome"`
	At      time.Time `json:"at"`
	// OK is false when S3 was unreachable, refused the request or failed
	// it (a missing object is an answer: OK).
	OK bool `json:"ok"`
}

// CheckHealth runs every check of src at once, each bounded by its own
// timeout, so the answer comes within healthCheckTimeout.
func CheckHealth(ctx context.Context, src HealthSources) Health {
	var h Health
	var wg sync.WaitGroup

	h.Pool.Name = src.Pool.Name()
	wg.Go(func() {
		st, err := bounded(ctx, src.Pool.Status)
		if err != nil {
			h.Pool.Error = err.Error()
			return
		}
		h.Pool.Mode, h.Pool.NeedsCheck = string(st.Mode), st.NeedsCheck
		h.Pool.ReadWrite = st.Mode == thinpool.ModeReadWrite
	})

	h.Database.Path = src.DB.Path()
	wg.Go(func() {
		_, err := bounded(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, src.DB.Ping(ctx) })
		if err != nil {
			h.Database.Error = err.Error()
			return
		}
		h.Database.Open = true
	})
	wg.Wait()

	s3ok := true
	if src.S3 != nil {
		if r, ok := src.S3(); ok {
			h.S3.LastRequest = &S3RequestHealth{Operation: r.Operation, Outcome: r.Outcome, At: r.At.UTC(), OK: !r.Failed()}
			s3ok = !r.Failed()
		}
	}
	h.Healthy = h.Pool.ReadWrite && h.Database.Open && s3ok
	return h
}

// bounded is check under healthCheckTimeout, waited for in its own
// goroutine: the pool's status is one ioctl that first commits the pool's
// metadata, and neither it nor SQLite's file IO gives up with ctx, so on a
// stalled device waiting on them directly would hang the prober. A check
// given up on finishes in its goroutine whenever the kernel answers.
func bounded[T any](ctx context.Context, check func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, healthCheckTimeout)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := check(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		if r.err != nil && ctx.Err() != nil {
			// A check that gave up with ctx says the same as one given up.
			return r.v, fmt.Errorf("not answered within %s: %w", healthCheckTimeout, r.err)
		}
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("not answered within %s: %w", healthCheckTimeout, ctx.Err())
	}
}

// poolStatuser is HealthSources.Pool.
type poolStatuser interface {
	Name() string
	Status(ctx context.Context) (thinpool.PoolStatus, error)
}

// sharedStatus is a pool whose status calls, while one is under way, are
// answered by that one (singleflight). A call stuck in the kernel (a
// stalled metadata device) holds its goroutine and thread however long it
// stays stuck, and bounded gives it up without ending it: without sharing,
// each probe meanwhile would leave one more stuck behind it.
type sharedStatus struct {
	pool  poolStatuser
	calls singleflight.Group
}

func (s *sharedStatus) Name() string { return s.pool.Name() }

// Status joins the call under way, or starts one, and waits for it until
// ctx ends. The call outlives the probe that started it: it runs on a
// context of its own, which no probe's end cancels, bounded like one
// check.
func (s *sharedStatus) Status(ctx context.Context) (thinpool.PoolStatus, error) {
	ch := s.calls.DoChan("status", func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthCheckTimeout)
		defer cancel()
		return s.pool.Status(cctx)
	})
	select {
	case r := <-ch:
		st, _ := r.Val.(thinpool.PoolStatus)
		return st, r.Err
	case <-ctx.Done():
		return thinpool.PoolStatus{}, ctx.Err()
	}
}

// healthHandler answers GET /healthz with CheckHealth as JSON: 200 when
// healthy, 503 otherwise, so a prober needs only the status code.
func healthHandler(src HealthSources) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
			return
		}
		h := CheckHealth(r.Context(), src)
		code := http.StatusOK
		if !h.Healthy {
			code = http.StatusServiceUnavailable
		}
		body, err := json.MarshalIndent(h, "", "  ")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		if _, err := w.Write(append(body, '\n')); err != nil {
			log.G(r.Context()).WithError(err).Debug("healthz: writing the answer")
		}
	})
}

// DebugHandler serves /healthz (CheckHealth over src) and Go's profiler
// under /debug/pprof/ (index, cmdline, profile, symbol, trace and the
// named profiles: heap, goroutine, allocs, block, mutex, threadcreate).
// It is its own mux: nothing registered on http.DefaultServeMux leaks in.
func DebugHandler(src HealthSources) http.Handler {
	mux := http.NewServeMux()
	src.Pool = &sharedStatus{pool: src.Pool}
	mux.Handle("/healthz", healthHandler(src))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// healthSources are the service's pool and database, and the S3 requests
// of its pipelines when StartFetcher installed the counters.
func (s *Service) healthSources() HealthSources {
	src := HealthSources{Pool: s.Pool, DB: s.DB}
	if m := s.metricsRegistry(); m != nil {
		src.S3 = m.Fetch().LastS3Request
	}
	return src
}
