package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
)

// Version and Commit name the build; the Makefile's build and release
// targets set them with -ldflags "-X <this package>.Version=... -X
// <this package>.Commit=...", and a plain `go build` leaves these values.
var (
	Version = "dev"
	Commit  = "unknown"
)

// BuildInfo is what `version` prints: what a bug report or an upgrade
// needs to name this binary.
type BuildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
	// SQLiteVersion is the SQLite library compiled into the binary; empty
	// for a binary without the database.
	SQLiteVersion string `json:"sqlite_version,omitempty"`
	Platform      string `json:"platform"` // GOOS/GOARCH
}

// RegisterVersion registers the `version` subcommand. sqlite, when not
// nil, names the SQLite library compiled in; it is called only when the
// version is printed.
func RegisterVersion(sqlite func() string) {
	Register(&Command{
		Name:    "version",
		Summary: "print the version and build information",
		Run: func(ctx context.Context, args []string) error {
			return runVersion(args, os.Stdout, sqlite)
		},
	})
}

// currentBuild is this binary's BuildInfo, with the SQLite version sqlite
// gives (none when nil).
func currentBuild(sqlite func() string) BuildInfo {
	b := BuildInfo{Version: Version, Commit: Commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if sqlite != nil {
		b.SQLiteVersion = sqlite()
	}
	return b
}

func runVersion(args []string, stdout io.Writer, sqlite func() string) error {
	what := "the Go toolchain"
	if sqlite != nil {
		what += ", the SQLite library compiled in"
	}
	fs := NewFlagSet("version", "version [--format table|json]", fmt.Sprintf(`
Prints the version of this binary, the commit it was built from, %s,
and the platform. --version before any command is the same as 'version'.`, what))
	format := AddFormatFlag(fs, DefaultFormatUsage)
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return UsageError(fs, fmt.Sprintf("unexpected argument %q (version takes only flags)", fs.Arg(0)))
	}
	b := currentBuild(sqlite)
	if format.JSON() {
		return WriteJSON(stdout, b)
	}
	lib := ""
	if b.SQLiteVersion != "" {
		lib = ", SQLite " + b.SQLiteVersion
	}
	_, err := fmt.Fprintf(stdout, "%s %s (commit %s, %s%s, %s)\n", Program, b.Version, b.Commit, b.GoVersion, lib, b.Platform)
	return err
}
