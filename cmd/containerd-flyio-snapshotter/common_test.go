package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

// resetConfigFlags restores the flag state a fresh process starts with.
func resetConfigFlags(t *testing.T) {
	t.Helper()
	configFlags.config = configPath{path: defaultConfigPath}
	configFlags.db = ""
	t.Cleanup(func() {
		configFlags.config = configPath{path: defaultConfigPath}
		configFlags.db = ""
	})
}

// loadWithFlags parses args as a subcommand with addConfigFlags would and
// returns loadConfig's result.
func loadWithFlags(t *testing.T, args ...string) (*plugin.Config, error) {
	t.Helper()
	resetConfigFlags(t)
	fs := newFlagSet("x", "x", "x")
	addConfigFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		t.Fatal(err)
	}
	return loadConfig()
}

func TestConfigFlags(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(cfgFile, []byte("[daemon]\nroot_dir = \""+dir+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[queues]\ndownloads = 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.toml")

	ok := []struct {
		name   string
		args   []string
		wantDB string
	}{
		{"explicit file derives the db from its root_dir", []string{"--config", cfgFile}, filepath.Join(dir, "metadata.db")},
		{"--db overrides, made absolute", []string{"--config", cfgFile, "--db", "rel/other.db"}, filepath.Join(wd, "rel/other.db")},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadWithFlags(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Metadata.Path != tc.wantDB {
				t.Errorf("metadata.path = %q, want %q", cfg.Metadata.Path, tc.wantDB)
			}
		})
	}
	failing := []struct {
		name, file, want string
	}{
		{"explicit missing file is an error", missing, missing},
		{"bad file names the key", bad, "queues.downloads"},
	}
	for _, tc := range failing {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadWithFlags(t, "--config", tc.file)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
	t.Run("missing default file means defaults", func(t *testing.T) {
		resetConfigFlags(t)
		configFlags.config.path = missing
		cfg, err := loadConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Daemon.RootDir != "/var/lib/containerd-flyio-snapshotter" {
			t.Errorf("root_dir = %q, want the built-in default", cfg.Daemon.RootDir)
		}
	})
}
