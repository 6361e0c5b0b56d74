package stack

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// servePage serves page as a /metrics endpoint and returns its host:port.
func servePage(t *testing.T, page string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(page))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestMetricSum: samples are summed by series prefix, across label sets
// (also label values holding spaces and braces), comments skipped; a
// prefix naming no series sums to 0 with no sample.
func TestMetricSum(t *testing.T) {
	ctx := context.Background()
	addr := servePage(t, `# HELP flyio_pulls_total Pulls.
# TYPE flyio_pulls_total counter
flyio_pulls_total{result="ok"} 3
flyio_pulls_total{result="failed: a } in a reason"} 2
flyio_pulls_total_other 100
go_goroutines 12
`)
	for _, c := range []struct {
		prefix string
		sum    float64
		n      int
	}{
		{"flyio_pulls_total{", 5, 2},
		{"flyio_pulls_total", 105, 3},
		{"go_goroutines", 12, 1},
		{"flyio_absent", 0, 0},
	} {
		sum, n, err := MetricSum(ctx, addr, c.prefix)
		if err != nil || sum != c.sum || n != c.n {
			t.Errorf("MetricSum(%q) = %v, %d, %v; want %v, %d", c.prefix, sum, n, err, c.sum, c.n)
		}
	}
	samples, err := Samples(ctx, addr)
	if err != nil || len(samples) != 4 {
		t.Fatalf("Samples = %+v, %v; want 4", samples, err)
	}
	if s := samples[1]; s.Series != `flyio_pulls_total{result="failed: a } in a reason"}` || s.Value != 2 {
		t.Errorf("second sample = %+v", s)
	}
	lines, err := MetricLines(ctx, addr, "go_", "flyio_pulls_total ")
	if err != nil || len(lines) != 1 || lines[0] != "go_goroutines 12" {
		t.Errorf("MetricLines(go_, flyio_pulls_total ) = %q, %v; want the go_goroutines line", lines, err)
	}
}

// TestSamplesRefusesBadLines: a line without a numeric value is an error
// naming it, as is a page that is not served.
func TestSamplesRefusesBadLines(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{"flyio_x{a=\"b\"}\n", "flyio_x many\n", "flyio_x\n"} {
		_, err := Samples(ctx, servePage(t, bad))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", strings.TrimSpace(bad))) {
			t.Errorf("Samples of %q: err = %v; want one naming the line", bad, err)
		}
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	if _, err := Samples(ctx, strings.TrimPrefix(srv.URL, "http://")); err == nil {
		t.Errorf("Samples of a closed server: no error")
	}
}
