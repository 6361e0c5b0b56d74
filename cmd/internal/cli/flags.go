package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// DefaultConfigPath is read by subcommands when --config is not given, and
// only if it exists.
const DefaultConfigPath = "/etc/containerd-flyio-snapshotter/config.toml"

// ConfigChoice is what --config and --db chose.
type ConfigChoice struct {
	// Path is the configuration file: --config, or DefaultConfigPath.
	Path string
	// Explicit is set when --config named Path: a missing file is then an
	// error, while a missing default file means the built-in defaults.
	Explicit bool
	// DB is --db, the database path overriding metadata.path; empty when
	// not given.
	DB string
}

// File is the configuration file to read: Path, or "" (the built-in
// defaults) when Path is the default file and does not exist. A missing
// file named with --config stays an error for the reader.
func (c ConfigChoice) File() string {
	if !c.Explicit {
		if _, err := os.Stat(c.Path); errors.Is(err, fs.ErrNotExist) {
			return ""
		}
	}
	return c.Path
}

// Config holds the values of the flags AddConfigFlags and AddDBFlags
// registered. One process runs one subcommand, so one set is enough.
var Config = ConfigChoice{Path: DefaultConfigPath}

// configPath is the --config flag.
type configPath struct{ c *ConfigChoice }

func (f configPath) String() string {
	if f.c == nil {
		return ""
	}
	return f.c.Path
}

func (f configPath) Set(v string) error {
	if v == "" {
		return errors.New("must name a file")
	}
	f.c.Path, f.c.Explicit = v, true
	return nil
}

// AddConfigFlags registers --config FILE on fs, into Config.
func AddConfigFlags(fs *flag.FlagSet) {
	fs.Var(configPath{&Config}, "config", "configuration `FILE`; the default file is read only if it exists")
}

// AddDBFlags registers --config FILE and --db PATH on fs, into Config, for
// the subcommands that open the database themselves.
func AddDBFlags(fs *flag.FlagSet) {
	AddConfigFlags(fs)
	fs.Func("db", "SQLite database `PATH`, overriding the config's metadata.path", func(v string) error {
		// An empty value is a script's unset variable: the command would
		// act on the configured database (the daemon's) instead of the
		// one the script meant.
		if v == "" {
			return errors.New("must name a database file")
		}
		Config.DB = v
		return nil
	})
}

// WriteJSON writes v to w as indented JSON: a subcommand's --format json.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// The values of --format, the same on every subcommand that prints a
// result: table is what a person reads (an aligned table for listings,
// a line per result otherwise), json is for scripts.
const (
	FormatTable = "table"
	FormatJSON  = "json"
	// formatText is pull's former name of table, still accepted there
	// (with a warning) so that operators' scripts keep working for one
	// release.
	formatText = "text"
)

// FormatFlag is --format: table or json (and, where textAlias is set,
// text as a deprecated spelling of table).
type FormatFlag struct {
	value     string
	textAlias bool
	cmd       string // the subcommand, for the deprecation warning
}

// AddFormatFlag registers --format FORMAT (default table) on fs with usage
// describing what each format prints.
func AddFormatFlag(fs *flag.FlagSet, usage string) *FormatFlag {
	f := &FormatFlag{value: FormatTable, cmd: fs.Name()}
	fs.Var(f, "format", usage)
	return f
}

// DefaultFormatUsage is --format's usage for a subcommand whose JSON is
// one document on stdout.
const DefaultFormatUsage = "output `FORMAT`: table (for people) or json (one JSON document on stdout, for scripts)"

// String is the format chosen (flag.Value).
func (f *FormatFlag) String() string {
	if f == nil {
		return ""
	}
	return f.value
}

// Set accepts table or json; an error names the values allowed (the flag
// package adds the flag's name).
func (f *FormatFlag) Set(v string) error {
	switch {
	case v == FormatTable || v == FormatJSON:
		f.value = v
	case v == formatText && f.textAlias:
		warnDeprecated(f.cmd, "--format text", "--format table")
		f.value = FormatTable
	default:
		return fmt.Errorf("must be table or json, got %q", v)
	}
	return nil
}

// JSON reports whether --format json was asked for.
func (f *FormatFlag) JSON() bool { return f.value == FormatJSON }

// warnDeprecated tells a person or a script's log on stderr that old still
// works but is to be replaced by replacement before the next release drops
// it. stdout is left alone: it is the command's output.
func warnDeprecated(cmd, old, replacement string) {
	fmt.Fprintf(os.Stderr, "%s %s: warning: %s is deprecated and will be removed in the next release; use %s\n", Program, cmd, old, replacement)
}

// addControlSocketFlag registers --control-socket PATH on fs (the daemon's
// control socket, daemon.control_socket) into dst, and --socket as its
// deprecated spelling: before, --socket named the control socket on the
// subcommands that talk to the daemon but the snapshots socket on serve.
func addControlSocketFlag(fs *flag.FlagSet, dst *string) {
	fs.Func("control-socket", "control socket `PATH` of the daemon, overriding daemon.control_socket", NonEmpty(dst, "a socket"))
	set := NonEmpty(dst, "a socket")
	fs.Func("socket", "deprecated spelling of --control-socket `PATH` (removed in the next release)", func(v string) error {
		if err := set(v); err != nil {
			return err
		}
		warnDeprecated(fs.Name(), "--socket", "--control-socket (--socket means daemon.socket on serve)")
		return nil
	})
}

// NonEmpty returns a flag.Func setter of dst that refuses an empty value,
// naming what the flag must name. Such a flag overrides a configuration
// key only when given a value, so an empty one (a script's unset
// variable) would leave the configured value in force, the default
// daemon's socket say, instead of the one the script meant.
func NonEmpty(dst *string, what string) func(string) error {
	return func(v string) error {
		if v == "" {
			return fmt.Errorf("must name %s", what)
		}
		*dst = v
		return nil
	}
}
