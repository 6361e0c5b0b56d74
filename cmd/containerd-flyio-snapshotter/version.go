package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

func init() {
	register(&command{
		name:    "version",
		summary: "print the version and build information",
		run: func(ctx context.Context, args []string) error {
			return runVersion(args, os.Stdout)
		},
	})
}

// buildInfo is what `version` prints: what a bug report or an upgrade
// needs to name this binary.
type buildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
	// SQLiteVersion is the SQLite library compiled into the binary.
	SQLiteVersion string `json:"sqlite_version"`
	Platform      string `json:"platform"` // GOOS/GOARCH
}

// currentBuild is this binary's buildInfo.
func currentBuild() buildInfo {
	return buildInfo{
		Version: version, Commit: commit, GoVersion: runtime.Version(),
		SQLiteVersion: metadata.SQLiteVersion(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}
}

func runVersion(args []string, stdout io.Writer) error {
	fs := newFlagSet("version", "version [--format table|json]", `
Prints the version of this binary, the commit it was built from, the Go
toolchain, the SQLite library compiled in, and the platform. --version
before any command is the same as 'version'.`)
	format := addFormatFlag(fs, defaultFormatUsage)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError(fs, fmt.Sprintf("unexpected argument %q (version takes only flags)", fs.Arg(0)))
	}
	b := currentBuild()
	if format.json() {
		return writeJSON(stdout, b)
	}
	_, err := fmt.Fprintf(stdout, "containerd-flyio-snapshotter %s (commit %s, %s, SQLite %s, %s)\n", b.Version, b.Commit, b.GoVersion, b.SQLiteVersion, b.Platform)
	return err
}
