package conf

import "testing"

func TestParsePercent(t *testing.T) {
	good := map[string]float64{"0%": 0, "10%": 10, "2.5%": 2.5, " 50 %": 50, "100%": 100}
	for in, want := range good {
		got, err := ParsePercent(in)
		if err != nil || got.Value() != want {
			t.Errorf("ParsePercent(%q) = %v, %v; want %v", in, got, err, want)
		}
		if back, err := ParsePercent(got.String()); err != nil || back != got {
			t.Errorf("ParsePercent(%q) = %v, %v; want %v back", got.String(), back, err, got)
		}
	}
	for _, in := range []string{"", "%", "10", "0.1", "-5%", "1e1%", "ten%", "10%%", "1_0%"} {
		if got, err := ParsePercent(in); err == nil {
			t.Errorf("ParsePercent(%q) = %v, want an error", in, got)
		}
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"0": 0, "512": 512, "1_024": 1024, "0x10": 16, "64KiB": 64 << 10, "64 kib": 64 << 10,
		"10GiB": 10 << 30, "1.5GiB": 3 << 29, "2GB": 2e9, "3MB": 3e6, "1TiB": 1 << 40, "7B": 7, "4KB": 4000,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got.Bytes() != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "-1KiB", "1.5", "0.3KiB", "10 parsecs", "1e3", "99999999TiB"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
	for _, n := range []int64{0, 100, 64 << 10, 10 << 30, 3 << 29, 2e9} {
		back, err := ParseSize(Size(n).String())
		if err != nil || back.Bytes() != n {
			t.Errorf("ParseSize(Size(%d).String()=%q) = %d, %v", n, Size(n).String(), back, err)
		}
	}
}

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

// TestParseSizeLeadingZerosAndUnderscores: a size is read as TOML reads an
// integer. A leading zero is no octal prefix there ("010" is not 8 bytes,
// and "010" and "010B" must not be two sizes), and an underscore must sit
// between two digits ("1_" and "1__0" are no numbers).
func TestParseSizeLeadingZerosAndUnderscores(t *testing.T) {
	for in, want := range map[string]int64{"010": 10, "0755": 755, "0_10": 10} {
		if got, err := ParseSize(in); err == nil && got.Bytes() != want {
			t.Errorf("ParseSize(%q) = %d, want %d (or an error)", in, got, want)
		}
	}
	for _, in := range []string{"1_", "1__0", "1_KiB", "1__0KiB", "1_.5KiB"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}
