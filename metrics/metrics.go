// Package metrics exposes the daemon's Prometheus metrics: the latency of
// every snapshotter method (a decorator around any snapshots.Snapshotter),
// the thin pool's data and metadata usage, and the snapshotter's device
// counts by state; the S3 pipelines' records; and counters of what the
// pipelines do (Fetch): S3 requests through an AWS SDK middleware, pulls
// and their rejections. Pool, device and record figures are read when
// scraped, so they are never stale and cost nothing between scrapes.
package metrics

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/cheap"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// Namespace prefixes every metric name.
const Namespace = "flyio_snapshotter"

// scrapeTimeout bounds the pool and database reads of one scrape. It is
// half of Prometheus's default scrape_timeout (10 s): a source given up
// on must leave the scrape time to answer with the rest before
// Prometheus gives up on it whole and the daemon reads as down.
const scrapeTimeout = 5 * time.Second

// Metrics is one registry with the daemon's metrics. Create it with New,
// add sources with Wrap, AddPool and AddDevices, serve it with Handler.
type Metrics struct {
	reg *prometheus.Registry
	ops *prometheus.HistogramVec
	// collectors is everything registered on reg, in order: what the
	// registry can be asked to describe (Describe), where a gather shows
	// only the labelled families that have a sample yet.
	collectors []prometheus.Collector

	fetchOnce sync.Once
	fetch     *Fetch
}

// New returns a registry holding the operation latency histogram, SQLite's
// memory, and the Go runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace,
			Name:      "operation_duration_seconds",
			Help:      "Latency of snapshotter methods and of the diff service's Apply, by method and outcome (ok, not_found, already_exists, failed_precondition, invalid_argument, resource_exhausted: the pool refused it to keep its reserve, deadline_exceeded: the caller's deadline ran out, canceled: the caller left, error).",
			// 0.5 ms to ~33 s: device-mapper calls take milliseconds, a
			// first Prepare that formats the base device takes seconds, as
			// does applying a layer.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 17),
		}, []string{"method", "outcome"}),
	}
	sqliteMemory := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace,
		Name:      "sqlite_memory_bytes",
		Help:      "Bytes SQLite's allocator holds (page caches, prepared statements, schema) for all database connections: resident memory outside Go's heap.",
	}, func() float64 {
		used, _ := cheap.SQLiteMemory()
		return float64(used)
	})
	m.register(m.ops, sqliteMemory, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// register registers cs on the registry (panicking on a clash, a
// programming error) and remembers them for Describe.
func (m *Metrics) register(cs ...prometheus.Collector) {
	m.reg.MustRegister(cs...)
	m.collectors = append(m.collectors, cs...)
}

// Describe sends the description of every metric registered so far, those
// that have no sample yet included.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

// Registry returns the underlying registry (to gather in tests or to add
// collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format. A
// source that cannot be read (the pool's status refused, the database
// busy past scrapeTimeout) leaves out only its own metrics: the rest are
// served, the error is logged, and
// promhttp_metric_handler_errors_total{cause="gathering"} counts it (on
// the registry, so from the next scrape on). Failing the whole scrape
// would hide every other metric exactly when the host is in trouble, and
// read as the daemon being down.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: errorLogger{}, ErrorHandling: promhttp.ContinueOnError, Registry: m.reg})
}

type errorLogger struct{}

func (errorLogger) Println(v ...any) {
	log.L.WithField("component", "metrics").Warn(v...)
}

// outcome classifies err for the outcome label.
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errdefs.IsNotFound(err):
		return "not_found"
	case errdefs.IsAlreadyExists(err):
		return "already_exists"
	case errdefs.IsFailedPrecondition(err):
		return "failed_precondition"
	case errdefs.IsInvalidArgument(err):
		return "invalid_argument"
	case errdefs.IsResourceExhausted(err):
		// The pool refused it to keep its reserve: the outcome to alert
		// on before containers fail to start.
		return "resource_exhausted"
	case errors.Is(err, context.DeadlineExceeded), errdefs.IsDeadlineExceeded(err):
		// The caller's deadline ran out while the call waited (a busy
		// pool or database): a slowness to see, not a caller that left.
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled), errdefs.IsCanceled(err):
		return "canceled"
	default:
		return "error"
	}
}

// observe records the time since start under method and err's outcome.
func (m *Metrics) observe(method string, start time.Time, err error) {
	m.ops.WithLabelValues(method, outcome(err)).Observe(time.Since(start).Seconds())
}

// PoolStatuser is what AddPool reads: *thinpool.Pool.
type PoolStatuser interface {
	Name() string
	// Peek is the pool's status as the kernel holds it. A scrape does not
	// ask for the status that first commits the metadata (Status): that
	// waits on the metadata device's writes, which the ioctl does not
	// give up, so a stalled device would hang every scrape; the kernel
	// commits every second anyway.
	Peek(ctx context.Context) (thinpool.PoolStatus, error)
	MinFreePercent() float64
	// LowWaterBlocks is the data low-water mark of the pool's live table,
	// in data blocks: the kernel raises its event when the free data
	// blocks fall to it.
	LowWaterBlocks(ctx context.Context) (uint64, error)
}

// metadataBlockBytes is the size of a thin-pool metadata block.
const metadataBlockBytes = 4096

// AddPool exports the pool's data and metadata usage, read from the kernel
// on each scrape: flyio_snapshotter_pool_{data,metadata}_{used,total}_bytes,
// flyio_snapshotter_pool_mode (1 for the current mode, lowercase),
// _pool_needs_check (1 while the kernel flags the metadata for a check),
// the reserve (_pool_reserve_{data,metadata}_bytes, and
// _pool_under_reserve, 1 while new devices are refused for it),
// _pool_under_low_water (1 while the free data is at or under the table's
// low-water mark, however long ago the kernel's one event for that
// crossing came) and what a write that needs a new block meets now
// (_pool_writes_queued, 1 while such writes wait on a pool out of data
// space; _pool_writes_failing, 1 while they fail), all labelled with the
// pool name.
func (m *Metrics) AddPool(p PoolStatuser) {
	m.register(&poolCollector{pool: p})
}

var (
	dataUsedDesc   = prometheus.NewDesc(Namespace+"_pool_data_used_bytes", "Bytes of the thin pool's data device in use.", []string{"pool"}, nil)
	dataTotalDesc  = prometheus.NewDesc(Namespace+"_pool_data_total_bytes", "Size of the thin pool's data device in bytes.", []string{"pool"}, nil)
	metaUsedDesc   = prometheus.NewDesc(Namespace+"_pool_metadata_used_bytes", "Bytes of the thin pool's metadata device in use.", []string{"pool"}, nil)
	metaTotalDesc  = prometheus.NewDesc(Namespace+"_pool_metadata_total_bytes", "Size of the thin pool's metadata device in bytes.", []string{"pool"}, nil)
	modeDesc       = prometheus.NewDesc(Namespace+"_pool_mode", "1 for the thin pool's current mode (rw, ro, out_of_data_space, fail, error).", []string{"pool", "mode"}, nil)
	needsCheckDesc = prometheus.NewDesc(Namespace+"_pool_needs_check",
		"1 while the kernel flags the thin pool's metadata as needing thin_check (the pool stays read-only until it is repaired).", []string{"pool"}, nil)
	reserveDataDesc = prometheus.NewDesc(Namespace+"_pool_reserve_data_bytes",
		"Free data the pool keeps for the writes of running containers: new devices are refused under it (pool.min_free_space).", []string{"pool"}, nil)
	reserveMetaDesc = prometheus.NewDesc(Namespace+"_pool_reserve_metadata_bytes",
		"Free metadata the pool keeps: new devices are refused under it (pool.min_free_space).", []string{"pool"}, nil)
	underReserveDesc = prometheus.NewDesc(Namespace+"_pool_under_reserve",
		"1 while the pool's free data or metadata is under its reserve and new devices are refused.", []string{"pool"}, nil)
	underLowWaterDesc = prometheus.NewDesc(Namespace+"_pool_under_low_water",
		"1 while the pool's free data is at or under its low-water mark (the kernel raises one event per crossing; this stays 1 until the pool grows or data is freed).", []string{"pool"}, nil)
	writesQueuedDesc = prometheus.NewDesc(Namespace+"_pool_writes_queued",
		"1 while the pool is out of data space and the writes needing a new block wait (until pool.no_space_timeout).", []string{"pool"}, nil)
	writesFailingDesc = prometheus.NewDesc(Namespace+"_pool_writes_failing",
		"1 while the pool is out of data space and the writes needing a new block fail.", []string{"pool"}, nil)
	devicesDesc = prometheus.NewDesc(Namespace+"_devices", "Thin devices of the snapshotter by state.", []string{"state"}, nil)
)

type poolCollector struct{ pool PoolStatuser }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dataUsedDesc, dataTotalDesc, metaUsedDesc, metaTotalDesc, modeDesc, needsCheckDesc,
		reserveDataDesc, reserveMetaDesc, underReserveDesc, underLowWaterDesc, writesQueuedDesc, writesFailingDesc} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	name := c.pool.Name()
	st, err := c.pool.Peek(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(dataUsedDesc, err)
		return
	}
	block := float64(st.BlockSizeSectors) * 512
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(dataUsedDesc, float64(st.UsedDataBlocks)*block, name)
	gauge(dataTotalDesc, float64(st.TotalDataBlocks)*block, name)
	gauge(metaUsedDesc, float64(st.UsedMetadataBlocks)*metadataBlockBytes, name)
	gauge(metaTotalDesc, float64(st.TotalMetadataBlocks)*metadataBlockBytes, name)
	gauge(modeDesc, 1, name, string(st.Mode))
	gauge(needsCheckDesc, flag(st.NeedsCheck), name)
	pct := c.pool.MinFreePercent()
	reserveData, reserveMeta := st.ReserveBytes(pct)
	gauge(reserveDataDesc, float64(reserveData), name)
	gauge(reserveMetaDesc, float64(reserveMeta), name)
	gauge(underReserveDesc, flag(st.ReserveError(pct, "") != nil), name)
	gauge(writesQueuedDesc, flag(st.WritesQueued()), name)
	gauge(writesFailingDesc, flag(st.WritesFailing()), name)
	// The status line does not carry the data low-water mark; the table
	// does. The comparison is the one the kernel makes for its event.
	mark, err := c.pool.LowWaterBlocks(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(underLowWaterDesc, err)
		return
	}
	gauge(underLowWaterDesc, flag(st.TotalDataBlocks-min(st.UsedDataBlocks, st.TotalDataBlocks) <= mark), name)
}

// flag is a boolean as a gauge's value.
func flag(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// DeviceCounter is what AddDevices reads: *snapshotter.Snapshotter.
type DeviceCounter interface {
	DeviceCounts(ctx context.Context) (map[string]int, error)
}

// AddDevices exports flyio_snapshotter_devices{state}, the device counts by
// state read from the database on each scrape.
func (m *Metrics) AddDevices(d DeviceCounter) {
	m.register(&deviceCollector{src: d})
}

type deviceCollector struct{ src DeviceCounter }

func (c *deviceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- devicesDesc }

func (c *deviceCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	counts, err := c.src.DeviceCounts(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(devicesDesc, err)
		return
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(n), state)
	}
}

// Wrap returns sn with every method timed into the operation histogram.
// The result implements snapshots.Cleaner exactly when sn does, and its
// Close closes sn.
func (m *Metrics) Wrap(sn snapshots.Snapshotter) snapshots.Snapshotter {
	t := &timed{next: sn, m: m}
	if c, ok := sn.(snapshots.Cleaner); ok {
		return &timedCleaner{timed: t, cleaner: c}
	}
	return t
}
