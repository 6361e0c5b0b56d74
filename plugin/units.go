package plugin

import (
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// The value types of the configuration file, defined in package conf and
// named here too for the callers that build a Config in code.
type (
	// Size is conf.Size: bytes, written with or without a unit.
	Size = conf.Size
	// Duration is conf.Duration: a Go duration string.
	Duration = conf.Duration
	// Percent is conf.Percent: a number followed by '%'.
	Percent = conf.Percent
)

// D returns d as a Duration.
func D(d time.Duration) Duration { return conf.D(d) }

// Pct returns v percent as a Percent.
func Pct(v float64) Percent { return conf.Pct(v) }

// ParseSize parses a size as conf.ParseSize does.
func ParseSize(s string) (Size, error) { return conf.ParseSize(s) }
