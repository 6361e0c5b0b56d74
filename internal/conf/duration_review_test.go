package conf

import "testing"

// TestDurationRefusesABareInteger: a duration is written with its unit; a
// bare integer is refused, 0 too (time.ParseDuration takes "0" alone), so
// that `timeout = "0"` is not read as a unit it does not say.
func TestDurationRefusesABareInteger(t *testing.T) {
	for _, in := range []string{"0", "30", " 0 ", "+0", "-0"} {
		var d Duration
		if err := d.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("Duration.UnmarshalText(%q) = %v, want an error", in, d.Duration)
		}
	}
	for in, want := range map[string]string{"0s": "0s", "90s": "1m30s", "1h30m": "1h30m0s"} {
		var d Duration
		if err := d.UnmarshalText([]byte(in)); err != nil || d.String() != want {
			t.Errorf("Duration.UnmarshalText(%q) = %v, %v; want %s", in, d.Duration, err, want)
		}
	}
}
