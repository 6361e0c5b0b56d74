package plugin

import (
	"context"
	"time"

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
// counts as a low-water event in the metrics. A watch that fails is
// started again (keepWatching).
func (s *Service) watchPool(ctx context.Context, col *gc.Collector, ev *metrics.PoolEvents) {
	lg := log.G(ctx).WithField("pool", s.Pool.Name())
	keepWatching(ctx, s.Pool, lg, ev.WatchFailed, func(ctx context.Context, e thinpool.Event) {
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
}

// poolWatcher is what keepWatching needs of the pool: *thinpool.Pool.
type poolWatcher interface {
	Watch(ctx context.Context, fn func(ctx context.Context, ev thinpool.Event)) error
}

// The pause before a failed watch is started again: watchRetryMin at
// first, doubling up to watchRetryMax while the watches keep failing
// within watchRetryMax of their start.
const (
	watchRetryMin = time.Second
	watchRetryMax = time.Minute
)

// keepWatching runs w.Watch with fn until ctx is done. A watch that fails
// (the pool's event wait refused, say while an operator reloads its
// table) is logged, counted with failed, and started again after a pause,
// so a daemon that runs for months does not stop handling the pool's
// events for good on one error. The watch started again reports the pool
// at once if it is under its low-water mark, so a crossing made while no
// watch ran is handled.
func keepWatching(ctx context.Context, w poolWatcher, lg *log.Entry, failed func(), fn func(ctx context.Context, ev thinpool.Event)) {
	pause := watchRetryMin
	for {
		started := time.Now()
		err := w.Watch(ctx, fn)
		if ctx.Err() != nil {
			return
		}
		failed()
		if time.Since(started) > watchRetryMax {
			pause = watchRetryMin
		}
		lg.WithError(err).WithField("retry_in", pause).Error("watching the pool's events failed; watching again after a pause")
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, watchRetryMax)
	}
}
