package plugin

import (
	"context"
	"errors"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// watchPool handles the pool's device-mapper events until ctx is done. At
// the low-water mark (by default the edge of pool.min_free_space, where
// new devices start being refused; and again when the pool runs out of
// data space while writes wait for pool.no_space_timeout) it grows a
// loop-file pool when pool.max_data_size allows (first: containers writing
// now need the room at once), then, with gc.enabled, runs a garbage
// collection, which removes unused images only when the pool is still past
// gc.high_threshold (at most 100% less the reserve, so it is). Other
// events (mode changes) are logged. The same is done when the watch
// starts on a pool already under its mark (it crossed while the daemon
// was down, or a growth was cut short), and again every
// thinpool.LowWaterRecheckInterval while the pool stays under it, so a
// growth that failed (host space, pool.max_data_size, an error) is
// retried once the operator has made room; only the first of these
// counts as a low-water event in the metrics.
func (s *Service) watchPool(ctx context.Context, col *gc.Collector, ev *metrics.PoolEvents) {
	lg := log.G(ctx).WithField("pool", s.Pool.Name())
	err := s.Pool.Watch(ctx, func(ctx context.Context, e thinpool.Event) {
		l := lg.WithField("event", e.EventNr).WithField("mode", e.Status.Mode).
			WithField("free_blocks", e.Status.TotalDataBlocks-e.Status.UsedDataBlocks).WithField("low_water_blocks", e.LowWaterBlocks)
		if !e.LowWater {
			l.WithField("needs_check", e.Status.NeedsCheck).Info("pool event")
			return
		}
		if e.Recheck && s.Config.Pool.MaxDataSize == 0 && !s.Config.GC.Enabled {
			return // nothing to try again
		}
		l.WithField("recheck", e.Recheck).Warn("pool data at the low-water mark")
		if !e.Recheck {
			ev.LowWater()
		}
		if s.Config.Pool.MaxDataSize != 0 {
			if _, err := s.growPool(ctx); err != nil {
				l.WithError(err).Error("growing the pool at the low-water mark")
			}
		}
		if !s.Config.GC.Enabled {
			return
		}
		if _, err := col.Collect(ctx, "low_water", 0); err != nil {
			l.WithError(err).Warn("gc: collection at the low-water mark")
		}
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		lg.WithError(err).Error("watching the pool's events stopped")
	}
}
