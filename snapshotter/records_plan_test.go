package snapshotter

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
)

// queryPlan returns SQLite's plan for q, one line per step.
func queryPlan(t *testing.T, d *metadata.DB, q string, args ...any) string {
	t.Helper()
	rows, err := d.Statements().QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+q, args...)
	if err != nil {
		t.Fatalf("explain %s: %v", q, err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestHotPathQueriesUseIndexes checks the queries that run on every
// Prepare and on containerd's walks by label or parent read no table from
// end to end: a plan step "SCAN <table>" without an index grows with the
// number of rows.
func TestHotPathQueriesUseIndexes(t *testing.T) {
	d := metadatatest.Open(t)
	const ref = "containerd.io/snapshot.ref"
	label, err := labelExpr("s", ref)
	if err != nil {
		t.Fatal(err)
	}
	parent := "default/1/sha256:p"
	cases := map[string]struct {
		q    string
		args []any
	}{
		"RefTarget": {refTargetSQL(label), []any{"p", "t"}},
	}
	for name, f := range map[string]snapshotFilter{
		"walk by ref label and parent": {Labels: map[string]string{ref: "sha256:x"}, Parent: &parent},
		"walk by parent":               {Parent: &parent},
		"walk by key":                  {Key: "k"},
	} {
		q, args, err := snapshotsWhereSQL(f)
		if err != nil {
			t.Fatal(err)
		}
		cases[name] = struct {
			q    string
			args []any
		}{q, args}
	}
	for name, c := range cases {
		plan := queryPlan(t, d, c.q, c.args...)
		for _, line := range strings.Split(plan, "\n") {
			if strings.HasPrefix(line, "SCAN ") && !strings.HasPrefix(line, "SCAN (subquery") && !strings.Contains(line, "INDEX") {
				t.Errorf("%s: full scan %q in plan:\n%s", name, line, plan)
			}
			// The snapshotter keeps every record in one namespace: an
			// index searched on the namespace alone reads every row.
			if strings.HasSuffix(line, "(namespace=?)") {
				t.Errorf("%s: search on the namespace alone %q in plan:\n%s", name, line, plan)
			}
		}
		if testing.Verbose() {
			fmt.Printf("%s:\n%s\n", name, plan)
		}
	}
	if _, err := labelExpr("s", `a"b`); err == nil {
		t.Error(`labelExpr accepted a label key with a quote`)
	}
}
