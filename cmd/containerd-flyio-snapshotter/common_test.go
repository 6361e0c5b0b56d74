package main

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

// resetConfigFlags restores the flag state a fresh process starts with.
func resetConfigFlags(t *testing.T) {
	t.Helper()
	cli.Config = cli.ConfigChoice{Path: cli.DefaultConfigPath}
	t.Cleanup(func() { cli.Config = cli.ConfigChoice{Path: cli.DefaultConfigPath} })
}

// loadWithFlags parses args as a subcommand with cli.AddDBFlags would and
// returns loadConfig's result.
func loadWithFlags(t *testing.T, args ...string) (*plugin.Config, error) {
	t.Helper()
	resetConfigFlags(t)
	fs := cli.NewFlagSet("x", "x", "x")
	cli.AddDBFlags(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
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
		cli.Config.Path = missing
		cfg, err := loadConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Daemon.RootDir != "/var/lib/containerd-flyio-snapshotter" {
			t.Errorf("root_dir = %q, want the built-in default", cfg.Daemon.RootDir)
		}
	})
}

// TestUsageErrorIsOneLine checks what a person and a script piping the
// output (to jq, say) see of a usage error: exit status 2, stdout empty,
// and on stderr one line naming the command and the problem, then one
// pointing to that command's --help (not its whole description). Flags are
// spelled --name.
func TestUsageErrorIsOneLine(t *testing.T) {
	for _, c := range []struct {
		args    []string
		command string // the words the message and --help name
		problem string
	}{
		{[]string{"ls", "images", "--frobnicate"}, "ls", "unknown flag --frobnicate"},
		{[]string{"ls", "images", "-q", "--format", "json"}, "ls", "-q and --format json contradict each other"},
		{[]string{"ls", "volumes"}, "ls", `unknown kind "volumes"`},
		{[]string{"pull"}, "pull", "pull takes exactly one"},
		{[]string{"pool", "status", "--format"}, "pool status", "flag needs an argument: --format"},
		{[]string{"pool", "quarantine", "delete", "abc"}, "pool quarantine delete", `thin id "abc": must be a number`},
		{[]string{"db"}, "db", "name a subcommand"},
		{[]string{"db", "migrate", "--to", "9999"}, "db migrate", "--to 9999: want a schema version"},
		{[]string{"db", "backup"}, "db backup", "want one argument DEST"},
		// A script's unset variable: not the configured database, silently.
		{[]string{"db", "migrate", "--db", ""}, "db migrate", `invalid value "" for flag --db: must name a database file`},
		{[]string{"ls", "images", "--db="}, "ls", `invalid value "" for flag --db: must name a database file`},
		{[]string{"db", "backup", ""}, "db backup", "DEST must not be empty"},
		// Likewise for the daemon's sockets: not the configured daemon's.
		{[]string{"pull", "s3://b/k", "--control-socket", ""}, "pull", `invalid value "" for flag --control-socket: must name a socket`},
		{[]string{"rm", "--socket=", "x"}, "rm", `invalid value "" for flag --socket: must name a socket`},
		{[]string{"activate", "x", "--control-socket="}, "activate", `invalid value "" for flag --control-socket: must name a socket`},
		// (A configuration that cannot be read keeps serve from starting
		// a daemon on the host's paths should the flag pass.)
		{[]string{"serve", "--config", "/nonexistent/config.toml", "--socket", ""}, "serve", `invalid value "" for flag --socket: must name a socket`},
		{[]string{"serve", "--config", "/nonexistent/config.toml", "--control-socket="}, "serve", `invalid value "" for flag --control-socket: must name a socket`},
		{[]string{"serve", "--config", "/nonexistent/config.toml", "--metrics-address="}, "serve", `invalid value "" for flag --metrics-address: must name HOST:PORT`},
		{[]string{"validate"}, "validate", "expected exactly one FILE.tar"},
		{[]string{"rm"}, "rm", "rm takes at least one REF"},
		{[]string{"activate", "a", "b"}, "activate", "activate takes exactly one REF"},
		{[]string{"version", "extra"}, "version", `unexpected argument "extra"`},
		{[]string{"serve", "extra"}, "serve", `unexpected argument "extra"`},
		{[]string{"frobnicate"}, "", `unknown command "frobnicate"`},
	} {
		code, out, errOut := runCommand(t, nil, c.args...)
		prefix := "containerd-flyio-snapshotter: "
		see := "See 'containerd-flyio-snapshotter --help'."
		if c.command != "" {
			prefix = "containerd-flyio-snapshotter " + c.command + ": "
			see = "See 'containerd-flyio-snapshotter " + c.command + " --help'."
		}
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if code != 2 || out != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], prefix) ||
			!strings.Contains(lines[0], c.problem) || lines[1] != see {
			t.Errorf("%v = exit %d, stdout %q, stderr %q; want 2, nothing on stdout, and on stderr %q...%q then %q",
				c.args, code, out, errOut, prefix, c.problem, see)
		}
		if strings.Contains(errOut, " -frobnicate") {
			t.Errorf("%v: a flag spelled with one dash: %q", c.args, errOut)
		}
	}
	// --help is not an error: the whole usage, on stdout.
	code, out, errOut := runCommand(t, nil, "ls", "--help")
	if code != 0 || errOut != "" || !strings.Contains(out, "\n  --config FILE\n") || !strings.Contains(out, "\n  --db PATH\n") || !strings.Contains(out, "\n  -q\n") {
		t.Errorf("ls --help = %d, stdout %q, stderr %q", code, out, errOut)
	}
	// No command at all lists the commands (on stderr: it is still exit 2).
	code, out, errOut = runCommand(t, nil)
	if code != 2 || out != "" || !strings.Contains(errOut, "Commands:") {
		t.Errorf("no command = %d, stdout %q, stderr %q; want 2 and the list of commands on stderr", code, out, errOut)
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

// TestVersionFlag checks that --version is the version subcommand, and
// that it names the version, the commit, Go, SQLite and the platform.
func TestVersionFlag(t *testing.T) {
	code, out, errOut := runCommand(t, nil, "--version")
	_, want, _ := runCommand(t, nil, "version")
	if code != 0 || out != want || errOut != "" {
		t.Errorf("--version = %d, %q, %q; want %q", code, out, errOut, want)
	}
	line := fmt.Sprintf("containerd-flyio-snapshotter %s (commit %s, %s, SQLite %s, %s/%s)\n",
		cli.Version, cli.Commit, runtime.Version(), metadata.SQLiteVersion(), runtime.GOOS, runtime.GOARCH)
	if out != line {
		t.Errorf("--version = %q, want %q", out, line)
	}
	if !regexp.MustCompile(`^3\.\d+\.\d+$`).MatchString(metadata.SQLiteVersion()) {
		t.Errorf("SQLite version %q is not 3.x.y", metadata.SQLiteVersion())
	}
}
