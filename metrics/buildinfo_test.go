package metrics

import (
	"regexp"
	"runtime"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

func gaugeValue(mt *dto.Metric) float64 { return mt.GetGauge().GetValue() }

// TestBuildInfo: one series at 1 naming the version and commit given, the
// Go toolchain and the SQLite library linked in.
func TestBuildInfo(t *testing.T) {
	m := New()
	m.AddBuildInfo(BuildInfo{Version: "v1.2.3", Commit: "0123abc"})
	got := samples(t, m, Namespace+"_build_info", gaugeValue)
	if len(got) != 1 {
		t.Fatalf("build_info series: %v, want one", got)
	}
	for labels, v := range got {
		re := regexp.MustCompile(`^commit=0123abc,go_version=` + regexp.QuoteMeta(runtime.Version()) + `,sqlite_version=3\.\d+\.\d+,version=v1\.2\.3$`)
		if v != 1 || !re.MatchString(labels) {
			t.Errorf("build_info{%s} = %v, want 1 with labels matching %s", labels, v, re)
		}
	}

	// Nothing given: the version is unknown, the commit the toolchain's
	// stamp or unknown, never empty.
	m = New()
	m.AddBuildInfo(BuildInfo{})
	for labels := range samples(t, m, Namespace+"_build_info", gaugeValue) {
		if !regexp.MustCompile(`^commit=([0-9a-f]{40}|unknown),.*,version=unknown$`).MatchString(labels) {
			t.Errorf("build_info without a version: {%s}", labels)
		}
	}
}

// TestPoolNeedsCheckAndModeCase: needs_check is a gauge of its own, and
// the mode label has one case, the failed states included.
func TestPoolNeedsCheckAndModeCase(t *testing.T) {
	m := New()
	f := &fakePoolStatus{st: thinpool.PoolStatus{TotalDataBlocks: 10, TotalMetadataBlocks: 10, BlockSizeSectors: 128, Mode: thinpool.ModeReadWrite}}
	m.AddPool(f)
	for _, c := range []struct {
		st         thinpool.PoolStatus
		mode       string
		needsCheck float64
	}{
		{thinpool.PoolStatus{Mode: thinpool.ModeReadWrite}, "rw", 0},
		{thinpool.PoolStatus{Mode: thinpool.ModeReadOnly, NeedsCheck: true}, "ro", 1},
		{thinpool.PoolStatus{Mode: thinpool.ModeFail}, "fail", 0},
	} {
		f.st = c.st
		modes := samples(t, m, Namespace+"_pool_mode", gaugeValue)
		if len(modes) != 1 || modes["mode="+c.mode+",pool=p1"] != 1 {
			t.Errorf("%+v: pool_mode %v, want mode=%s at 1", c.st, modes, c.mode)
		}
		if nc := samples(t, m, Namespace+"_pool_needs_check", gaugeValue); len(nc) != 1 || nc["pool=p1"] != c.needsCheck {
			t.Errorf("%+v: pool_needs_check %v, want %v", c.st, nc, c.needsCheck)
		}
	}
}

// TestGCThresholds: the thresholds are exported as ratios once set, and
// not at all while collection is off (never set).
func TestGCThresholds(t *testing.T) {
	m := New()
	g := NewGC()
	m.AddGC(g)
	if got := samples(t, m, Namespace+"_gc_threshold_ratio", gaugeValue); len(got) != 0 {
		t.Errorf("thresholds before SetThresholds: %v", got)
	}
	g.SetThresholds(85, 80)
	got := samples(t, m, Namespace+"_gc_threshold_ratio", gaugeValue)
	if len(got) != 2 || got["bound=high"] != 0.85 || got["bound=low"] != 0.8 {
		t.Errorf("thresholds = %v, want high 0.85, low 0.8", got)
	}
}

// TestFailureOutcomesStartAtZero: the outcomes the alert rules watch are
// exported at zero before the first request or pull, so the first failure
// is an increase a rule can see.
func TestFailureOutcomesStartAtZero(t *testing.T) {
	m := New()
	m.Fetch()
	req := samples(t, m, Namespace+"_s3_requests_total", func(mt *dto.Metric) float64 { return mt.GetCounter().GetValue() })
	for _, k := range []string{"operation=GetObject,outcome=server_error", "operation=ListObjectsV2,outcome=network_error", "operation=HeadObject,outcome=client_error"} {
		if v, ok := req[k]; !ok || v != 0 {
			t.Errorf("s3_requests_total{%s} = %v, %v; want present at 0", k, v, ok)
		}
	}
	pulls := samples(t, m, Namespace+"_pull_duration_seconds", func(mt *dto.Metric) float64 { return float64(mt.GetHistogram().GetSampleCount()) })
	if len(pulls) != 4 || pulls["outcome=error"] != 0 || pulls["outcome=rejected"] != 0 || pulls["outcome=canceled"] != 0 {
		t.Errorf("pull_duration_seconds counts = %v, want ok, rejected, error and canceled at 0", pulls)
	}
}
