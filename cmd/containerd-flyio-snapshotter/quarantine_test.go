package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

func TestPoolQuarantineHelp(t *testing.T) {
	code, out, _ := runCommand(t, nil, "pool", "quarantine", "--help")
	if code != 0 || !strings.HasPrefix(out, "Usage: containerd-flyio-snapshotter pool quarantine ls|delete|release") {
		t.Fatalf("pool quarantine --help = %d, %q", code, out)
	}
	for _, want := range []string{"ls", "delete ID", "release ID", "stays", "quarantined"} {
		if !strings.Contains(out, want) {
			t.Errorf("pool quarantine --help does not mention %q:\n%s", want, out)
		}
	}
	for _, sub := range []string{"ls", "delete", "release"} {
		code, out, _ := runCommand(t, nil, "pool", "quarantine", sub, "--help")
		if code != 0 || !strings.HasPrefix(out, "Usage: containerd-flyio-snapshotter pool quarantine "+sub) || !strings.Contains(out, "-db") {
			t.Errorf("pool quarantine %s --help = %d, %q", sub, code, out)
		}
	}
	if _, out, _ := runCommand(t, nil, "pool", "--help"); !strings.Contains(out, "quarantine") {
		t.Errorf("pool --help does not list quarantine: %q", out)
	}
}

// seedQuarantine writes a database at the configured path (under root)
// holding two quarantined ids.
func seedQuarantine(t *testing.T, root string) {
	t.Helper()
	ctx := context.Background()
	db, err := metadata.Open(ctx, metadata.Options{Path: filepath.Join(root, "metadata.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.WithTx(ctx, func(tx *sql.Tx) error {
		q := snapshotter.RecordsTx(tx)
		if err := q.Quarantine(ctx, 42, "in the pool at start-up; no record or intent explains it", false, 1_800_000_000_000_000_000); err != nil {
			return err
		}
		return q.Quarantine(ctx, 43, "rollback could not delete it", true, 1_800_000_000_000_000_000)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestPoolQuarantineLs(t *testing.T) {
	cfg, root := tempConfig(t, "")
	seedQuarantine(t, root)
	code, out, errOut := runCommand(t, nil, "pool", "quarantine", "ls", "--config", cfg)
	if code != 0 {
		t.Fatalf("pool quarantine ls = %d, %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") ||
		!strings.Contains(lines[1], "42") || !strings.Contains(lines[1], "unknown") || !strings.Contains(lines[1], "2027-01-15T08:00:00Z") || !strings.Contains(lines[1], "start-up") ||
		!strings.Contains(lines[2], "43") || !strings.Contains(lines[2], "true") {
		t.Fatalf("pool quarantine ls (pool not active):\n%s", out)
	}
	code, out, errOut = runCommand(t, nil, "pool", "quarantine", "ls", "--config", cfg, "--format", "json")
	var rows []quarantineView
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 || rows[0].ThinID != 42 || rows[0].InPool != "unknown" || !rows[1].Deleted {
		t.Fatalf("pool quarantine ls --format json = %d, %q, %s", code, out, errOut)
	}
}

func TestPoolQuarantineUsageErrors(t *testing.T) {
	cfg, root := tempConfig(t, "")
	seedQuarantine(t, root)
	for _, tc := range []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"pool", "quarantine"}, 2, "name a subcommand"},
		{[]string{"pool", "quarantine", "purge"}, 2, `unknown pool quarantine subcommand "purge"`},
		{[]string{"pool", "quarantine", "delete", "--config", cfg}, 2, "name at least one quarantined thin id"},
		{[]string{"pool", "quarantine", "release", "--config", cfg, "0"}, 2, `thin id "0": must be a number from 1 to 16777215`},
		{[]string{"pool", "quarantine", "release", "--config", cfg, "16777216"}, 2, `thin id "16777216"`},
		{[]string{"pool", "quarantine", "delete", "--config", cfg, "x"}, 2, `thin id "x"`},
		{[]string{"pool", "quarantine", "ls", "--config", cfg, "extra"}, 2, `unexpected argument "extra"`},
		// Changing needs the pool: reported, and nothing is created.
		{[]string{"pool", "quarantine", "delete", "--config", cfg, "42"}, 1, `pool "` + testPoolName + `" is not active`},
		{[]string{"pool", "quarantine", "release", "--config", cfg, "43"}, 1, `pool "` + testPoolName + `" is not active`},
	} {
		code, _, errOut := runCommand(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.inStderr) {
			t.Errorf("%v = %d, %q; want %d and %q", tc.args, code, errOut, tc.code, tc.inStderr)
		}
	}
	// The quarantine is unchanged.
	code, out, _ := runCommand(t, nil, "pool", "quarantine", "ls", "--config", cfg)
	if code != 0 || strings.Count(out, "\n") != 3 {
		t.Errorf("quarantine after refused changes:\n%s", out)
	}
}
