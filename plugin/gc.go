package plugin

import (
	"context"
	"path/filepath"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
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
	s.poolEvents = metrics.NewPoolEvents(s.Pool.Name())
	if c := s.Config.GC; c.Enabled {
		s.gcMetrics.SetThresholds(c.HighThreshold, c.LowThreshold)
	}
	o := s.Config.GC.Options(s.Config.Pipeline.TarballCacheConfig)
	o.DB, o.Snapshots = s.DB, s.Snapshotter
	// The host filesystems whose space the collection watches: the
	// downloads', and the pool's loop files' when it has them, less the
	// loop files' own blocks, which removing images never frees.
	hostPaths := []string{s.Config.Pipeline.DownloadDir}
	var loopFiles []string
	if s.Config.Pool.DataDevice == "" {
		hostPaths = append(hostPaths, s.Config.Pool.RootDir)
		loopFiles = []string{filepath.Join(s.Config.Pool.RootDir, thinpool.DataFileName), filepath.Join(s.Config.Pool.RootDir, thinpool.MetadataFileName)}
	}
	usage := func(status func(context.Context) (thinpool.PoolStatus, error)) func(context.Context) (gc.Usage, error) {
		return func(ctx context.Context) (gc.Usage, error) {
			st, err := status(ctx)
			if err != nil {
				return gc.Usage{}, err
			}
			u := gc.UsageOf(st)
			u.DataReserve, _ = st.ReserveBytes(s.Pool.MinFreePercent())
			if loopFiles != nil {
				b, err := s.Pool.Backing(ctx)
				if err != nil {
					return gc.Usage{}, err
				}
				u.Backed, u.BackingRoom = true, b.DataRoom(u.DataUsed)
			}
			u.HostUsed, u.HostTotal, err = gc.HostUsage(loopFiles, hostPaths...)
			return u, err
		}
	}
	o.Usage, o.Glance = usage(s.Pool.Status), usage(s.Pool.Peek)
	o.Guard = p.Guard
	o.FilesInUse = p.LayerFilesInUse
	o.Pending = gc.DirtyBytes
	o.Prune = func(ctx context.Context) error {
		_, err := p.Prune(ctx)
		return err
	}
	o.Names, o.Observer, o.Grow = names, s.gcMetrics, s.growPool
	return gc.New(o)
}

// fetcherAPI is what the control socket serves: pulls and activations by
// the pipelines, removals by the collector.
type fetcherAPI struct {
	s3Policy
	*gc.Collector
}

// growPool grows the pool one step when pool.max_data_size allows and
// counts it; it reports whether the pool grew.
func (s *Service) growPool(ctx context.Context) (bool, error) {
	g, err := s.Pool.Grow(ctx)
	if err != nil {
		return false, err
	}
	if !g.Grew() {
		log.G(ctx).WithField("pool", s.Pool.Name()).WithField("why", g.Reason).Debug("pool not grown")
		return false, nil
	}
	s.poolEvents.Grew(g.From, g.To)
	return true, nil
}
