package main

import (
	"fmt"
	"path/filepath"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

// loadConfig loads the configuration chosen by --config (the built-in
// defaults when the flag was not given and the default file does not exist)
// and applies --db over metadata.path.
func loadConfig() (*plugin.Config, error) {
	cfg, err := plugin.LoadConfig(cli.Config.File())
	if err != nil {
		return nil, err
	}
	if db := cli.Config.DB; db != "" {
		abs, err := filepath.Abs(db)
		if err != nil {
			return nil, fmt.Errorf("--db %q: %w", db, err)
		}
		cfg.Metadata.Path = abs
	}
	return cfg, nil
}
