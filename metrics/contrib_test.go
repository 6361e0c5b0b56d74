package metrics

import (
	"context"
	"encoding/json"
	"errors"
	goflag "flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/snapshots/native"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// The files outside the package that name the daemon's metrics.
const (
	alertRulesFile = "../contrib/prometheus/alerts.yml"
	alertTestsFile = "../contrib/prometheus/alerts_test.yml"
	dashboardFile  = "../contrib/grafana/flyio-snapshotter.json"
	metricsDocFile = "../docs/metrics.md"
)

var updateDocs = goflag.Bool("update-docs", false, "rewrite "+metricsDocFile+" from the registry")

// fakeBacking stands in for the filesystem under a loop-file pool (a
// thin pool needs device-mapper, which the host lacks).
type fakeBacking struct{}

func (fakeBacking) Name() string { return "p1" }
func (fakeBacking) Backing(context.Context) (thinpool.Backing, error) {
	return thinpool.Backing{Loop: true, FSFree: 1 << 30, FSSize: 4 << 30, Virtual: 2 << 30, Allocated: 1 << 20}, nil
}

// deviceCounts reads the device counts from a real database, as the
// snapshotter does.
type deviceCounts struct{ db *metadata.DB }

func (d deviceCounts) DeviceCounts(ctx context.Context) (map[string]int, error) {
	return snapshotter.ReadRecords(d.db).DeviceStateCounts(ctx)
}

// everything returns a registry with every source the daemon registers,
// each labelled family given a sample through the package's own API, over
// a real database and containerd's native snapshotter; the pool's status
// and its backing filesystem are the kernel's and stand-ins here.
func everything(t *testing.T) *Metrics {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	db := metadatatest.Open(t)
	// An image and a run in the records, for the pipeline's labelled
	// gauges.
	if err := pipeline.RecordsOf(db).MarkImageFailed(ctx, "img-1", "s3://b/1.tar", "bad"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, _, err := fsm.NewSQLiteStore(db).CreateRun(ctx, fsm.RunRecord{ID: "run-a", FSM: "download-image", IdempotencyID: "a", Request: []byte("{}"),
		Transition: "download", State: fsm.StatePending, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	inner, err := native.NewSnapshotter(filepath.Join(t.TempDir(), "native"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })

	m := New()
	m.AddBuildInfo(BuildInfo{Version: "test"})
	m.AddPool(&fakePoolStatus{st: thinpool.PoolStatus{TotalDataBlocks: 100, TotalMetadataBlocks: 100, BlockSizeSectors: 128, Mode: thinpool.ModeReadWrite}})
	m.AddPoolBacking(fakeBacking{})
	m.AddPoolEvents(NewPoolEvents("p1"))
	m.AddDevices(deviceCounts{db})
	m.AddPipeline(pipeline.RecordsOf(db))
	m.AddSpools(spoolBytes(64 << 20))
	g := NewGC()
	m.AddGC(g)
	g.SetThresholds(85, 80)
	g.Ran("timer", time.Second)
	g.Removed("usage", "registry", 1<<20)
	f := m.Fetch()
	f.ObservePull(time.Second, "setid", errors.New("rejected"))
	f.StepRetried("download-image", "fetch")
	if _, err := m.Wrap(inner).Stat(ctx, "missing"); err == nil {
		t.Fatal("Stat of a missing snapshot succeeded")
	}
	// The handler the daemon serves registers its own error counter.
	m.Handler()
	return m
}

// spoolBytes stands in for the pipelines' spools.
type spoolBytes int64

func (b spoolBytes) SpoolBytes() int64 { return int64(b) }

// families gathers m as name -> family.
func families(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	out := map[string]*dto.MetricFamily{}
	for _, mf := range gatherFamilies(t, m) {
		out[mf.GetName()] = mf
	}
	return out
}

// TestEveryDescribedMetricIsGathered: everything gives every family of the
// daemon's own a sample, so the checks below that read the gathered
// registry see all of them (a family added without a sample here fails
// this test, not silently those).
func TestEveryDescribedMetricIsGathered(t *testing.T) {
	m := everything(t)
	ch := make(chan *prometheus.Desc)
	go func() {
		m.Describe(ch)
		close(ch)
	}()
	described := 0
	for d := range ch {
		if strings.Contains(d.String(), `fqName: "`+Namespace+"_") {
			described++
		}
	}
	var gathered []string
	for name := range families(t, m) {
		if strings.HasPrefix(name, Namespace+"_") {
			gathered = append(gathered, name)
		}
	}
	if described == 0 || described != len(gathered) {
		slices.Sort(gathered)
		t.Errorf("%d metrics described, %d gathered: give the missing ones a sample in everything()\n%s", described, len(gathered), strings.Join(gathered, "\n"))
	}
}

// TestPromlint: the exported families follow Prometheus's naming and help
// conventions.
func TestPromlint(t *testing.T) {
	problems, err := promlint.NewWithMetricFamilies(gatherFamilies(t, everything(t))).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// scrapeSeries are the series Prometheus itself adds for every target it
// scrapes, which a rule may use beside the daemon's own.
var scrapeSeries = map[string]bool{"up": true}

var (
	promqlString      = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatchers    = regexp.MustCompile(`\{[^{}]*\}`)
	promqlRange       = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping    = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promqlVariable    = regexp.MustCompile(`\$\{?\w+\}?`)
	promqlLabelValues = regexp.MustCompile(`\blabel_values\(\s*([a-zA-Z_:][\w:]*)\s*,[^)]*\)`)
	promqlIdent       = regexp.MustCompile(`[a-zA-Z_:][\w:]*`)
	promqlKeywords    = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// promqlMetrics returns the metric names a PromQL expression (or a Grafana
// query, with its $variables and label_values()) selects: what is left
// once strings, label matchers, ranges, grouping label lists and
// variables are removed, less function names and keywords.
func promqlMetrics(expr string) []string {
	expr = promqlLabelValues.ReplaceAllString(expr, "$1")
	expr = promqlString.ReplaceAllString(expr, `""`)
	expr = promqlMatchers.ReplaceAllString(expr, " ")
	expr = promqlRange.ReplaceAllString(expr, " ")
	expr = promqlGrouping.ReplaceAllString(expr, " ")
	expr = promqlVariable.ReplaceAllString(expr, " ")
	var out []string
	for _, loc := range promqlIdent.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(expr[loc[0]-1:loc[0]], "0123456789.") {
			continue // a number's exponent or unit: 1e3, 5m
		}
		if strings.HasPrefix(strings.TrimLeft(expr[loc[1]:], " \t\n"), "(") || promqlKeywords[strings.ToLower(name)] {
			continue // a function or a keyword
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

func TestPromqlMetrics(t *testing.T) {
	for expr, want := range map[string]string{
		`flyio_a_bytes / flyio_b_bytes > 0.9`: "flyio_a_bytes flyio_b_bytes",
		`sum by (instance, job) (increase(x_total{outcome!="ok",job=~"a|b"}[30m])) > 0 unless on (instance) y_total offset 5m`:    "x_total y_total",
		`histogram_quantile(0.95, sum by (le) (rate(h_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`:                 "h_seconds_bucket",
		`label_values(flyio_snapshotter_build_info, instance)`:                                                                    "flyio_snapshotter_build_info",
		`up{job="x"} == 0 and ignoring(pool) group_left(version) z_info`:                                                          "up z_info",
		`max by (instance, job) (a / b) >= on (instance, job) max by (instance, job) (t{bound="high"}) or vector(1) and bool 1e3`: "a b t",
	} {
		if got := strings.Join(promqlMetrics(expr), " "); got != want {
			t.Errorf("promqlMetrics(%s) = %q, want %q", expr, got, want)
		}
	}
}

// checkExported fails for every name in names that m does not export,
// counting a histogram's _bucket, _count and _sum series as its own.
func checkExported(t *testing.T, what string, names []string, fams map[string]*dto.MetricFamily) {
	t.Helper()
	for _, name := range names {
		if fams[name] != nil || scrapeSeries[name] {
			continue
		}
		found := false
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && fams[base].GetType() == dto.MetricType_HISTOGRAM {
				found = true
			}
		}
		if !found {
			t.Errorf("%s uses %s, which the daemon does not export", what, name)
		}
	}
}

// alertRules is the part of a Prometheus rule file the tests read.
type alertRules struct {
	Groups []struct {
		Rules []struct {
			Alert string `yaml:"alert"`
			Expr  string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestAlertRulesUseExportedMetrics: every metric an alert rule reads is
// one the daemon exports (or Prometheus's own up).
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	fams := families(t, everything(t))
	var rules alertRules
	readYAML(t, alertRulesFile, &rules)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			names := promqlMetrics(r.Expr)
			if len(names) == 0 {
				t.Errorf("rule %s: no metric found in %q", r.Alert, r.Expr)
			}
			checkExported(t, "rule "+r.Alert, names, fams)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("%s: no rules", alertRulesFile)
	}
}

// TestEveryAlertRuleFiresInItsUnitTest: every rule of the rule file is
// expected to fire, with at least one alert, in some test of the unit-test
// file that make lint runs with promtool.
func TestEveryAlertRuleFiresInItsUnitTest(t *testing.T) {
	var rules alertRules
	readYAML(t, alertRulesFile, &rules)
	var tests struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, alertTestsFile, &tests)
	if !slices.Contains(tests.RuleFiles, filepath.Base(alertRulesFile)) {
		t.Errorf("%s does not test %s (rule_files %v)", alertTestsFile, filepath.Base(alertRulesFile), tests.RuleFiles)
	}
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if !fires[r.Alert] {
				t.Errorf("rule %s fires in no test of %s", r.Alert, alertTestsFile)
			}
		}
	}
}

// dashboardQueries collects every "expr" of the dashboard's panels and
// every query of its template variables.
func dashboardQueries(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
				*out = append(*out, s)
			} else if q, ok := x.(map[string]any); ok && k == "query" {
				if s, ok := q["query"].(string); ok {
					*out = append(*out, s)
				}
			} else {
				dashboardQueries(x, out)
			}
		}
	case []any:
		for _, x := range v {
			dashboardQueries(x, out)
		}
	}
}

// TestDashboardUsesExportedMetrics: every metric a panel or a variable of
// the Grafana dashboard queries is one the daemon exports.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	fams := families(t, everything(t))
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var queries []string
	dashboardQueries(dash, &queries)
	if len(queries) == 0 {
		t.Fatalf("%s: no queries", dashboardFile)
	}
	for _, q := range queries {
		names := promqlMetrics(q)
		if len(names) == 0 {
			t.Errorf("dashboard query %q: no metric found", q)
		}
		checkExported(t, fmt.Sprintf("dashboard query %q", q), names, fams)
	}
}

// metricsDoc renders docs/metrics.md from the daemon's own families.
func metricsDoc(fams map[string]*dto.MetricFamily) string {
	var b strings.Builder
	b.WriteString(`# Metrics

The daemon serves these at ` + "`daemon.metrics_address`" + ` (under ` + "`/metrics`" + `),
besides Go's runtime (` + "`go_*`" + `) and process (` + "`process_*`" + `) metrics, and
` + "`promhttp_metric_handler_errors_total`" + `: a scrape leaves out the metrics of a
source it cannot read and serves the rest; ` + "`cause=\"gathering\"`" + ` counts those.
Alert rules and their tests are in ` + "`contrib/prometheus/`" + `, a Grafana dashboard
in ` + "`contrib/grafana/`" + `.

This list is generated from the daemon's metrics registry, and a test fails
when it differs from what the daemon exports; after changing a metric, run
` + "`go test ./metrics -run TestMetricsDoc -update-docs`" + `.

| metric | type | labels | meaning |
|---|---|---|---|
`)
	var names []string
	for name := range fams {
		if strings.HasPrefix(name, Namespace+"_") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		mf := fams[name]
		var labels []string
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		slices.Sort(labels)
		help := strings.ReplaceAll(mf.GetHelp(), "|", `\|`)
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, strings.ToLower(mf.GetType().String()), strings.Join(labels, ", "), help)
	}
	return b.String()
}

// TestMetricsDoc: docs/metrics.md lists exactly the metrics the daemon
// exports, with their type, labels and help.
func TestMetricsDoc(t *testing.T) {
	want := metricsDoc(families(t, everything(t)))
	if *updateDocs {
		if err := os.WriteFile(metricsDocFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(metricsDocFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(want, "\n")
		for i := range max(len(gl), len(wl)) {
			g, w := "", ""
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Errorf("%s line %d differs from the registry (run go test ./metrics -run TestMetricsDoc -update-docs):\n got %s\nwant %s", metricsDocFile, i+1, g, w)
				break
			}
		}
	}
}

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"instance", "job"}

var (
	// promqlSelector is a metric name with its label matchers.
	promqlSelector = regexp.MustCompile(`([a-zA-Z_:][\w:]*)\s*\{([^{}]*)\}`)
	// promqlMatcher is one label matcher of a selector.
	promqlMatcher = regexp.MustCompile(`(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	// literalAlternation is a regular expression that only lists values.
	literalAlternation = regexp.MustCompile(`^[\w-]+(\|[\w-]+)*$`)
)

// labelValues returns the values family mf's samples give label.
func labelValues(mf *dto.MetricFamily, label string) []string {
	var out []string
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && !slices.Contains(out, l.GetValue()) {
				out = append(out, l.GetValue())
			}
		}
	}
	return out
}

// family returns the family a series name belongs to (a histogram's
// _bucket, _count and _sum included) and whether it is a bucket, or nil.
func family(fams map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, bool) {
	if mf := fams[name]; mf != nil {
		return mf, false
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && fams[base].GetType() == dto.MetricType_HISTOGRAM {
			return fams[base], suffix == "_bucket"
		}
	}
	return nil, false
}

// checkSelectors fails for every label matcher in expr that names a label
// the selected metric does not have, or matches a value (a literal, or a
// regular expression listing literals) that the daemon never gives that
// label: such a selector matches nothing, and the alert or panel on it
// stays silent whatever the host does. Label values are checked only
// where the gathered registry shows them (everything gives every outcome,
// state and bound a sample) and the matcher names no $variable.
func checkSelectors(t *testing.T, what, expr string, fams map[string]*dto.MetricFamily, values bool) int {
	t.Helper()
	n := 0
	for _, sel := range promqlSelector.FindAllStringSubmatch(expr, -1) {
		name := sel[1]
		if scrapeSeries[name] {
			continue
		}
		mf, bucket := family(fams, name)
		if mf == nil {
			t.Errorf("%s: %s is not a metric the daemon exports", what, name)
			continue
		}
		have := append(labelNames(mf, bucket), targetLabels...)
		for _, m := range promqlMatcher.FindAllStringSubmatch(sel[2], -1) {
			label, op, value := m[1], m[2], m[3]
			n++
			if !slices.Contains(have, label) {
				t.Errorf("%s: %s has no label %q (it has %s)", what, name, label, strings.Join(slices.Compact(slices.Sorted(slices.Values(have))), ", "))
				continue
			}
			if !values || slices.Contains(targetLabels, label) || label == "le" || strings.Contains(value, "$") {
				continue
			}
			var want []string
			switch {
			case op == "=" || op == "!=":
				want = []string{value}
			case literalAlternation.MatchString(value):
				want = strings.Split(value, "|")
			}
			known := labelValues(mf, label)
			for _, v := range want {
				if !slices.Contains(known, v) {
					t.Errorf("%s: %s{%s%s%q}: the daemon never gives %s the value %q (it gives %s)", what, name, label, op, value, label, v, strings.Join(known, ", "))
				}
			}
		}
	}
	return n
}

// TestAlertsAndDashboardMatchExportedLabels: every label an alert rule,
// a panel of the dashboard or an input series of the rules' unit tests
// matches on is one the metric has, and every value an alert rule or a
// panel matches is one the daemon gives it. The unit tests feed series
// by hand, so a rule matching a label or value that the daemon never
// exports passes them and never fires on a host.
func TestAlertsAndDashboardMatchExportedLabels(t *testing.T) {
	fams := families(t, everything(t))
	var rules alertRules
	readYAML(t, alertRulesFile, &rules)
	matchers := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			matchers += checkSelectors(t, "rule "+r.Alert, r.Expr, fams, true)
		}
	}
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var queries []string
	dashboardQueries(dash, &queries)
	for _, q := range queries {
		matchers += checkSelectors(t, fmt.Sprintf("dashboard query %q", q), q, fams, true)
	}
	var tests struct {
		Tests []struct {
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
		} `yaml:"tests"`
	}
	readYAML(t, alertTestsFile, &tests)
	for _, tc := range tests.Tests {
		for _, s := range tc.InputSeries {
			matchers += checkSelectors(t, alertTestsFile+" series "+s.Series, s.Series, fams, false)
		}
	}
	if matchers == 0 {
		t.Fatal("no label matcher found: the pattern is wrong")
	}
}
