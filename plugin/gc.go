package plugin

import (
	"context"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
)

// newCollector builds the image garbage collector of [gc] over the
// service's pool, snapshotter and database (usage counts the filesystems
// of pipeline.download_dir and the pool's loop files too), removing names from the
// containerd of [containerd] (when an address is set). `rm` uses it even
// when gc.enabled is false.
func (s *Service) newCollector(p *pipeline.Pipelines) (*gc.Collector, error) {
	var names gc.Names
	if r, ok := registrar(s.Config).(*pipeline.ContainerdRegistrar); ok {
		names = r
	}
	s.gcMetrics = metrics.NewGC()
	c := s.Config.GC
	return gc.New(gc.Options{
		DB:        s.DB,
		Snapshots: s.Snapshotter,
		Usage: func(ctx context.Context) (gc.Usage, error) {
			st, err := s.Pool.Status(ctx)
			if err != nil {
				return gc.Usage{}, err
			}
			u := gc.UsageOf(st)
			paths := []string{s.Config.Pipeline.DownloadDir}
			if s.Config.Pool.DataDevice == "" {
				paths = append(paths, s.Config.Pool.RootDir)
			}
			u.HostUsed, u.HostTotal, err = gc.HostUsage(paths...)
			return u, err
		},
		Guard: pipeline.GuardChain,
		Prune: func(ctx context.Context) error {
			_, err := p.Prune(ctx)
			return err
		},
		Names:         names,
		Observer:      s.gcMetrics,
		HighThreshold: c.HighThreshold,
		LowThreshold:  c.LowThreshold,
		Pinned:        c.Pinned,
		Interval:      c.Interval.Duration,
		Disabled:      !c.Enabled,
		TarballCache:  s.Config.Pipeline.TarballCacheSize.Bytes(),
	})
}

// fetcherAPI is what the control socket serves: pulls and activations by
// the pipelines, removals by the collector.
type fetcherAPI struct {
	s3Policy
	*gc.Collector
}
