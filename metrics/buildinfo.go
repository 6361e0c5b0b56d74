package metrics

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// BuildInfo names the running binary for AddBuildInfo.
type BuildInfo struct {
	// Version is the release (git describe); empty reads "unknown".
	Version string
	// Commit is the full commit hash it was built from; empty takes the
	// one the Go toolchain stamped (vcs.revision), or "unknown".
	Commit string
}

// unknown is the value of a build label nothing could tell.
const unknown = "unknown"

// AddBuildInfo exports flyio_snapshotter_build_info, always 1, labelled
// with the binary's version and commit, the Go toolchain that built it and
// the SQLite library linked in: joined to any other series (`* on
// (instance) group_left(version)`), it tells which build produced it.
func (m *Metrics) AddBuildInfo(b BuildInfo) {
	if b.Version == "" {
		b.Version = unknown
	}
	if b.Commit == "" {
		b.Commit = stampedCommit()
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help: "Always 1; its labels name the running binary: version, commit, go_version and sqlite_version (the SQLite library linked in).",
		ConstLabels: prometheus.Labels{
			"version": b.Version, "commit": b.Commit,
			"go_version": runtime.Version(), "sqlite_version": metadata.SQLiteVersion(),
		},
	})
	g.Set(1)
	m.register(g)
}

// stampedCommit is the commit the Go toolchain recorded when it built the
// binary from a git checkout (not with -buildvcs=false), or "unknown".
func stampedCommit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return unknown
}
