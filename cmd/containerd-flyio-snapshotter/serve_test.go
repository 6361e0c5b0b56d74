package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// testPoolName is the pool of tempConfig's configs, which no test makes:
// of this process, since a daemon locks its pool's name host-wide, and two
// runs of the tests on one host must not refuse each other's daemons.
var testPoolName = fmt.Sprintf("flyio-test-never-created-%d", os.Getpid())

// tempConfig writes a config whose every path is under a temporary
// directory, so a command that got past validation could not touch the
// host's real paths.
func tempConfig(t *testing.T, extra string) (path, root string) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "root")
	path = filepath.Join(t.TempDir(), "config.toml")
	body := "[daemon]\nroot_dir = \"" + root + "\"\nsocket = \"" + filepath.Join(root, "s.sock") + "\"\ncontrol_socket = \"\"\n" +
		"[pool]\nname = \"" + testPoolName + "\"\n" + extra
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, root
}

func TestServeHelp(t *testing.T) {
	code, out, _ := runCommand(t, nil, "serve", "--help")
	if code != 0 || !strings.HasPrefix(out, "Usage: containerd-flyio-snapshotter serve") {
		t.Fatalf("serve --help = %d, %q", code, out)
	}
	for _, want := range []string{"-config", "-db", "-socket", "-metrics-address", "-log-level", "SIGTERM", "0660"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --help does not mention %s:\n%s", want, out)
		}
	}
}

func TestServeRejectsBadFlagsBeforeStarting(t *testing.T) {
	cfg, root := tempConfig(t, "")
	missing := filepath.Join(t.TempDir(), "missing.toml")
	bad, _ := tempConfig(t, "bogus_key = 1\n")
	cases := []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"serve", "--config", cfg, "now"}, 2, `unexpected argument "now"`},
		{[]string{"serve", "--config", cfg, "--frobnicate"}, 2, "unknown flag --frobnicate"},
		{[]string{"serve", "--config", cfg, "--log-level", "loud"}, 2, `daemon.log_level: must be one of trace, debug, info, warn, error, fatal, panic, got "loud"`},
		{[]string{"serve", "--config", cfg, "--socket", "relative.sock"}, 2, `daemon.socket: must be an absolute path, got "relative.sock"`},
		{[]string{"serve", "--config", cfg, "--metrics-address", "9123"}, 2, "daemon.metrics_address: must be host:port"},
		{[]string{"serve", "--config", missing}, 1, missing},
		{[]string{"serve", "--config", bad}, 1, `unknown key "pool.bogus_key"`},
	}
	for _, tc := range cases {
		code, _, errOut := runCommand(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.inStderr) {
			t.Errorf("%v = %d, %q; want %d and %q", tc.args[1:], code, errOut, tc.code, tc.inStderr)
		}
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("a rejected serve created its root directory: %v", err)
	}
}

// TestServeLogFormat checks what a log collector relies on: with
// daemon.log_format = "json" every line serve writes is one JSON object
// whose time has nanoseconds, and --log-format text overrides it with
// key=value lines. The daemon stops after its first log line, at the
// database, whose directory is a regular file, on any host.
func TestServeLogFormat(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _ := tempConfig(t, "[metadata]\npath = \""+filepath.Join(notDir, "metadata.db")+"\"\n")
	body, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(body), "[daemon]\n", "[daemon]\nlog_format = \"json\"\n", 1)), 0o644)
	nano := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}(Z|[+-]\d\d:\d\d)$`)

	_, _, errOut := runCommand(t, nil, "serve", "--config", cfg)
	var logged int
	for _, line := range strings.Split(strings.TrimSpace(errOut), "\n") {
		if strings.HasPrefix(line, "containerd-flyio-snapshotter serve: ") {
			continue // the exit message, not a log line
		}
		var entry struct {
			Time  string `json:"time"`
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line is not JSON: %q (%v)", line, err)
		}
		if !nano.MatchString(entry.Time) || entry.Level == "" || entry.Msg == "" {
			t.Errorf("log line %q: time %q (want RFC 3339 with nanoseconds), level %q, msg %q", line, entry.Time, entry.Level, entry.Msg)
		}
		logged++
	}
	if logged == 0 {
		t.Fatalf("serve logged nothing: %q", errOut)
	}

	_, _, errOut = runCommand(t, nil, "serve", "--config", cfg, "--log-format", "text")
	first, _, _ := strings.Cut(errOut, "\n")
	m := regexp.MustCompile(`^time="([^"]+)" level=info msg=starting `).FindStringSubmatch(first)
	if m == nil || !nano.MatchString(m[1]) {
		t.Errorf("--log-format text: first line %q, want time=\"<RFC 3339 with nanoseconds>\" level=info msg=starting", first)
	}
	code, _, errOut := runCommand(t, nil, "serve", "--config", cfg, "--log-format", "xml")
	if code != 2 || !strings.Contains(errOut, `daemon.log_format: must be "text" or "json", got "xml"`) {
		t.Errorf("--log-format xml = %d, %q", code, errOut)
	}
}

// TestHugePagesOffFromStart runs what serve runs first, in a child
// process: the child executes itself again once, keeps its pid (systemd
// and the daemon lock see one process), and the image that goes on has
// transparent huge pages off (THP_enabled 0 in /proc/self/status).
func TestHugePagesOffFromStart(t *testing.T) {
	if os.Getenv("FLYIO_THP_HELPER") == "1" {
		err := hugePagesOffFromStart()
		status, _ := os.ReadFile("/proc/self/status")
		thp := "missing from /proc/self/status"
		if m := regexp.MustCompile(`(?m)^THP_enabled:\s*(\d+)$`).FindSubmatch(status); m != nil {
			thp = string(m[1])
		}
		fmt.Printf("pid %d, error %v, THP_enabled %s\n", os.Getpid(), err, thp)
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHugePagesOffFromStart$")
	cmd.Env = append(os.Environ(), "FLYIO_THP_HELPER=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("pid %d, error <nil>, THP_enabled 0\n", cmd.Process.Pid); string(out) != want {
		t.Fatalf("helper printed %q, want %q (once: the first image executes the second before printing)", out, want)
	}
}
