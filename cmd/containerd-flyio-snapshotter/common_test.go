package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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

func TestConfigFlags(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(cfgFile, []byte("[daemon]\nroot_dir = \""+dir+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("explicit file", func(t *testing.T) {
		resetConfigFlags(t)
		fs := newFlagSet("x", "x", "x")
		addConfigFlags(fs)
		if err := parseFlags(fs, []string{"--config", cfgFile}); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig()
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(dir, "metadata.db"); cfg.Metadata.Path != want {
			t.Errorf("metadata.path = %q, want %q (derived from the file's root_dir)", cfg.Metadata.Path, want)
		}
	})
	t.Run("db overrides", func(t *testing.T) {
		resetConfigFlags(t)
		fs := newFlagSet("x", "x", "x")
		addConfigFlags(fs)
		if err := parseFlags(fs, []string{"--config", cfgFile, "--db", "rel/other.db"}); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig()
		if err != nil {
			t.Fatal(err)
		}
		wd, _ := os.Getwd()
		if want := filepath.Join(wd, "rel/other.db"); cfg.Metadata.Path != want {
			t.Errorf("metadata.path = %q, want %q", cfg.Metadata.Path, want)
		}
	})
	t.Run("explicit missing file is an error", func(t *testing.T) {
		resetConfigFlags(t)
		fs := newFlagSet("x", "x", "x")
		addConfigFlags(fs)
		missing := filepath.Join(dir, "missing.toml")
		if err := parseFlags(fs, []string{"--config", missing}); err != nil {
			t.Fatal(err)
		}
		if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), missing) {
			t.Fatalf("err = %v, want one naming %s", err, missing)
		}
	})
	t.Run("missing default file means defaults", func(t *testing.T) {
		resetConfigFlags(t)
		configFlags.config.path = filepath.Join(dir, "absent-default.toml")
		cfg, err := loadConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Daemon.RootDir != "/var/lib/containerd-flyio-snapshotter" {
			t.Errorf("root_dir = %q, want the built-in default", cfg.Daemon.RootDir)
		}
	})
	t.Run("bad file names key", func(t *testing.T) {
		resetConfigFlags(t)
		bad := filepath.Join(dir, "bad.toml")
		os.WriteFile(bad, []byte("[queues]\ndownloads = 0\n"), 0o644)
		fs := newFlagSet("x", "x", "x")
		addConfigFlags(fs)
		if err := parseFlags(fs, []string{"--config", bad}); err != nil {
			t.Fatal(err)
		}
		if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), "queues.downloads") {
			t.Fatalf("err = %v, want one naming queues.downloads", err)
		}
	})
}
