package metadata

// Typed queries for the state-machine runs (migration 0005_fsm_runs.sql).
// The runner (fetcher/fsm) keeps each run's whole durable
// state in one fsm_runs row; the CLI lists them read-only.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Run states stored in fsm_runs.state.
const (
	RunPending  = "pending"
	RunRunning  = "running"
	RunComplete = "complete"
	RunAborted  = "aborted"
	RunFailed   = "failed"
)

// ErrRunNotFound is wrapped by run queries given an unknown run id; it
// wraps errdefs.ErrNotFound.
var ErrRunNotFound = fmt.Errorf("metadata: run: %w", errdefs.ErrNotFound)

// ErrRunFinished is wrapped by CheckpointRun for a run already in a terminal
// state: terminal rows never change.
var ErrRunFinished = errors.New("metadata: run already finished")

// Run is one fsm_runs row. Request and Response are JSON text.
type Run struct {
	ID            string
	FSM           string
	IdempotencyID string
	ParentID      string
	RunAfter      []string
	Queue         string
	Request       []byte
	Response      []byte
	Transition    string
	State         string // RunPending ... RunFailed
	Attempts      int
	LastError     string
	CreatedAt     time.Time
	UpdatedAt     time.Time
	StartedAt     time.Time // zero while NULL
	FinishedAt    time.Time // zero while NULL
}

// RunCheckpoint is one update of a run's mutable columns.
type RunCheckpoint struct {
	RunID      string
	State      string
	Transition string
	Attempts   int
	Response   []byte // nil keeps the stored response
	LastError  string
	At         time.Time
}

// RunFilter selects runs for ListRuns; zero fields select everything.
type RunFilter struct {
	States []string // any of these states
	FSM    string   // this FSM only
	Limit  int      // at most this many, newest first; 0 = no limit
}

func validRunState(s string) bool {
	switch s {
	case RunPending, RunRunning, RunComplete, RunAborted, RunFailed:
		return true
	}
	return false
}

func terminalRunState(s string) bool {
	return s == RunComplete || s == RunAborted || s == RunFailed
}

const runColumns = `run_id, fsm, idempotency_id, parent_id, run_after, queue, request, response,
	transition, state, attempts, last_error, created_at, updated_at, started_at, finished_at`

type runRowScanner interface{ Scan(dest ...any) error }

func scanRun(s runRowScanner) (Run, error) {
	var (
		r                 Run
		runAfter          string
		created, updated  int64
		started, finished sql.NullInt64
		request, response string
	)
	if err := s.Scan(&r.ID, &r.FSM, &r.IdempotencyID, &r.ParentID, &runAfter, &r.Queue, &request, &response,
		&r.Transition, &r.State, &r.Attempts, &r.LastError, &created, &updated, &started, &finished); err != nil {
		return Run{}, err
	}
	r.RunAfter = strings.Fields(runAfter)
	r.Request, r.Response = []byte(request), []byte(response)
	r.CreatedAt, r.UpdatedAt = time.Unix(0, created).UTC(), time.Unix(0, updated).UTC()
	if started.Valid {
		r.StartedAt = time.Unix(0, started.Int64).UTC()
	}
	if finished.Valid {
		r.FinishedAt = time.Unix(0, finished.Int64).UTC()
	}
	return r, nil
}

func runNullNanos(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixNano(), Valid: true}
}

// CreateRun inserts r unless a live (pending or running) run of the same FSM
// and idempotency id exists, in which case that run is returned with
// created=false. Lookup and insert are one write transaction, so concurrent
// callers with one id get one run.
func (d *DB) CreateRun(ctx context.Context, r Run) (Run, bool, error) {
	if r.ID == "" || r.FSM == "" || r.IdempotencyID == "" || r.Transition == "" {
		return Run{}, false, fmt.Errorf("metadata: creating run %q of %q id %q: run id, fsm, idempotency id and transition are required", r.ID, r.FSM, r.IdempotencyID)
	}
	if !validRunState(r.State) || terminalRunState(r.State) {
		return Run{}, false, fmt.Errorf("metadata: creating run %s: state %q is not a live state", r.ID, r.State)
	}
	for _, id := range r.RunAfter {
		if id == "" || strings.ContainsAny(id, " \t\n") {
			return Run{}, false, fmt.Errorf("metadata: creating run %s: run-after id %q is empty or has blanks", r.ID, id)
		}
	}
	if len(r.Response) == 0 {
		r.Response = []byte("null")
	}
	var (
		out     Run
		created bool
	)
	err := d.WithTx(ctx, func(tx *sql.Tx) error {
		row := tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM fsm_runs
			WHERE fsm = ? AND idempotency_id = ? AND state IN ('pending', 'running')`, r.FSM, r.IdempotencyID)
		existing, err := scanRun(row)
		if err == nil {
			out = existing
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO fsm_runs (`+runColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.ID, r.FSM, r.IdempotencyID, r.ParentID, strings.Join(r.RunAfter, " "), r.Queue,
			string(r.Request), string(r.Response), r.Transition, r.State, r.Attempts, r.LastError,
			r.CreatedAt.UnixNano(), r.UpdatedAt.UnixNano(), runNullNanos(r.StartedAt), runNullNanos(r.FinishedAt))
		if err != nil {
			return err
		}
		out, created = r, true
		return nil
	})
	if err != nil {
		return Run{}, false, fmt.Errorf("metadata: creating run %s of %q id %q: %w", r.ID, r.FSM, r.IdempotencyID, err)
	}
	return out, created, nil
}

// CheckpointRun applies c to a live run in one statement: state,
// transition, attempts, last error, updated_at and, unless c.Response is
// nil, the response. started_at is set the first time the run goes running,
// finished_at when it reaches a terminal state. An unknown run wraps
// ErrRunNotFound; a run already terminal wraps ErrRunFinished.
func (d *DB) CheckpointRun(ctx context.Context, c RunCheckpoint) error {
	if !validRunState(c.State) {
		return fmt.Errorf("metadata: checkpoint of run %s: unknown state %q", c.RunID, c.State)
	}
	if c.Attempts < 0 {
		return fmt.Errorf("metadata: checkpoint of run %s: negative attempts %d", c.RunID, c.Attempts)
	}
	if d.readOnly {
		return fmt.Errorf("metadata: checkpoint of run %s on %s: %w", c.RunID, d.path, ErrReadOnly)
	}
	at := c.At.UnixNano()
	var resp any
	if c.Response != nil {
		resp = string(c.Response)
	}
	res, err := d.db.ExecContext(ctx, `UPDATE fsm_runs SET
			state = ?1, transition = ?2, attempts = ?3, response = COALESCE(?4, response),
			last_error = ?5, updated_at = ?6,
			started_at = CASE WHEN started_at IS NULL AND ?1 = 'running' THEN ?6 ELSE started_at END,
			finished_at = CASE WHEN ?1 IN ('complete', 'aborted', 'failed') THEN ?6 ELSE NULL END
		WHERE run_id = ?7 AND state IN ('pending', 'running')`,
		c.State, c.Transition, c.Attempts, resp, c.LastError, at, c.RunID)
	if err != nil {
		return fmt.Errorf("metadata: checkpoint of run %s (state %s, transition %q): %w", c.RunID, c.State, c.Transition, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	r, err := d.GetRun(ctx, c.RunID)
	if err != nil {
		return fmt.Errorf("metadata: checkpoint of run %s: %w", c.RunID, err)
	}
	return fmt.Errorf("metadata: checkpoint of run %s to %s: run is %s: %w", c.RunID, c.State, r.State, ErrRunFinished)
}

// GetRun returns run id, or an error wrapping ErrRunNotFound.
func (d *DB) GetRun(ctx context.Context, id string) (Run, error) {
	r, err := scanRun(d.db.QueryRowContext(ctx, `SELECT `+runColumns+` FROM fsm_runs WHERE run_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Run{}, fmt.Errorf("metadata: run %q: %w", id, ErrRunNotFound)
	}
	if err != nil {
		return Run{}, fmt.Errorf("metadata: reading run %q: %w", id, err)
	}
	return r, nil
}

// UnfinishedRuns returns every pending or running run, oldest first.
func (d *DB) UnfinishedRuns(ctx context.Context) ([]Run, error) {
	return d.queryRuns(ctx, `SELECT `+runColumns+` FROM fsm_runs
		WHERE state IN ('pending', 'running') ORDER BY created_at, run_id`)
}

// ListRuns returns the runs f selects, newest first.
func (d *DB) ListRuns(ctx context.Context, f RunFilter) ([]Run, error) {
	var (
		where []string
		args  []any
	)
	if len(f.States) > 0 {
		marks := make([]string, len(f.States))
		for i, s := range f.States {
			if !validRunState(s) {
				return nil, fmt.Errorf("metadata: listing runs: unknown state %q (want pending, running, complete, aborted or failed)", s)
			}
			marks[i] = "?"
			args = append(args, s)
		}
		where = append(where, "state IN ("+strings.Join(marks, ", ")+")")
	}
	if f.FSM != "" {
		where = append(where, "fsm = ?")
		args = append(args, f.FSM)
	}
	q := `SELECT ` + runColumns + ` FROM fsm_runs`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at DESC, run_id DESC"
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit)
	}
	return d.queryRuns(ctx, q, args...)
}

// DeleteFinishedRuns removes terminal runs that finished before cutoff and
// returns how many went. Live runs are never removed.
func (d *DB) DeleteFinishedRuns(ctx context.Context, cutoff time.Time) (int64, error) {
	if d.readOnly {
		return 0, fmt.Errorf("metadata: deleting finished runs on %s: %w", d.path, ErrReadOnly)
	}
	res, err := d.db.ExecContext(ctx, `DELETE FROM fsm_runs
		WHERE state IN ('complete', 'aborted', 'failed') AND finished_at < ?`, cutoff.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("metadata: deleting runs finished before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return res.RowsAffected()
}

func (d *DB) queryRuns(ctx context.Context, q string, args ...any) ([]Run, error) {
	rows, err := d.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("metadata: listing runs: %w", err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("metadata: listing runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("metadata: listing runs: %w", err)
	}
	return out, nil
}
