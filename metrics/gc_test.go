package metrics

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// counters gathers every counter named name as "label=value" -> value.
func counters(t *testing.T, m *Metrics, name string) map[string]float64 {
	t.Helper()
	return samples(t, m, name, func(mt *dto.Metric) float64 { return mt.GetCounter().GetValue() })
}

// histograms gathers every histogram named name as "label=value" -> its
// sample count and sum.
func histograms(t *testing.T, m *Metrics, name string) (count, sum map[string]float64) {
	t.Helper()
	return samples(t, m, name, func(mt *dto.Metric) float64 { return float64(mt.GetHistogram().GetSampleCount()) }),
		samples(t, m, name, func(mt *dto.Metric) float64 { return mt.GetHistogram().GetSampleSum() })
}

// TestGCCounts: what collection reports is exported, by trigger, cause and
// source;
// a removal that freed nothing measurable counts the image, not the bytes.
func TestGCCounts(t *testing.T) {
	m := New()
	g := NewGC()
	m.AddGC(g)
	g.Ran("pull", 300*time.Millisecond)
	g.Ran("pull", time.Second)
	g.Ran("timer", time.Second)
	g.Removed("usage", "s3", 200<<20)
	g.Removed("usage", "registry", 100<<20)
	g.Removed("usage", "registry", 50<<20)
	g.Removed("rm", "s3", -5)
	if got := counters(t, m, Namespace+"_gc_runs_total"); got["trigger=pull"] != 2 || got["trigger=timer"] != 1 {
		t.Errorf("runs = %v", got)
	}
	if got := counters(t, m, Namespace+"_gc_removed_images_total"); got["cause=usage,source=s3"] != 1 || got["cause=usage,source=registry"] != 2 || got["cause=rm,source=s3"] != 1 {
		t.Errorf("removed images = %v", got)
	}
	if got := counters(t, m, Namespace+"_gc_removed_bytes_total"); got["cause=usage,source=s3"] != 200<<20 || got["cause=usage,source=registry"] != 150<<20 || got["cause=rm,source=s3"] != 0 {
		t.Errorf("removed bytes = %v", got)
	}
	if n, sum := histograms(t, m, Namespace+"_gc_duration_seconds"); n["trigger=pull"] != 2 || sum["trigger=pull"] != 1.3 {
		t.Errorf("pull durations: %v samples, sum %v", n, sum)
	}
}
