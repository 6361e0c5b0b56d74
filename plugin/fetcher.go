package plugin

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// S3SourceConfig returns the s3source.Config of bucket under the [s3]
// section (endpoint, region, path style, anonymous access, timeouts) and
// pipeline.max_layers.
func (c *Config) S3SourceConfig(bucket string) s3source.Config {
	return s3source.Config{Bucket: bucket, Region: c.S3.Region, Endpoint: c.S3.Endpoint, PathStyle: c.S3.PathStyle, Anonymous: c.S3.Anonymous,
		ConnectTimeout: c.S3.ConnectTimeout.Duration, ResponseHeaderTimeout: c.S3.ResponseHeaderTimeout.Duration,
		IdleTimeout: c.S3.IdleTimeout.Duration, MaxLayers: c.Pipeline.MaxLayers}
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
		Namespace:       c.Containerd.Namespace,
		MaxLayerSize:    c.Pipeline.MaxImageSize.Bytes(),
		Limits:          tarball.Limits{AllowSetID: c.Pipeline.AllowSetID},
		DownloadTimeout: c.Pipeline.DownloadTimeout.Duration,
		ExtractTimeout:  c.Pipeline.ExtractTimeout.Duration,
		Downloads:       c.Queues.Downloads,
		Unpacking:       c.Queues.Unpacking,
		Registrar:       registrar(c),
		PoolFree:        s.poolFree,
	}
}

// poolFree is the pool's free data space in bytes.
func (s *Service) poolFree(ctx context.Context) (int64, error) {
	st, err := s.Pool.Status(ctx)
	if err != nil {
		return 0, err
	}
	return int64(st.TotalDataBlocks-st.UsedDataBlocks) * int64(st.BlockSizeSectors) * 512, nil
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
// left (seed 001), prunes the records of snapshots removed while it was
// down, and serves the control socket (daemon.control_socket; none when
// empty) until ctx is done. From then on Serve gives containerd the
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
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	if sock := s.Config.Daemon.ControlSocket; sock != "" {
		lis, err := s.listenControl(ctx, sock)
		if err != nil {
			cancel()
			p.Close(ctx)
			return nil, fmt.Errorf("fetcher: control %w", err)
		}
		go func() {
			defer close(done)
			if err := control.Serve(sctx, lis, p); err != nil {
				log.G(ctx).WithError(err).Error("control socket stopped")
			}
		}()
	} else {
		close(done)
	}
	return func() {
		cancel()
		<-done
		if err := p.Close(context.WithoutCancel(ctx)); err != nil {
			log.G(ctx).WithError(err).Warn("closing the pipelines")
		}
	}, nil
}

// listenControl listens on the control socket like the snapshots socket
// (SocketMode, daemon.socket_group), and lets only root and that group's
// members through (PeerCheck): it pulls from any bucket with the daemon's
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
