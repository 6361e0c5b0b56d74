package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFlagsAfterOperands: the commands that take operands read flags
// written after them too, as pull, rm, activate, ls and validate do:
// `pool quarantine delete 7 --db PATH` opens PATH instead of taking --db
// for a thin id, and `db backup DEST --db PATH --force` copies PATH.
func TestFlagsAfterOperands(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "typo", "metadata.db")
	for _, verb := range []string{"delete", "release"} {
		code, out, errOut := runCommand(t, nil, "pool", "quarantine", verb, "7", "--db", missing)
		if code != 1 || out != "" || !strings.Contains(errOut, missing) {
			t.Errorf("pool quarantine %s 7 --db %s = %d, %q, %q; want 1 naming the database", verb, missing, code, out, errOut)
		}
	}
	path := filepath.Join(dir, "m.db")
	populate(t, path, time.Now())
	dest := filepath.Join(dir, "copy.db")
	if err := os.WriteFile(dest, []byte("old copy"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCommand(t, nil, "db", "backup", dest, "--db", path, "--force")
	if code != 0 || !strings.Contains(out, "backed up "+path+" to "+dest) {
		t.Fatalf("db backup DEST --db PATH --force = %d, %q, %q", code, out, errOut)
	}
	if code, out, _ := runCommand(t, nil, "db", "check", "--db", dest); code != 0 {
		t.Errorf("db check of the copy = %d, %q", code, out)
	}
	code, _, errOut = runCommand(t, nil, "db", "backup", dest, "extra", "--db", path)
	if code != 2 || !strings.Contains(errOut, "want one argument DEST, got 2 arguments") {
		t.Errorf("db backup DEST extra = %d, %q; want 2 counting the two operands", code, errOut)
	}
}
