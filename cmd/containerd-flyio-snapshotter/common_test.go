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
	addDBFlags(fs)
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

// TestUsageErrorsGoToStderr checks what a script piping the output (to jq,
// say) relies on: a usage error leaves stdout empty and puts the message,
// then the usage with flags spelled --name, on stderr; --help puts the
// usage on stdout.
func TestUsageErrorsGoToStderr(t *testing.T) {
	for _, args := range [][]string{
		{"ls", "images", "--frobnicate"},
		{"pull"},
		{"pool", "status", "--format"},
		{"db"},
		{"validate"},
		{},
	} {
		code, out, errOut := runCommand(t, nil, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "Usage: containerd-flyio-snapshotter") {
			t.Errorf("%v = exit %d, stdout %q, stderr %q; want 2, nothing on stdout, the usage on stderr", args, code, out, errOut)
		}
		if strings.Contains(errOut, "  -config") || strings.Contains(errOut, " -frobnicate") {
			t.Errorf("%v: a flag spelled with one dash: %q", args, errOut)
		}
	}
	code, out, errOut := runCommand(t, nil, "ls", "--help")
	if code != 0 || errOut != "" || !strings.Contains(out, "\n  --config FILE\n") || !strings.Contains(out, "\n  --db PATH\n") {
		t.Errorf("ls --help = %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = runCommand(t, nil, "ls", "images", "--frobnicate")
	if !strings.HasPrefix(errOut, "containerd-flyio-snapshotter ls: unknown flag --frobnicate\n") {
		t.Errorf("unknown flag message: %q", errOut)
	}
}

// TestFlagsOnlyWhereUsed checks that pull and activate, which talk to the
// daemon, do not offer --db (the daemon opens its own database).
func TestFlagsOnlyWhereUsed(t *testing.T) {
	for _, cmd := range []string{"pull", "activate", "validate"} {
		code, out, _ := runCommand(t, nil, cmd, "--help")
		if code != 0 || strings.Contains(out, "--db") || !strings.Contains(out, "--config FILE") {
			t.Errorf("%s --help = %d, %q: want --config and no --db", cmd, code, out)
		}
		code, _, errOut := runCommand(t, nil, cmd, "--db", "/tmp/x.db", "x")
		if code != 2 || !strings.Contains(errOut, "unknown flag --db") {
			t.Errorf("%s --db = %d, %q; want exit 2, unknown flag --db", cmd, code, errOut)
		}
	}
}

// TestVersionFlag checks that --version is the version subcommand.
func TestVersionFlag(t *testing.T) {
	code, out, errOut := runCommand(t, nil, "--version")
	_, want, _ := runCommand(t, nil, "version")
	if code != 0 || out != want || !strings.HasPrefix(out, "containerd-flyio-snapshotter ") || errOut != "" {
		t.Errorf("--version = %d, %q, %q; want %q", code, out, errOut, want)
	}
}

// TestPullImageArgument: pull takes an s3:// URL, or a bare path that the
// daemon resolves under its s3.bucket and s3.prefix (so the CLI sends no
// bucket).
func TestPullImageArgument(t *testing.T) {
	for _, c := range []struct {
		arg, bucket, key, err string
	}{
		{"s3://my-images/debian/", "my-images", "debian/", ""},
		{"debian/", "", "debian/", ""},
		{"base/1.tar", "", "base/1.tar", ""},
		{"/debian/", "", "", "without a leading '/'"},
		{"s3://only-bucket", "", "", "must name a bucket and a key"},
		{"http://x/y", "", "", "must be s3://"},
	} {
		bucket, key, err := parseImageArg(c.arg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %q %q %v, want an error with %q", c.arg, bucket, key, err, c.err)
			}
			continue
		}
		if err != nil || bucket != c.bucket || key != c.key {
			t.Errorf("%q: %q %q %v, want %q %q", c.arg, bucket, key, err, c.bucket, c.key)
		}
	}
}
