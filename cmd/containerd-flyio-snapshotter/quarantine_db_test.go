package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestQuarantineChangeNeedsTheDaemonsDatabase: pool quarantine delete and
// release change a daemon's records, so they refuse (exit 1, before the
// pool is looked at) a database path where there is none, making nothing
// there, and a database at another schema version than the binary's,
// migrating nothing.
func TestQuarantineChangeNeedsTheDaemonsDatabase(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "typo", "metadata.db")
	for _, verb := range []string{"delete", "release"} {
		code, out, errOut := runCommand(t, nil, "pool", "quarantine", verb, "--db", missing, "7")
		if code != 1 || !strings.Contains(errOut, missing) || out != "" {
			t.Errorf("pool quarantine %s --db %s (no such file) = %d, %q, %q; want 1 naming the path", verb, missing, code, out, errOut)
		}
	}
	if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
		t.Errorf("the refused commands made %s: %v", filepath.Dir(missing), err)
	}

	older := filepath.Join(dir, "older.db")
	if code, _, errOut := runCommand(t, nil, "db", "migrate", "--db", older, "--to", "3"); code != 0 {
		t.Fatalf("db migrate --to 3: %d %s", code, errOut)
	}
	code, _, errOut := runCommand(t, nil, "pool", "quarantine", "release", "--db", older, "7")
	if code != 1 || !strings.Contains(errOut, "schema version 3") {
		t.Errorf("pool quarantine release on a database at schema version 3 = %d, %q; want 1 naming the version", code, errOut)
	}
	var c checkJSON
	decodeJSON(t, 1, &c, "db", "check", "--db", older, "--format", "json")
	if c.SchemaVersion != 3 {
		t.Errorf("the database after the refused release is at schema version %d, want 3 (not migrated)", c.SchemaVersion)
	}
	if _, err := os.Stat(older + ".pre-v" + strconv.Itoa(4)); !os.IsNotExist(err) {
		t.Errorf("a pre-migration copy was made: %v", err)
	}
}
