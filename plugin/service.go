package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// ThinpoolConfig returns the pool's part of the [pool] section, whose
// refusals name the reserve's key.
func (c *Config) ThinpoolConfig() thinpool.Config {
	p := c.Pool.Config
	p.ReserveSetting = thinpool.KeyMinFreeSpace
	return p
}

// SnapshotterConfig returns the devices' part of the [pool] section.
func (c *Config) SnapshotterConfig() snapshotter.Config { return c.Pool.DevicesConfig }

// MetadataOptions returns the options opening the [metadata] database,
// read-write for the daemon or read-only for CLI readers.
func (c *Config) MetadataOptions(readOnly bool) metadata.Options {
	o := c.Metadata
	o.ReadOnly = readOnly
	return o
}

// Service is the daemon's state built from a Config: the metadata
// database, the thin pool and the snapshotter over them. Close releases
// them in reverse order.
type Service struct {
	Config      *Config
	DB          *metadata.DB
	Pool        *thinpool.Pool
	Snapshotter *snapshotter.Snapshotter

	// served is what Serve gives containerd: the snapshotter itself, or
	// the S3 pipelines' view of it once StartFetcher has run.
	served snapshots.Snapshotter
	// metrics is the registry served at daemon.metrics_address, shared by
	// the snapshotter's and the pipelines' metrics; made on first use.
	metrics     *metrics.Metrics
	metricsOnce sync.Once
	// locks are the single-instance locks of daemon.root_dir and of the
	// database (lockDaemon), and of the pool (lockPool).
	locks []*os.File
	// gcMetrics counts image garbage collection once StartFetcher has run.
	gcMetrics *metrics.GC
	// poolEvents counts low-water events and growth once StartFetcher has
	// run.
	poolEvents *metrics.PoolEvents
	// pipelines are the S3 pipelines once StartFetcher has run.
	pipelines *pipeline.Pipelines
	// gzipCommand is daemon.gzip_command resolved (gzipCommandOnce), so
	// that the pipelines, the diff service and the start-up line name one
	// program.
	gzipCommand     string
	gzipCommandOnce sync.Once

	// Build names the running binary in the build_info metric; set it
	// before Serve.
	Build metrics.BuildInfo
}

// inflateWith is the program gzip layers are inflated with, "" for the
// built-in inflater: Config.InflateWith, resolved once per service.
func (s *Service) inflateWith() string {
	s.gzipCommandOnce.Do(func() { s.gzipCommand = s.Config.InflateWith() })
	return s.gzipCommand
}

// metricsRegistry returns the service's metrics registry, or nil when
// neither daemon.metrics_address nor daemon.debug_address is set (the
// debug endpoint's /healthz reads the last S3 request from it).
func (s *Service) metricsRegistry() *metrics.Metrics {
	if s.Config.Daemon.MetricsAddress == "" && s.Config.Daemon.DebugAddress == "" {
		return nil
	}
	s.metricsOnce.Do(func() { s.metrics = metrics.New() })
	return s.metrics
}

// Open validates cfg, takes the single-instance locks of daemon.root_dir
// (LockFileName), when it is elsewhere of the database, and of the pool's
// name and backing stores (lockPool) (ErrLocked, naming the lock and the
// holder's pid, if another process has one),
// opens the database read-write (migrating it), opens or creates the thin
// pool and builds the snapshotter, which reconciles the database with the
// pool before Open returns. On error everything opened so
// far is closed again.
func Open(ctx context.Context, cfg *Config) (_ *Service, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open service: invalid config: %w", err)
	}
	s := &Service{Config: cfg}
	defer func() {
		if err != nil {
			if cerr := s.Close(); cerr != nil {
				log.G(ctx).WithError(cerr).Warn("closing a half-opened service")
			}
		}
	}()
	inflater := s.inflateWith()
	if inflater == "" {
		inflater = "built-in"
	}
	l := log.G(ctx).WithField("db", cfg.Metadata.Path).WithField("pool", cfg.Pool.Name).WithField("gzip_inflater", inflater)
	// Before anything is opened for writing: a second daemon on the same
	// root would reconcile and resume the first one's work under it, and
	// one on the same pool would adopt it and delete the first's devices
	// as unknown to its own database.
	if s.locks, err = lockDaemon(cfg.Daemon.RootDir, cfg.Metadata.Path); err != nil {
		return nil, fmt.Errorf("open service: %w", err)
	}
	pl, err := lockPool(cfg.ThinpoolConfig())
	s.locks = append(s.locks, pl...)
	if err != nil {
		return nil, fmt.Errorf("open service: %w", err)
	}
	if s.DB, err = metadata.Open(ctx, cfg.MetadataOptions(false)); err != nil {
		return nil, fmt.Errorf("open service: metadata database %s: %w", cfg.Metadata.Path, err)
	}
	if s.Pool, err = thinpool.Open(ctx, cfg.ThinpoolConfig()); err != nil {
		return nil, fmt.Errorf("open service: thin pool %s: %w", cfg.Pool.Name, err)
	}
	if err = s.Pool.Adjust(ctx); err != nil {
		return nil, fmt.Errorf("open service: thin pool %s: %w", cfg.Pool.Name, err)
	}
	if s.Snapshotter, err = snapshotter.New(ctx, s.DB, s.Pool, cfg.SnapshotterConfig()); err != nil {
		return nil, fmt.Errorf("open service: snapshotter: %w", err)
	}
	l.Info("service opened")
	return s, nil
}

// Close closes the snapshotter, then the pool (which stays active in the
// kernel), then the database, and releases the lock. It returns every error met, joined, and may
// be called on a half-opened Service.
func (s *Service) Close() error {
	var errs []error
	if s.Snapshotter != nil {
		if err := s.Snapshotter.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close snapshotter: %w", err))
		}
		s.Snapshotter = nil
	}
	if s.Pool != nil {
		if err := s.Pool.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close thin pool %s: %w", s.Config.Pool.Name, err))
		}
		s.Pool = nil
	}
	if s.DB != nil {
		if err := s.DB.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close metadata database %s: %w", s.Config.Metadata.Path, err))
		}
		s.DB = nil
	}
	for _, l := range s.locks {
		l.Close() // releases the lock; the file stays for the next owner
	}
	s.locks = nil
	return errors.Join(errs...)
}
