package gc

import (
	"strings"
	"testing"
)

// TestConfigRefusesThresholdsWrittenAsFractions: the thresholds are
// percents; 0.85 and 0.8 written for 85% and 80% would collect at under 1%
// of the pool, removing every unused image after every pull, and must be
// refused, naming the key.
func TestConfigRefusesThresholdsWrittenAsFractions(t *testing.T) {
	for _, c := range []struct {
		high, low float64
		key       string
	}{
		{0.85, 0.8, "gc.high_threshold"},
		{1, 0.5, "gc.high_threshold"},
		{85, 0.8, "gc.low_threshold"},
		{85, 1, "gc.low_threshold"},
	} {
		cfg := DefaultConfig()
		cfg.HighThreshold, cfg.LowThreshold = c.high, c.low
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), "fraction") {
			t.Errorf("Validate of high %v, low %v: %v; want an error naming %s as a fraction", c.high, c.low, err, c.key)
		}
	}
	cfg := DefaultConfig()
	cfg.HighThreshold, cfg.LowThreshold = 2, 1.5
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate of high 2, low 1.5: %v", err)
	}
}
