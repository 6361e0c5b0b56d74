package stack

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Sample is one sample line of a Prometheus text page: the series (the
// metric's name with its labels, as printed) and its value.
type Sample struct {
	Series string
	Value  float64
}

// metricsPage returns the /metrics page served at addr (host:port).
func metricsPage(ctx context.Context, addr string) (string, error) {
	url := "http://" + addr + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("metrics %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("metrics %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// MetricLines returns the lines of the /metrics page served at addr whose
// text starts with one of prefixes (every non-empty line when none is
// given). A prefix ending in a space or "{" matches one metric name
// exactly.
func MetricLines(ctx context.Context, addr string, prefixes ...string) ([]string, error) {
	page, err := metricsPage(ctx, addr)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(page, "\n") {
		if l == "" {
			continue
		}
		if len(prefixes) == 0 || slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(l, p) }) {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// Samples reads the /metrics page served at addr and returns its samples
// in the page's order (comments skipped). A line that is not a series
// followed by a number is an error naming it.
func Samples(ctx context.Context, addr string) ([]Sample, error) {
	page, err := metricsPage(ctx, addr)
	if err != nil {
		return nil, err
	}
	var out []Sample
	for _, l := range strings.Split(page, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		s, err := parseSample(l)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %w", addr, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// parseSample splits a sample line into its series and value. The labels'
// values may hold spaces: the series ends at its closing brace.
func parseSample(line string) (Sample, error) {
	end := strings.IndexByte(line, ' ')
	if i := strings.LastIndexByte(line, '}'); strings.IndexByte(line, '{') >= 0 && i >= 0 {
		end = i + 1
	}
	if end <= 0 {
		return Sample{}, fmt.Errorf("sample line %q: no value after the series", line)
	}
	fields := strings.Fields(line[end:])
	if len(fields) == 0 {
		return Sample{}, fmt.Errorf("sample line %q: no value after the series", line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return Sample{}, fmt.Errorf("sample line %q: value: %w", line, err)
	}
	return Sample{Series: line[:end], Value: v}, nil
}

// MetricSum is the sum of the samples on the /metrics page served at addr
// whose series starts with prefix, and how many there were.
func MetricSum(ctx context.Context, addr, prefix string) (sum float64, samples int, err error) {
	all, err := Samples(ctx, addr)
	if err != nil {
		return 0, 0, err
	}
	for _, s := range all {
		if strings.HasPrefix(s.Series, prefix) {
			sum += s.Value
			samples++
		}
	}
	return sum, samples, nil
}
