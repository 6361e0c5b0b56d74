package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

// defaultConfigPath is read by subcommands when --config is not given, and
// only if it exists.
const defaultConfigPath = "/etc/containerd-flyio-snapshotter/config.toml"

// configPath is the --config flag: it remembers whether the user set it, so
// a missing default file means "built-in defaults" while a missing explicit
// file is an error.
type configPath struct {
	path string
	set  bool
}

func (c *configPath) String() string { return c.path }

func (c *configPath) Set(v string) error {
	if v == "" {
		return errors.New("must name a file")
	}
	c.path, c.set = v, true
	return nil
}

// configFlags holds the values of the flags addConfigFlags registered. One
// process runs one subcommand, so one set of flags is enough.
var configFlags = struct {
	config configPath
	db     string
}{config: configPath{path: defaultConfigPath}}

// addConfigFlags registers --config FILE on fs. loadConfig applies it after
// fs is parsed.
func addConfigFlags(fs *flag.FlagSet) {
	fs.Var(&configFlags.config, "config", "configuration `FILE`; the default file is read only if it exists")
}

// addDBFlags registers --config FILE and --db PATH on fs, for the
// subcommands that open the database themselves. loadConfig applies them
// after fs is parsed.
func addDBFlags(fs *flag.FlagSet) {
	addConfigFlags(fs)
	fs.StringVar(&configFlags.db, "db", "", "SQLite database `PATH`, overriding the config's metadata.path")
}

// loadConfig loads the configuration chosen by --config (the built-in
// defaults when the flag was not given and the default file does not exist)
// and applies --db over metadata.path.
func loadConfig() (*plugin.Config, error) {
	path := configFlags.config.path
	if !configFlags.config.set {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			path = ""
		}
	}
	cfg, err := plugin.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	if configFlags.db != "" {
		abs, err := filepath.Abs(configFlags.db)
		if err != nil {
			return nil, fmt.Errorf("--db %q: %w", configFlags.db, err)
		}
		cfg.Metadata.Path = abs
	}
	return cfg, nil
}

// The values of --format, the same on every subcommand that prints a
// result: table is what a person reads (an aligned table for listings,
// a line per result otherwise), json is for scripts.
const (
	formatTable = "table"
	formatJSON  = "json"
	// formatText is pull's former name of table, still accepted there
	// (with a warning) so that operators' scripts keep working for one
	// release.
	formatText = "text"
)

// formatFlag is --format: table or json (and, where textAlias is set,
// text as a deprecated spelling of table).
type formatFlag struct {
	value     string
	textAlias bool
	cmd       string // the subcommand, for the deprecation warning
}

// addFormatFlag registers --format FORMAT (default table) on fs with usage
// describing what each format prints.
func addFormatFlag(fs *flag.FlagSet, usage string) *formatFlag {
	f := &formatFlag{value: formatTable, cmd: fs.Name()}
	fs.Var(f, "format", usage)
	return f
}

// defaultFormatUsage is --format's usage for a subcommand whose JSON is
// one document on stdout.
const defaultFormatUsage = "output `FORMAT`: table (for people) or json (one JSON document on stdout, for scripts)"

func (f *formatFlag) String() string {
	if f == nil {
		return ""
	}
	return f.value
}

// Set accepts table or json; an error names the values allowed (the flag
// package adds the flag's name).
func (f *formatFlag) Set(v string) error {
	switch {
	case v == formatTable || v == formatJSON:
		f.value = v
	case v == formatText && f.textAlias:
		warnDeprecated(f.cmd, "--format text", "--format table")
		f.value = formatTable
	default:
		return fmt.Errorf("must be table or json, got %q", v)
	}
	return nil
}

// json reports whether --format json was asked for.
func (f *formatFlag) json() bool { return f.value == formatJSON }

// warnDeprecated tells a person or a script's log on stderr that old still
// works but is to be replaced by replacement before the next release drops
// it. stdout is left alone: it is the command's output.
func warnDeprecated(cmd, old, replacement string) {
	fmt.Fprintf(os.Stderr, "containerd-flyio-snapshotter %s: warning: %s is deprecated and will be removed in the next release; use %s\n", cmd, old, replacement)
}

// addControlSocketFlag registers --control-socket PATH on fs (the daemon's
// control socket, daemon.control_socket) into dst, and --socket as its
// deprecated spelling: before, --socket named the control socket on the
// subcommands that talk to the daemon but the snapshots socket on serve.
func addControlSocketFlag(fs *flag.FlagSet, dst *string) {
	fs.StringVar(dst, "control-socket", "", "control socket `PATH` of the daemon, overriding daemon.control_socket")
	fs.Func("socket", "deprecated spelling of --control-socket `PATH` (removed in the next release)", func(v string) error {
		warnDeprecated(fs.Name(), "--socket", "--control-socket (--socket means daemon.socket on serve)")
		*dst = v
		return nil
	})
}
