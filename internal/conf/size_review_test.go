package conf

import "testing"

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
