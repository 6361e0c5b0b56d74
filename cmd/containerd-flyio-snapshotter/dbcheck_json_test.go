package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDBCheckJSONReportsADamagedDatabase: `db check --format json` on a
// database whose first page is damaged, so that it cannot even be opened,
// prints its one JSON object (ok false, the problem), exits 1 and leaves
// stderr quiet, as its --help promises for every problem it finds: a
// script reading stdout must not get nothing for the very damage the
// command looks for.
func TestDBCheckJSONReportsADamagedDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	populate(t, path, time.Now())
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The b-tree header of page 1, the schema's root page.
	if _, err := f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	code, out, errOut := runCommand(t, nil, "db", "check", "--db", path, "--format", "json")
	var got checkJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 1 || errOut != "" || got.OK || len(got.Problems) == 0 || got.DB != path {
		t.Errorf("db check --format json of a damaged database = %d, stdout %q (%v), stderr %q; want 1, a JSON object with ok false and the problem, nothing on stderr",
			code, out, err, errOut)
	}
}
