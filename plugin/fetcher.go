package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control/server"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/cheap"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
)

// S3SourceConfig returns the s3source.Config of bucket: the client keys
// of the [s3] section and pipeline.max_layers.
func (c *Config) S3SourceConfig(bucket string) s3source.Config {
	sc := c.S3.Config
	sc.Bucket, sc.MaxLayers = bucket, c.Pipeline.MaxLayers
	return sc
}

// fetchMetrics returns the S3 pipelines' counters, or nil when neither
// daemon.metrics_address nor daemon.debug_address is set.
func (s *Service) fetchMetrics() *metrics.Fetch {
	if m := s.metricsRegistry(); m != nil {
		return m.Fetch()
	}
	return nil
}

// TarLimits returns the extraction policy of the [pipeline] section, the
// one the daemon's validate step applies to every layer.
func (c *Config) TarLimits() tarball.Limits { return c.Pipeline.Limits() }

// ErrBucketNotAllowed: a pull named a bucket that the [s3] section does not
// admit.
var ErrBucketNotAllowed = errors.New("bucket not allowed")

// BucketAllowed says whether the [s3] section admits pulls from bucket:
// any bucket when neither s3.bucket nor s3.allowed_buckets is set,
// otherwise only those.
func (c *Config) BucketAllowed(bucket string) error {
	s := c.S3
	if (s.Bucket == "" && len(s.AllowedBuckets) == 0) || bucket == s.Bucket || slices.Contains(s.AllowedBuckets, bucket) {
		return nil
	}
	allowed := slices.DeleteFunc(append([]string{s.Bucket}, s.AllowedBuckets...), func(b string) bool { return b == "" })
	return fmt.Errorf("bucket %q: %w (the daemon's s3.bucket and s3.allowed_buckets admit only %s)", bucket, ErrBucketNotAllowed, strings.Join(allowed, ", "))
}

// ResolvePull completes a pull request the way the daemon serves it: a
// request without a bucket names a path under s3.prefix in s3.bucket, and
// the bucket must be one the [s3] section admits.
func (c *Config) ResolvePull(req api.PullRequest) (api.PullRequest, error) {
	if req.Bucket == "" {
		if c.S3.Bucket == "" {
			return req, fmt.Errorf("pull %q: no bucket: name one (s3://BUCKET/KEY) or set s3.bucket in the daemon's config", req.Key)
		}
		req.Bucket, req.Key = c.S3.Bucket, c.S3.Prefix+req.Key
	}
	if err := c.BucketAllowed(req.Bucket); err != nil {
		return req, fmt.Errorf("pull s3://%s/%s: %w", req.Bucket, req.Key, err)
	}
	return req, nil
}

// s3Policy serves the pipelines with the [s3] section's bucket, prefix and
// allowed buckets applied to every pull, whoever asks, and times the
// pulls when metrics is set.
type s3Policy struct {
	*pipeline.Pipelines
	cfg     *Config
	metrics *metrics.Fetch
	pulls   *pullsUnderWay
}

// pullsUnderWay counts the pulls under way, so that once the last one has
// ended the memory of those that did work goes back to the system. A pull
// that downloads or unpacks allocates megabytes of buffers (the download's
// fan-out, decompression windows, the extractor's reads) that are garbage
// once it ends, and Go's background scavenger hands such memory back over
// minutes, so a daemon that idles between pulls would otherwise sit well
// above its standing size for a while after each one; the records a pull
// writes leave SQLite's freed pages in the C heap the same way.
//
// The release (a forced collection, then the C heap's trim) runs on a
// goroutine of its own, so that the answer does not wait for it: it takes
// milliseconds, nothing next to a pull's seconds but a large part of a
// re-pull answered from the records, which allocates no buffers and does
// not ask for one.
type pullsUnderWay struct {
	n atomic.Int64
	// worked is set when a pull that downloaded, unpacked or failed ends,
	// and cleared by the release it leads to.
	worked atomic.Bool
	// release returns the memory; nil: releaseMemory.
	release func()
}

func (p *pullsUnderWay) begin() { p.n.Add(1) }

// end ends a pull begun with begin; worked says whether it downloaded,
// unpacked or failed (what may have left buffers behind).
func (p *pullsUnderWay) end(worked bool) {
	if worked {
		p.worked.Store(true)
	}
	if p.n.Add(-1) == 0 && p.worked.Swap(false) {
		release := p.release
		if release == nil {
			release = releaseMemory
		}
		go release()
	}
}

// releaseMemory returns the memory Go's heap and the C heap hold free to
// the system.
func releaseMemory() {
	debug.FreeOSMemory()
	cheap.Release()
}

// Pull resolves req (ResolvePull) and pulls it.
func (s s3Policy) Pull(ctx context.Context, req api.PullRequest, progress func(api.Event)) (res *api.PullResult, err error) {
	s.pulls.begin()
	defer func() { s.pulls.end(err != nil || res == nil || res.Downloaded > 0 || res.Unpacked > 0) }()
	if s.metrics != nil {
		start := time.Now()
		defer func() { s.metrics.ObservePull(time.Since(start), rejectionRule(err), err) }()
	}
	req, err = s.cfg.ResolvePull(req)
	if err != nil {
		return nil, err
	}
	return s.Pipelines.Pull(ctx, req, progress)
}

// PipelineOptions returns the pipeline.Options of the [pipeline], [queues]
// and [containerd] sections over the service's database, snapshotter and
// pool. S3 sources are made once per bucket.
func (s *Service) PipelineOptions() pipeline.Options {
	c := s.Config
	var (
		mu      sync.Mutex
		sources = map[string]*s3source.Source{}
		fm      = s.fetchMetrics()
	)
	o := c.Pipeline.Options(c.Queues, c.Pipeline.PolicyConfig)
	o.GzipCommand = s.inflateWith()
	o.DB = s.DB
	o.Sources = func(ctx context.Context, bucket string) (*s3source.Source, error) {
		mu.Lock()
		defer mu.Unlock()
		if src := sources[bucket]; src != nil {
			return src, nil
		}
		if err := c.BucketAllowed(bucket); err != nil {
			return nil, err
		}
		sc := c.S3SourceConfig(bucket)
		if fm != nil {
			sc.APIOptions = append(sc.APIOptions, fm.S3Middleware)
		}
		src, err := s3source.New(ctx, sc)
		if err != nil {
			return nil, err
		}
		sources[bucket] = src
		return src, nil
	}
	o.Snapshots = s.Snapshotter
	o.ThinExists = s.Pool.ThinExists
	o.Registrar = registrar(c)
	o.OnRetry = onRetry(fm)
	o.PoolFree = s.poolFree
	return o
}

// onRetry counts the pipelines' step retries in fm (nil: not counted).
func onRetry(fm *metrics.Fetch) func(fsm, step string) {
	if fm == nil {
		return nil
	}
	return fm.StepRetried
}

// poolFree is the pool's free data space in bytes above its reserve
// (pool.min_free_space): the reserve is kept for the writes of the
// running containers, and a layer's extraction, whose size a compressed
// tarball does not tell, must stop short of it. For a pool on loop files
// it is at most what their filesystem can still back
// (thinpool.Backing.DataRoom).
func (s *Service) poolFree(ctx context.Context) (int64, error) {
	st, err := s.Pool.Status(ctx)
	if err != nil {
		return 0, err
	}
	block := uint64(st.BlockSizeSectors) * 512
	free := (st.TotalDataBlocks - min(st.UsedDataBlocks, st.TotalDataBlocks)) * block
	reserve, _ := st.ReserveBytes(s.Pool.MinFreePercent())
	free -= min(free, reserve)
	b, err := s.Pool.Backing(ctx)
	if err != nil {
		return 0, err
	}
	if b.Loop {
		free = min(free, b.DataRoom(st.UsedDataBlocks*block))
	}
	return int64(free), nil
}

// registrar is the containerd registrar of [containerd], or nil when no
// address is configured.
func registrar(c *Config) pipeline.Registrar {
	if r := c.Containerd.Registrar(); r != nil {
		return r
	}
	return nil
}

// StartFetcher builds the S3 pipelines, resumes the runs a previous process
// left, prunes the records of snapshots removed while it was
// down, and serves the control socket (daemon.control_socket; none when
// empty) until ctx is done. With gc.enabled, image garbage collection runs
// before and after every pull, while containerd applies a layer into the
// pool and after its commits, every gc.interval and at the pool's
// low-water event, which also grows a pool allowed to (watchPool); old
// history records go every retention.interval ([retention]); names pulled
// while containerd's socket was absent are registered once it answers
// (pipeline.RegisterPendingInterval). From then on
// Serve gives containerd the pipelines' view of the snapshotter
// (pipeline.ContainerdView). stop closes both; runs under way stay recorded
// for the next start.
func (s *Service) StartFetcher(ctx context.Context) (stop func(), err error) {
	holdStart(ctx, "start-fetcher:begin")
	p, err := pipeline.New(ctx, s.PipelineOptions())
	if err != nil {
		return nil, fmt.Errorf("fetcher: %w", err)
	}
	// closePipelines closes p, for stop and for a start that fails,
	// waiting for the runs Resume launched to end whatever ctx says: a
	// failed start's cause is often ctx's own (a stop asked during
	// start-up), and the daemon closes the pool and the database next.
	closePipelines := func() {
		if err := p.Close(context.WithoutCancel(ctx)); err != nil {
			log.G(ctx).WithError(err).Warn("closing the pipelines")
		}
	}
	if err := p.Resume(ctx); err != nil {
		closePipelines()
		return nil, fmt.Errorf("fetcher: resume: %w", err)
	}
	holdStart(ctx, "start-fetcher:resumed")
	if _, err := p.Prune(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("fetcher: pruning records of removed snapshots")
	}
	s.served = p.ContainerdView(s.Snapshotter)
	s.pipelines = p
	col, err := s.newCollector(p)
	if err != nil {
		closePipelines()
		return nil, fmt.Errorf("fetcher: %w", err)
	}
	// The control socket is listened on before anything is started that
	// a failure would have to stop: the daemon closes the pool and the
	// database and exits once StartFetcher fails, and a loop left running
	// (the pool's watch grows the pool, suspending it for the reload)
	// would work on them closed, or be cut half-way by the exit.
	var lis net.Listener
	if sock := s.Config.Daemon.ControlSocket; sock != "" {
		if lis, err = s.listenControl(ctx, sock); err != nil {
			closePipelines()
			return nil, fmt.Errorf("fetcher: control %w", err)
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	p.SetPoolGuard(col)
	var loops sync.WaitGroup
	loops.Add(1)
	go func() {
		defer loops.Done()
		col.Loop(sctx)
	}()
	loops.Add(1)
	go func() {
		defer loops.Done()
		s.watchPool(sctx, col, s.poolEvents)
	}()
	loops.Add(1)
	go func() {
		defer loops.Done()
		p.RegisterPendingEvery(sctx, pipeline.RegisterPendingInterval)
	}()
	loops.Add(1)
	go func() {
		defer loops.Done()
		p.RetainEvery(sctx, s.Config.Retention.Interval.Duration, s.Config.Retention.Policy())
	}()
	done := make(chan struct{})
	if lis != nil {
		go func() {
			defer close(done)
			if err := server.Serve(sctx, lis, fetcherAPI{s3Policy{Pipelines: p, cfg: s.Config, metrics: s.fetchMetrics(), pulls: &pullsUnderWay{}}, col}); err != nil {
				log.G(ctx).WithError(err).Error("control socket stopped")
			}
		}()
	} else {
		close(done)
	}
	return func() {
		cancel()
		<-done
		loops.Wait()
		closePipelines()
	}, nil
}

// listenControl listens on the control socket (SocketMode,
// daemon.socket_group), and lets only root and that group's members
// through (PeerCheck): it pulls from any bucket with the daemon's
// credentials.
func (s *Service) listenControl(ctx context.Context, path string) (net.Listener, error) {
	gid, err := s.Config.SocketGID()
	if err != nil {
		return nil, err
	}
	lis, err := ListenUnix(ctx, path, SocketMode, gid)
	if err != nil {
		return nil, err
	}
	return PeerCheck(ctx, lis, gid), nil
}
