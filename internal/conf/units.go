// Package conf holds what every package's configuration section shares:
// the value types written in the daemon's TOML file (sizes with units,
// durations, percents), their one parser each, and the collector of
// validation problems that names each bad key. It imports nothing of the
// project, so any package may use it.
package conf

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Size is a byte count. In TOML it is written either as an integer number of
// bytes (65536) or as a string with a unit ("64KiB", "10 GiB", "1.5GB").
// Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal units (KB,
// MB, GB, TB) powers of 1000, and B or no unit means bytes; units are
// case-insensitive. The result must be a whole, non-negative number of bytes
// that fits in an int64.
type Size int64

// sizeUnits maps a lower-cased unit suffix to its multiplier.
var sizeUnits = map[string]int64{
	"":    1,
	"b":   1,
	"kb":  1000,
	"mb":  1000 * 1000,
	"gb":  1000 * 1000 * 1000,
	"tb":  1000 * 1000 * 1000 * 1000,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
}

// decimalRE is a decimal number; an underscore sits between two digits of
// its whole part, as in a TOML integer.
var decimalRE = regexp.MustCompile(`^[0-9]+(_[0-9]+)*(\.[0-9]+)?$`)

// octalRE is a C-style octal integer (a leading zero), which strconv reads
// with base 0 but TOML has not: such a size is read as a decimal, as it is
// with a unit.
var octalRE = regexp.MustCompile(`^[+-]?0[0-9_]`)

// ParseSize parses a size written as described on Size. Integer literals
// may use underscores and 0x/0o/0b prefixes, as TOML integers do.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("size %q: empty; write bytes as an integer or a number with a unit such as \"64KiB\" or \"10GiB\"", s)
	}
	if n, err := strconv.ParseInt(t, 0, 64); err == nil && !octalRE.MatchString(t) {
		if n < 0 {
			return 0, fmt.Errorf("size %q: must not be negative", s)
		}
		return Size(n), nil
	}
	i := len(t)
	for i > 0 && (t[i-1] >= 'a' && t[i-1] <= 'z' || t[i-1] >= 'A' && t[i-1] <= 'Z') {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToLower(t[i:])
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", s, t[i:])
	}
	if strings.HasPrefix(num, "-") {
		return 0, fmt.Errorf("size %q: must not be negative", s)
	}
	r, ok := new(big.Rat).SetString(strings.ReplaceAll(num, "_", ""))
	if !ok || !decimalRE.MatchString(num) {
		return 0, fmt.Errorf("size %q: %q is not a number; write bytes as an integer or a number with a unit such as \"64KiB\" or \"10GiB\"", s, num)
	}
	if r.Sign() < 0 {
		return 0, fmt.Errorf("size %q: must not be negative", s)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, fmt.Errorf("size %q: is not a whole number of bytes", s)
	}
	if !r.Num().IsInt64() {
		return 0, fmt.Errorf("size %q: larger than %d bytes", s, int64(math.MaxInt64))
	}
	return Size(r.Num().Int64()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler; go-toml hands it the
// text of a TOML string or the literal of a TOML integer.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalText implements encoding.TextMarshaler with String's form, which
// ParseSize reads back to the same value.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// String writes the size with the largest binary unit that divides it
// exactly ("64KiB", "10GiB"), or as plain bytes ("100").
func (s Size) String() string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if s != 0 && int64(s)%u.mult == 0 {
			return strconv.FormatInt(int64(s)/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// Bytes returns the size as an int64 byte count.
func (s Size) Bytes() int64 { return int64(s) }

// Duration is a time.Duration written in TOML as a Go duration string
// ("30m", "1h30m", "90s"). A bare integer is rejected because its unit would
// be a guess (it is a struct so that go-toml cannot store an integer in it
// as nanoseconds).
type Duration struct{ time.Duration }

// D returns d as a Duration.
func D(d time.Duration) Duration { return Duration{d} }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	t := strings.TrimSpace(string(b))
	v, err := time.ParseDuration(t)
	if err == nil && strings.Trim(t, "+-0123456789") == "" {
		// time.ParseDuration takes "0" (signed or not) without a unit.
		err = fmt.Errorf("no unit")
	}
	if err != nil {
		return fmt.Errorf("duration %q: not a Go duration; write it as a string with a unit such as \"90s\", \"30m\" or \"1h\"", string(b))
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler with time.Duration's form.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.Duration.String()), nil }

// Percent is a share of something, in percent. In TOML it is written as a
// string ending in '%' ("10%", "2.5%"), so that a bare number, whose unit
// (a fraction? a percent? blocks?) would be a guess, is refused (it is a
// struct so that go-toml cannot store a TOML number in it directly).
type Percent struct{ v float64 }

// Pct returns v percent as a Percent.
func Pct(v float64) Percent { return Percent{v} }

// Value returns the percent as a number (10 for "10%").
func (p Percent) Value() float64 { return p.v }

// ParsePercent parses a percent written as described on Percent: a
// non-negative decimal number followed by '%'.
func ParsePercent(s string) (Percent, error) {
	t := strings.TrimSpace(s)
	num, ok := strings.CutSuffix(t, "%")
	num = strings.TrimSpace(num)
	if !ok || !decimalRE.MatchString(num) || strings.Contains(num, "_") {
		return Percent{}, fmt.Errorf("percent %q: write a number followed by %%, such as \"10%%\" or \"2.5%%\"", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return Percent{}, fmt.Errorf("percent %q: %w", s, err)
	}
	return Percent{v}, nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *Percent) UnmarshalText(b []byte) error {
	v, err := ParsePercent(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// MarshalText implements encoding.TextMarshaler with String's form, which
// ParsePercent reads back to the same value.
func (p Percent) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// String writes the percent as ParsePercent reads it ("10%").
func (p Percent) String() string {
	return strconv.FormatFloat(p.v, 'f', -1, 64) + "%"
}
