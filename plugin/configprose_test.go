package plugin

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// proseDefault is a key written with a value beside it, as the docs give
// a default in passing: "`gc.high_threshold` (85%)", "`s3.part_size`,
// 8 MiB", "(pool.min_free_space, 10% by default)".
var proseDefault = regexp.MustCompile("`?((?:daemon|metadata|pool|s3|pipeline|queues|containerd|differ|gc|retention)\\.[a-z_]+)`?(?:,| \\()\\s*(?:default\\s+)?([0-9]+(?:\\.[0-9]+)?) ?(%|TiB|GiB|MiB|KiB|s|m|h)(?:[^A-Za-z]|$)")

// TestProseDefaultsAreTheCode: a default the docs, the README, the rule
// file's comments or the systemd unit give beside a key in their text is
// the key's value in DefaultConfig (which TestExampleFileEqualsDefaults
// ties to config.toml.example), so changing a default cannot leave an
// operator reading the old one.
func TestProseDefaultsAreTheCode(t *testing.T) {
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../README.md", "../contrib/prometheus/alerts.yml", "../contrib/systemd/containerd-flyio-snapshotter.service")
	def := reflect.ValueOf(*DefaultConfig())
	fields := map[string]configField{}
	for _, f := range configFields() {
		fields[f.Section+"."+f.Key] = f
	}
	seen := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		// A sentence may run on over a comment's next line.
		text := regexp.MustCompile(`\n\s*#?\s*`).ReplaceAllString(string(b), " ")
		for _, m := range proseDefault.FindAllStringSubmatch(text, -1) {
			key, num, unit := m[1], m[2], m[3]
			f, ok := fields[key]
			if !ok {
				t.Errorf("%s: %q names %s, which is not a key", file, m[0], key)
				continue
			}
			seen++
			v := def.FieldByIndex(f.Index).Interface()
			var got, want float64
			switch d := v.(type) {
			case Percent:
				got = d.Value()
			case float64:
				got = d
			case Size:
				got = float64(d)
			case Duration:
				got = d.Seconds()
			default:
				t.Errorf("%s: %q: %s is a %T, not a percent, size or duration", file, m[0], key, v)
				continue
			}
			n, _ := strconv.ParseFloat(num, 64)
			switch unit {
			case "%":
				want = n
			case "s", "m", "h":
				d, err := time.ParseDuration(num + unit)
				if err != nil {
					t.Fatal(err)
				}
				want = d.Seconds()
			default:
				s, err := ParseSize(num + unit)
				if err != nil {
					t.Fatal(err)
				}
				want = float64(s)
			}
			if got != want {
				t.Errorf("%s: %q: the default of %s is %v", file, strings.TrimSpace(m[0]), key, v)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no default found in the docs: the pattern is wrong")
	}
}
