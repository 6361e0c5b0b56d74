package metrics

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// proseMetric is a metric as the prose docs name it: a name, or a name
// prefix ending in "*", with an optional {label,label="value",...}.
var proseMetric = regexp.MustCompile(Namespace + `_[a-z0-9_]*[a-z0-9](\*|_\*)?(\{[^{}]*\})?`)

// proseFiles are the operator documents outside docs/metrics.md (which
// TestMetricsDoc renders whole) that name metrics in their text, the
// rule file's comments and annotations and the dashboard's descriptions
// among them.
func proseFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == metricsDocFile })
	return append(files, "../README.md", "../config.toml.example", alertRulesFile, alertTestsFile, dashboardFile)
}

// labelNames returns the label names of family mf, and "le" for a
// histogram's buckets.
func labelNames(mf *dto.MetricFamily, bucket bool) []string {
	var out []string
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			out = append(out, l.GetName())
		}
	}
	if bucket {
		out = append(out, "le")
	}
	return out
}

// TestProseNamesExportedMetrics: every metric the README, the example
// config, the docs, the rule file's annotations and the dashboard's
// descriptions name in their text (flyio_snapshotter_...) is one the
// daemon exports, a name prefix ending in "*" matches one, and every
// label written with it in braces is one of its labels (or Prometheus's
// instance and job).
func TestProseNamesExportedMetrics(t *testing.T) {
	fams := families(t, everything(t))
	seen := 0
	for _, file := range proseFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range proseMetric.FindAllStringSubmatch(line, -1) {
				seen++
				where := file + ":" + strconv.Itoa(i+1)
				name, labels := m[0], m[2]
				name = strings.TrimSuffix(name, labels)
				if prefix, ok := strings.CutSuffix(name, "*"); ok {
					if !slices.ContainsFunc(slices.Collect(maps.Keys(fams)), func(n string) bool { return strings.HasPrefix(n, prefix) }) {
						t.Errorf("%s: %s matches no metric the daemon exports", where, name)
					}
					continue
				}
				mf, bucket := fams[name], false
				if mf == nil {
					for _, suffix := range []string{"_bucket", "_count", "_sum"} {
						if base, ok := strings.CutSuffix(name, suffix); ok && fams[base].GetType() == dto.MetricType_HISTOGRAM {
							mf, bucket = fams[base], suffix == "_bucket"
						}
					}
				}
				if mf == nil {
					t.Errorf("%s: %s is not a metric the daemon exports", where, name)
					continue
				}
				if labels == "" {
					continue
				}
				have := append(labelNames(mf, bucket), targetLabels...)
				for _, l := range strings.Split(strings.Trim(labels, "{}"), ",") {
					l = strings.TrimSpace(l)
					if i := strings.IndexAny(l, "=!~"); i >= 0 {
						l = strings.TrimSpace(l[:i])
					}
					if l != "" && !slices.Contains(have, l) {
						t.Errorf("%s: %s has no label %q (it has %s)", where, name, l, strings.Join(slices.Compact(slices.Sorted(slices.Values(have))), ", "))
					}
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no metric named in the docs: the pattern is wrong")
	}
}

// proseAlert is an alert of contrib/prometheus/alerts.yml as the docs name
// it.
var proseAlert = regexp.MustCompile(`\bFlyio[A-Z][A-Za-z0-9]*\b`)

// TestProseNamesExistingAlerts: every alert the README, the example config,
// the docs and the rule file's own comments and unit tests name
// (FlyioPoolUnderReserve, ...) is a rule of the rule file, so a renamed
// or removed rule leaves no runbook pointing at an alert that never
// fires, and no unit test expecting silence from a rule that is gone
// (promtool passes it).
func TestProseNamesExistingAlerts(t *testing.T) {
	var rules alertRules
	readYAML(t, alertRulesFile, &rules)
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	seen := 0
	for _, file := range append(proseFiles(t), metricsDocFile, alertRulesFile, alertTestsFile) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, name := range proseAlert.FindAllString(line, -1) {
				seen++
				if !slices.Contains(names, name) {
					t.Errorf("%s:%d: %s is not an alert of %s", file, i+1, name, alertRulesFile)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no alert named in the docs: the pattern is wrong")
	}
}
