package main

import (
	"os"
	"strings"
	"testing"
)

func TestPoolHelp(t *testing.T) {
	for _, args := range [][]string{{"pool", "--help"}, {"pool", "status", "--help"}, {"pool", "ls", "--help"}} {
		code, out, _ := runCommand(t, nil, args...)
		if code != 0 || !strings.HasPrefix(out, "Usage: containerd-flyio-snapshotter "+strings.Join(args[:len(args)-1], " ")) {
			t.Errorf("%v = %d, %q", args, code, out)
			continue
		}
		if len(args) == 3 {
			for _, flag := range []string{"-config", "-format"} {
				if !strings.Contains(out, flag) {
					t.Errorf("%v does not document %s: %q", args, flag, out)
				}
			}
		}
	}
	if _, out, _ := runCommand(t, nil, "pool", "ls", "--help"); !strings.Contains(out, "-db") || !strings.Contains(out, "-check") {
		t.Errorf("pool ls --help lacks --db or --check: %q", out)
	}
}

func TestPoolUsageErrors(t *testing.T) {
	cfg, root := tempConfig(t, "")
	cases := []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"pool"}, 2, ""},
		{[]string{"pool", "resize"}, 2, `unknown pool subcommand "resize"`},
		{[]string{"pool", "status", "--config", cfg, "--format", "yaml"}, 2, `must be table or json, got "yaml"`},
		{[]string{"pool", "status", "--config", cfg, "extra"}, 2, `unexpected argument "extra"`},
		// No such pool in the kernel: reported, and nothing is created.
		{[]string{"pool", "status", "--config", cfg}, 1, `pool "flyio-test-never-created" is not active`},
	}
	for _, tc := range cases {
		code, _, errOut := runCommand(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.inStderr) {
			t.Errorf("%v = %d, %q; want %d and %q", tc.args, code, errOut, tc.code, tc.inStderr)
		}
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("pool status created %s: %v", root, err)
	}
}
