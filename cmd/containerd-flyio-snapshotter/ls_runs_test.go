package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// seedRuns records three runs in a fresh database and returns it opened
// read-only, as the CLI opens it.
func seedRuns(t *testing.T) *metadata.DB {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "metadata.db")
	db, err := metadata.Open(ctx, metadata.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	mk := func(id, fsmName, idem string, age time.Duration, cp *fsm.Checkpoint) {
		t.Helper()
		created := now.Add(-age)
		if _, _, err := fsm.NewSQLiteStore(db).CreateRun(ctx, fsm.RunRecord{ID: id, FSM: fsmName, IdempotencyID: idem, Queue: "downloads",
			Request: []byte(`{"s3_key":"images/a/1.tar"}`), Transition: "check-exists", State: fsm.StatePending,
			CreatedAt: created, UpdatedAt: created}); err != nil {
			t.Fatal(err)
		}
		if cp != nil {
			cp.RunID, cp.At = id, created.Add(time.Second)
			if err := fsm.NewSQLiteStore(db).Checkpoint(ctx, *cp); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("run-old", "download-image", "sha256:aaa", 3*time.Hour, &fsm.Checkpoint{State: fsm.StateFailed,
		Transition: "download", Attempts: 5, LastError: "transition \"download\" failed after 5 attempts:\n503 Slow Down"})
	mk("run-mid", "unpack-image", "sha256:aaa", 10*time.Minute, &fsm.Checkpoint{State: fsm.StateRunning,
		Transition: "extract-layers", Attempts: 2, Response: []byte(`{"device_id":"7"}`)})
	mk("run-new", "download-image", "sha256:bbb", 5*time.Minute, nil)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := metadata.Open(ctx, metadata.Options{Path: path, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ro.Close() })
	return ro
}

func TestLsRunsTable(t *testing.T) {
	db := seedRuns(t)
	var out bytes.Buffer
	if err := lsRuns(context.Background(), db, &out, "table", nil); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "RUN ") || !strings.Contains(lines[0], "LAST ERROR") {
		t.Fatalf("want a header and 3 rows, newest first:\n%s", out.String())
	}
	for i, want := range [][]string{
		{"run-new", "download-image", "sha256:bbb", "pending", "check-exists", " 0 ", "downloads", "5m"},
		{"run-mid", "unpack-image", "running", "extract-layers", " 2 ", "10m"},
		{"run-old", "failed", "download", " 5 ", "3h", `failed after 5 attempts: 503 Slow Down`},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("row %d %q lacks %q", i+1, lines[i+1], w)
			}
		}
	}
}

func TestLsRunsFiltersAndJSON(t *testing.T) {
	db := seedRuns(t)
	var out bytes.Buffer
	if err := lsRuns(context.Background(), db, &out, "json", []string{"state=running,failed", "fsm=download-image"}); err != nil {
		t.Fatal(err)
	}
	var runs []map[string]any
	if err := json.Unmarshal(out.Bytes(), &runs); err != nil {
		t.Fatalf("output is not a JSON array: %v\n%s", err, out.String())
	}
	if len(runs) != 1 || runs[0]["run_id"] != "run-old" || runs[0]["state"] != "failed" || runs[0]["attempts"] != float64(5) {
		t.Fatalf("state=running,failed fsm=download-image selected %v; want only run-old", runs)
	}
	if age, _ := runs[0]["age_seconds"].(float64); age < 3*3600 {
		t.Fatalf("age_seconds = %v, want at least 3h", runs[0]["age_seconds"])
	}
	if req, _ := runs[0]["request"].(map[string]any); req["s3_key"] != "images/a/1.tar" {
		t.Fatalf("request not embedded as JSON: %v", runs[0]["request"])
	}

	out.Reset()
	if err := lsRuns(context.Background(), db, &out, "json", []string{"limit=1"}); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &runs); err != nil || len(runs) != 1 || runs[0]["run_id"] != "run-new" {
		t.Fatalf("limit=1 gave %v (%v); want the newest run", runs, err)
	}

	for _, bad := range [][]string{{"state=done"}, {"color=red"}, {"fsm"}, {"limit=0"}} {
		if err := lsRuns(context.Background(), db, &out, "table", bad); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("filter %q: err = %v; want an error naming it", bad[0], err)
		}
		if err := lsRunsValidate(bad); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("validating filter %q: err = %v; want an error naming it", bad[0], err)
		}
	}
	if err := lsRuns(context.Background(), db, &out, "yaml", nil); err == nil || !strings.Contains(err.Error(), "yaml") {
		t.Errorf("format yaml: err = %v", err)
	}
}
