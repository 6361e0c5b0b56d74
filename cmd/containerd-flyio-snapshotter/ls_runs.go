package main

// `ls runs`: the state-machine runs (fetcher/fsm) as the database records
// them; the ls command (ls.go) dispatches here.

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// lsRunsUsage describes the filters of `ls runs` for ls.go's help text.
const lsRunsUsage = `runs [state=STATE[,STATE...]] [fsm=NAME] [limit=N]
    state-machine runs, newest first: state (pending, running, complete,
    aborted, failed), current transition, attempts, age and last error;
             -q: the run id`

// lsRuns writes the runs selected by filters (KEY=VALUE words: state=, fsm=,
// limit=) from db to w, as an aligned table (format "table" or ""), a JSON
// array (format "json") or the run ids one a line (formatIDs, ls -q). A
// bad filter or format is an error naming it.
func lsRuns(ctx context.Context, db *metadata.DB, w io.Writer, format string, filters []string) error {
	f, err := parseRunFilters(filters)
	if err != nil {
		return err
	}
	if format != "" && format != cli.FormatTable && format != cli.FormatJSON && format != formatIDs {
		return fmt.Errorf("ls runs: format %q: want table or json", format)
	}
	runs, err := fsm.NewSQLiteStore(db).ListRuns(ctx, f)
	if err != nil {
		return fmt.Errorf("ls runs: %w", err)
	}
	return writeRuns(w, runs, format, time.Now())
}

// lsRunsValidate checks `ls runs` filters without opening the database, so
// that ls can report a bad filter as a usage error (exit 2).
func lsRunsValidate(filters []string) error {
	_, err := parseRunFilters(filters)
	return err
}

// parseRunFilters turns state=, fsm= and limit= words into a RunFilter.
func parseRunFilters(words []string) (fsm.RunFilter, error) {
	var f fsm.RunFilter
	for _, w := range words {
		key, val, ok := strings.Cut(w, "=")
		if !ok || val == "" {
			return f, fmt.Errorf("ls runs: filter %q: want KEY=VALUE with KEY state, fsm or limit", w)
		}
		switch key {
		case "state":
			for _, s := range strings.Split(val, ",") {
				switch st := fsm.State(s); {
				case st.Valid():
					f.States = append(f.States, st)
				default:
					return f, fmt.Errorf("ls runs: filter %q: state %q is not pending, running, complete, aborted or failed", w, s)
				}
			}
		case "fsm":
			f.FSM = val
		case "limit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return f, fmt.Errorf("ls runs: filter %q: limit must be a positive integer", w)
			}
			f.Limit = n
		default:
			return f, fmt.Errorf("ls runs: filter %q: unknown key %q (want state, fsm or limit)", w, key)
		}
	}
	return f, nil
}

// runJSON is one run in `ls runs --format json`.
type runJSON struct {
	RunID         string          `json:"run_id"`
	FSM           string          `json:"fsm"`
	IdempotencyID string          `json:"idempotency_id"`
	ParentID      string          `json:"parent_id,omitempty"`
	RunAfter      []string        `json:"run_after,omitempty"`
	Queue         string          `json:"queue,omitempty"`
	State         string          `json:"state"`
	Transition    string          `json:"transition"`
	Attempts      int             `json:"attempts"`
	LastError     string          `json:"last_error,omitempty"`
	AgeSeconds    float64         `json:"age_seconds"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	StartedAt     *time.Time      `json:"started_at,omitempty"`
	FinishedAt    *time.Time      `json:"finished_at,omitempty"`
	Request       json.RawMessage `json:"request"`
	Response      json.RawMessage `json:"response"`
}

// writeRuns renders runs; ages are taken at now.
func writeRuns(w io.Writer, runs []fsm.RunRecord, format string, now time.Time) error {
	if format == cli.FormatJSON {
		out := make([]runJSON, 0, len(runs))
		for _, r := range runs {
			j := runJSON{
				RunID: r.ID, FSM: r.FSM, IdempotencyID: r.IdempotencyID, ParentID: r.Parent,
				RunAfter: r.RunAfter, Queue: r.Queue, State: string(r.State), Transition: r.Transition,
				Attempts: r.Attempts, LastError: r.LastError, AgeSeconds: now.Sub(r.CreatedAt).Seconds(),
				CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
				Request: rawOrNull(r.Request), Response: rawOrNull(r.Response),
			}
			if !r.StartedAt.IsZero() {
				j.StartedAt = &r.StartedAt
			}
			if !r.FinishedAt.IsZero() {
				j.FinishedAt = &r.FinishedAt
			}
			out = append(out, j)
		}
		return cli.WriteJSON(w, out)
	}
	if format == formatIDs {
		for _, r := range runs {
			if _, err := fmt.Fprintln(w, r.ID); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tFSM\tID\tSTATE\tTRANSITION\tATTEMPTS\tQUEUE\tAGE\tLAST ERROR")
	for _, r := range runs {
		queue := r.Queue
		if queue == "" {
			queue = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", shown(r.ID), shown(r.FSM), shown(shorten(r.IdempotencyID, 40)), shown(string(r.State)),
			shown(r.Transition), r.Attempts, shown(queue), humanAge(now.Sub(r.CreatedAt)), shown(shorten(oneLine(r.LastError), 80)))
	}
	return tw.Flush()
}

func rawOrNull(b []byte) json.RawMessage {
	if len(b) == 0 || !json.Valid(b) {
		return json.RawMessage("null")
	}
	return json.RawMessage(b)
}

// humanAge renders d with one unit: 45s, 12m, 5h, 3d.
func humanAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// shorten cuts s to at most n runes, marking the cut with "...".
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-3]) + "..."
}
