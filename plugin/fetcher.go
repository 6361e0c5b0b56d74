package plugin

import (
	"context"
	"fmt"
	"sync"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// S3SourceConfig returns the s3source.Config of bucket under the [s3]
// section (endpoint, region, path style, anonymous access).
func (c *Config) S3SourceConfig(bucket string) s3source.Config {
	return s3source.Config{Bucket: bucket, Region: c.S3.Region, Endpoint: c.S3.Endpoint, PathStyle: c.S3.PathStyle, Anonymous: c.S3.Anonymous}
}

// PipelineOptions returns the pipeline.Options of the [pipeline], [queues]
// and [containerd] sections over the service's database, snapshotter and
// pool. S3 sources are made once per bucket.
func (s *Service) PipelineOptions() pipeline.Options {
	c := s.Config
	var (
		mu      sync.Mutex
		sources = map[string]*s3source.Source{}
	)
	return pipeline.Options{
		DB:          s.DB,
		DownloadDir: c.Pipeline.DownloadDir,
		Sources: func(ctx context.Context, bucket string) (*s3source.Source, error) {
			mu.Lock()
			defer mu.Unlock()
			if src := sources[bucket]; src != nil {
				return src, nil
			}
			src, err := s3source.New(ctx, c.S3SourceConfig(bucket))
			if err != nil {
				return nil, err
			}
			sources[bucket] = src
			return src, nil
		},
		Snapshots:       s.Snapshotter,
		ThinExists:      s.Pool.ThinExists,
		MaxLayerSize:    c.Pipeline.MaxImageSize.Bytes(),
		Limits:          tarball.Limits{AllowSetID: c.Pipeline.AllowSetID},
		DownloadTimeout: c.Pipeline.DownloadTimeout.Duration,
		ExtractTimeout:  c.Pipeline.ExtractTimeout.Duration,
		Downloads:       c.Queues.Downloads,
		Unpacking:       c.Queues.Unpacking,
		Registrar:       registrar(c),
	}
}

// registrar is the containerd registrar of [containerd], or nil when no
// address is configured.
func registrar(c *Config) pipeline.Registrar {
	if c.Containerd.Address == "" {
		return nil
	}
	return &pipeline.ContainerdRegistrar{Address: c.Containerd.Address, Namespace: c.Containerd.Namespace}
}

// StartFetcher builds the S3 pipelines, resumes the runs a previous process
// left, prunes the records of snapshots removed while it was
// down, and serves the control socket (daemon.control_socket; none when
// empty) until ctx is done. With gc.enabled, image garbage collection runs
// before and after every pull and every gc.interval. From then on Serve gives containerd the
// pipelines' view of the snapshotter (pipeline.ContainerdView). stop closes
// both; runs under way stay recorded for the next start.
func (s *Service) StartFetcher(ctx context.Context) (stop func(), err error) {
	p, err := pipeline.New(ctx, s.PipelineOptions())
	if err != nil {
		return nil, fmt.Errorf("fetcher: %w", err)
	}
	if err := p.Resume(ctx); err != nil {
		p.Close(ctx)
		return nil, fmt.Errorf("fetcher: resume: %w", err)
	}
	if _, err := p.Prune(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("fetcher: pruning records of removed snapshots")
	}
	s.served = p.ContainerdView(s.Snapshotter)
	col, err := s.newCollector(p)
	if err != nil {
		p.Close(ctx)
		return nil, fmt.Errorf("fetcher: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	p.SetPoolGuard(col)
	var loops sync.WaitGroup
	loops.Add(1)
	go func() {
		defer loops.Done()
		col.Loop(sctx)
	}()
	done := make(chan struct{})
	if sock := s.Config.Daemon.ControlSocket; sock != "" {
		lis, err := control.Listen(ctx, sock)
		if err != nil {
			cancel()
			p.Close(ctx)
			return nil, fmt.Errorf("fetcher: %w", err)
		}
		go func() {
			defer close(done)
			if err := control.Serve(sctx, lis, fetcherAPI{p, col}); err != nil {
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
		if err := p.Close(context.WithoutCancel(ctx)); err != nil {
			log.G(ctx).WithError(err).Warn("closing the pipelines")
		}
	}, nil
}
