package gc

import (
	"fmt"
	"strings"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// Config is the daemon's [gc] section (the toml tags are its keys): when
// and how far collection removes the unused images of the pool, S3 and
// registry images alike.
type Config struct {
	// Enabled collects after every pull, every Interval, and before a
	// pull's devices are made (Options.Disabled is its negation).
	Enabled bool `toml:"enabled"`
	// HighThreshold is the pool data or metadata usage, in percent, at
	// which unused images are removed, least recently used first, until
	// usage is under LowThreshold.
	HighThreshold float64 `toml:"high_threshold"`
	LowThreshold  float64 `toml:"low_threshold"`
	// Interval spaces the collections between pulls.
	Interval conf.Duration `toml:"interval"`
	// Pinned names images never removed: by a name, or an S3 image by its
	// s3:// source.
	Pinned []string `toml:"pinned"`
}

// DefaultConfig returns the [gc] defaults: enabled, 85% and 80%, every
// five minutes, nothing pinned.
func DefaultConfig() Config {
	return Config{Enabled: true, HighThreshold: DefaultHighThreshold, LowThreshold: DefaultLowThreshold, Interval: conf.D(DefaultInterval)}
}

// minThreshold is the least a threshold may be: the thresholds are
// percents, and one of 1 or less is a fraction written for one (0.85 for
// 85%), which would collect at under 1% of the pool, removing every unused
// image after every pull.
const minThreshold = 1.0

// Validate checks the [gc] keys and returns one error per bad value,
// joined, each naming the key.
func (c Config) Validate() error {
	var p conf.Problems
	switch {
	case c.HighThreshold > 0 && c.HighThreshold <= minThreshold:
		p.Add("gc.high_threshold", "must be a percent (85 for 85%%), not a fraction, above %v and at most 100, got %v", minThreshold, c.HighThreshold)
	case !(c.HighThreshold > 0 && c.HighThreshold <= 100):
		p.Add("gc.high_threshold", "must be a percent above 0 and at most 100, got %v", c.HighThreshold)
	case c.LowThreshold > 0 && c.LowThreshold <= minThreshold:
		p.Add("gc.low_threshold", "must be a percent (80 for 80%%), not a fraction, above %v and below gc.high_threshold (%v), got %v", minThreshold, c.HighThreshold, c.LowThreshold)
	case !(c.LowThreshold > 0 && c.LowThreshold < c.HighThreshold):
		p.Add("gc.low_threshold", "must be a percent above 0 and below gc.high_threshold (%v), got %v", c.HighThreshold, c.LowThreshold)
	}
	p.PositiveDuration("gc.interval", c.Interval)
	for i, n := range c.Pinned {
		if strings.TrimSpace(n) == "" {
			p.Add(fmt.Sprintf("gc.pinned[%d]", i), "must not be empty")
		}
	}
	return p.Err()
}

// Options returns the Options that c and the tarball cache tc describe;
// the caller adds what the collector works on (DB, Snapshots, Usage,
// Guard, Prune and the optional hooks).
func (c Config) Options(tc TarballCacheConfig) Options {
	return Options{
		HighThreshold: c.HighThreshold,
		LowThreshold:  c.LowThreshold,
		Pinned:        c.Pinned,
		Interval:      c.Interval.Duration,
		Disabled:      !c.Enabled,
		TarballCache:  tc.TarballCacheSize.Bytes(),
	}
}

// TarballCacheConfig is the tarball cache's key of the daemon's
// [pipeline] section (the cache is trimmed with each collection).
type TarballCacheConfig struct {
	// TarballCacheSize is the byte budget of the tarballs kept of unpacked
	// layers, least recently used out first; 0 keeps none once unpacked.
	TarballCacheSize conf.Size `toml:"tarball_cache_size"`
}

// DefaultTarballCacheConfig returns the tarball cache's default,
// DefaultTarballCache.
func DefaultTarballCacheConfig() TarballCacheConfig {
	return TarballCacheConfig{TarballCacheSize: DefaultTarballCache}
}

// Validate checks pipeline.tarball_cache_size. Its bound is the extraction
// limits' own, which keeps the byte counts derived from it from
// overflowing.
func (c TarballCacheConfig) Validate() error {
	var p conf.Problems
	if c.TarballCacheSize < 0 || c.TarballCacheSize > tarball.MaxLimitBytes {
		p.Add("pipeline.tarball_cache_size", "must be at least 0 and at most %s, got %s", conf.Size(tarball.MaxLimitBytes), c.TarballCacheSize)
	}
	return p.Err()
}
