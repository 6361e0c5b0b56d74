package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// GC counts image garbage collection (package gc's Observer):
// flyio_snapshotter_gc_runs_total{trigger}, _gc_duration_seconds{trigger},
// _gc_removed_images_total{cause,source} and
// _gc_removed_bytes_total{cause,source} (pool data freed, by images and
// by the layers of failed pulls; source is s3 or registry), and, once SetThresholds is called, _gc_threshold_ratio{bound}.
// Create it with NewGC, register it with AddGC.
type GC struct {
	runs       *prometheus.CounterVec
	dur        *prometheus.HistogramVec
	removed    *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	thresholds *prometheus.GaugeVec
}

// NewGC returns the garbage-collection counters, all at zero.
func NewGC() *GC {
	return &GC{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "gc_runs_total",
			Help: "Garbage collections that found the pool past the high threshold, by trigger (pull, room, timer, commit: containerd committed a layer, apply: the pool filled while containerd applied a layer, low_water)."}, []string{"trigger"}),
		dur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "gc_duration_seconds",
			Help:    "Time a garbage collection took, by trigger.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"trigger"}),
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "gc_removed_images_total",
			Help: "Images removed from the pool, by cause (usage: the pool was past the high threshold; rm: an operator asked) and source (s3: pulled from S3 by the daemon; registry: unpacked by containerd)."}, []string{"cause", "source"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "gc_removed_bytes_total",
			Help: "Pool data bytes freed by removing images and the layers of failed pulls that no image has, by cause and source."}, []string{"cause", "source"}),
		thresholds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "gc_threshold_ratio",
			Help: "Share of the pool's data or metadata at which garbage collection starts (bound high) and down to which it removes images (bound low); absent while collection is off."}, []string{"bound"}),
	}
}

// SetThresholds exports the high and low thresholds, in percent, that
// collection works to (gc.high_threshold, gc.low_threshold): an alert
// compares pool usage with them.
func (g *GC) SetThresholds(highPercent, lowPercent float64) {
	g.thresholds.WithLabelValues("high").Set(highPercent / 100)
	g.thresholds.WithLabelValues("low").Set(lowPercent / 100)
}

// Ran counts one collection triggered by trigger that took d.
func (g *GC) Ran(trigger string, d time.Duration) {
	g.runs.WithLabelValues(trigger).Inc()
	g.dur.WithLabelValues(trigger).Observe(d.Seconds())
}

// Removed counts one image from source removed for cause and the pool
// data bytes its removal freed (a negative figure, when other writes
// outgrew it, counts nothing).
func (g *GC) Removed(cause, source string, freed int64) {
	g.removed.WithLabelValues(cause, source).Inc()
	if freed > 0 {
		g.bytes.WithLabelValues(cause, source).Add(float64(freed))
	}
}

// Freed counts the pool data bytes freed for cause by removing the
// layers of failed pulls from source, which are no image: only
// _gc_removed_bytes_total grows.
func (g *GC) Freed(cause, source string, freed int64) {
	if freed > 0 {
		g.bytes.WithLabelValues(cause, source).Add(float64(freed))
	}
}

// AddGC exports g's counters.
func (m *Metrics) AddGC(g *GC) {
	m.register(g.runs, g.dur, g.removed, g.bytes, g.thresholds)
}
