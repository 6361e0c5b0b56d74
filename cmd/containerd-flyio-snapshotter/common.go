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
