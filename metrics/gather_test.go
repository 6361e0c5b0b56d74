package metrics

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// gatherFamilies gathers every metric family m's registry exports, failing
// the test if gathering fails.
func gatherFamilies(t *testing.T, m *Metrics) []*dto.MetricFamily {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// labelKey is a sample's labels as "name=value,...", in the order the
// registry gathered them, so a test can look a sample up by its labels.
func labelKey(mt *dto.Metric) string {
	labels := make([]string, 0, len(mt.GetLabel()))
	for _, l := range mt.GetLabel() {
		labels = append(labels, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(labels, ",")
}
