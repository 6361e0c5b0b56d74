package metadata

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// DefaultOptions returns the [metadata] defaults: Path empty (the daemon
// derives it from its root directory), DefaultSynchronous.
func DefaultOptions() Options { return Options{Synchronous: DefaultSynchronous} }

// Validate checks the [metadata] keys and returns one error per bad value,
// joined, each naming the key ("metadata.path: ..."). Unlike Open, it
// wants an absolute path: the daemon resolves its paths before checking.
func (o Options) Validate() error {
	var p conf.Problems
	p.AbsPath("metadata.path", o.Path, false)
	if o.Synchronous.Validate() != nil {
		p.Add("metadata.synchronous", "must be %q or %q, got %q", SynchronousFull, SynchronousNormal, o.Synchronous)
	}
	return p.Err()
}

// RetentionConfig is the daemon's [retention] section (the toml tags are
// its keys): the Retention policy and how often it runs.
type RetentionConfig struct {
	// Interval spaces the retention passes (RetainEvery).
	Interval conf.Duration `toml:"interval"`
	// RunsMaxAge and RunsMaxCount bound the finished state-machine runs
	// kept (Retention.RunsMaxAge, Retention.RunsMaxCount).
	RunsMaxAge   conf.Duration `toml:"runs_max_age"`
	RunsMaxCount int           `toml:"runs_max_count"`
	// FailedImagesMaxAge is how long an image never pulled successfully is
	// kept with its failure (Retention.FailedImagesMaxAge).
	FailedImagesMaxAge conf.Duration `toml:"failed_images_max_age"`
}

// DefaultRetentionConfig returns the [retention] defaults.
func DefaultRetentionConfig() RetentionConfig {
	return RetentionConfig{
		Interval:           conf.D(DefaultRetentionInterval),
		RunsMaxAge:         conf.D(DefaultRunsMaxAge),
		RunsMaxCount:       DefaultRunsMaxCount,
		FailedImagesMaxAge: conf.D(DefaultFailedImagesMaxAge),
	}
}

// Validate checks the [retention] keys and returns one error per bad
// value, joined, each naming the key. The daemon keeps no record forever:
// every bound must be positive.
func (c RetentionConfig) Validate() error {
	var p conf.Problems
	p.PositiveDuration("retention.interval", c.Interval)
	p.PositiveDuration("retention.runs_max_age", c.RunsMaxAge)
	p.PositiveDuration("retention.failed_images_max_age", c.FailedImagesMaxAge)
	if c.RunsMaxCount <= 0 {
		p.Add("retention.runs_max_count", "must be positive, got %d", c.RunsMaxCount)
	}
	return p.Err()
}

// Policy returns the Retention that c describes.
func (c RetentionConfig) Policy() Retention {
	return Retention{RunsMaxAge: c.RunsMaxAge.Duration, RunsMaxCount: c.RunsMaxCount, FailedImagesMaxAge: c.FailedImagesMaxAge.Duration}
}
