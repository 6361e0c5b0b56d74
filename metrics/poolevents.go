package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// PoolEvents counts what the daemon does on the pool's device-mapper
// events: flyio_snapshotter_pool_low_water_events_total,
// _pool_growths_total, _pool_grown_bytes_total and
// _pool_watch_failures_total, all labelled with the pool name. Create it
// with NewPoolEvents, register it with AddPoolEvents.
type PoolEvents struct {
	pool     string
	lowWater prometheus.Counter
	growths  prometheus.Counter
	grown    prometheus.Counter
	watch    prometheus.Counter
}

// NewPoolEvents returns the counters of pool, all at zero.
func NewPoolEvents(pool string) *PoolEvents {
	labels := prometheus.Labels{"pool": pool}
	return &PoolEvents{
		pool: pool,
		lowWater: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "pool_low_water_events_total", ConstLabels: labels,
			Help: "Device-mapper events the pool raised with its free data blocks at or under the low-water mark."}),
		growths: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "pool_growths_total", ConstLabels: labels,
			Help: "Times the loop-file pool's data was grown."}),
		grown: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "pool_grown_bytes_total", ConstLabels: labels,
			Help: "Bytes added to the loop-file pool's data by growth."}),
		watch: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "pool_watch_failures_total", ConstLabels: labels,
			Help: "Times the watch of the pool's device-mapper events failed and was started again; while it is down, no low-water mark is acted on."}),
	}
}

// WatchFailed counts one failed watch of the pool's events.
func (e *PoolEvents) WatchFailed() { e.watch.Inc() }

// LowWater counts one low-water event.
func (e *PoolEvents) LowWater() { e.lowWater.Inc() }

// Grew counts one growth of the data from from to to bytes.
func (e *PoolEvents) Grew(from, to int64) {
	if to <= from {
		return
	}
	e.growths.Inc()
	e.grown.Add(float64(to - from))
}

// AddPoolEvents exports e's counters.
func (m *Metrics) AddPoolEvents(e *PoolEvents) {
	m.register(e.lowWater, e.growths, e.grown, e.watch)
}

// PoolBacking is what AddPoolBacking reads: *thinpool.Pool.
type PoolBacking interface {
	Name() string
	Backing(ctx context.Context) (thinpool.Backing, error)
}

var (
	backingFreeDesc = prometheus.NewDesc(Namespace+"_pool_backing_fs_free_bytes",
		"Free bytes of the filesystem holding the loop-file pool's files.", []string{"pool"}, nil)
	loopVirtualDesc = prometheus.NewDesc(Namespace+"_pool_loop_files_virtual_bytes",
		"Apparent size of the loop-file pool's data and metadata files; above the free bytes plus what they hold, the pool can fail for lack of host space.", []string{"pool"}, nil)
	loopAllocatedDesc = prometheus.NewDesc(Namespace+"_pool_loop_files_allocated_bytes",
		"Bytes the loop-file pool's files hold on their filesystem.", []string{"pool"}, nil)
	growthReserveDesc = prometheus.NewDesc(Namespace+"_pool_growth_reserve_bytes",
		"Free bytes growth leaves on the filesystem holding the loop-file pool's files (pool.growth_reserve).", []string{"pool"}, nil)
)

// AddPoolBacking exports, for a loop-file pool, the free bytes of the
// filesystem holding its files, their virtual and allocated sizes and the
// growth reserve, read on each scrape. A pool on block devices exports nothing.
func (m *Metrics) AddPoolBacking(p PoolBacking) {
	m.register(&backingCollector{pool: p})
}

type backingCollector struct{ pool PoolBacking }

func (c *backingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backingFreeDesc
	ch <- loopVirtualDesc
	ch <- loopAllocatedDesc
	ch <- growthReserveDesc
}

func (c *backingCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	b, err := c.pool.Backing(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(backingFreeDesc, err)
		return
	}
	if !b.Loop {
		return
	}
	name := c.pool.Name()
	ch <- prometheus.MustNewConstMetric(backingFreeDesc, prometheus.GaugeValue, float64(b.FSFree), name)
	ch <- prometheus.MustNewConstMetric(loopVirtualDesc, prometheus.GaugeValue, float64(b.Virtual), name)
	ch <- prometheus.MustNewConstMetric(loopAllocatedDesc, prometheus.GaugeValue, float64(b.Allocated), name)
	ch <- prometheus.MustNewConstMetric(growthReserveDesc, prometheus.GaugeValue, float64(b.GrowthReserve), name)
}
