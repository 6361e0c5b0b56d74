//go:build tools

// Package prometheus pins the Prometheus release whose promtool checks
// and unit-tests contrib/prometheus's alert rules, in a module of its own:
// Prometheus's dependencies never move the project's.
// integration/tools/build.sh builds it into .cache/tools.
package prometheus

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
