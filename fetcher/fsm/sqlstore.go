package fsm

// The runs' table, fsm_runs (migration 0005_fsm_runs.sql), is this
// package's: its rows are RunRecords, and these are its only queries
// outside the database's cross-table upkeep (pruning and retention, which
// join it with the records runs work on).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// ErrRunFinished is wrapped by Checkpoint for a run already in a terminal
// state: terminal rows never change.
var ErrRunFinished = errors.New("fsm: run already finished")

// SQLiteStore keeps runs in the fsm_runs table of the project's database.
type SQLiteStore struct {
	db *metadata.DB
}

// NewSQLiteStore returns the Store over db. A store over a database opened
// read-only lists runs and refuses to change them.
func NewSQLiteStore(db *metadata.DB) *SQLiteStore { return &SQLiteStore{db: db} }

var _ Store = (*SQLiteStore)(nil)

const runColumns = `run_id, fsm, idempotency_id, parent_id, run_after, queue, request, response,
	transition, state, attempts, last_error, created_at, updated_at, started_at, finished_at`

type rowScanner interface{ Scan(dest ...any) error }

func scanRun(s rowScanner) (RunRecord, error) {
	var (
		r                 RunRecord
		runAfter          string
		created, updated  int64
		started, finished sql.NullInt64
		request, response string
	)
	if err := s.Scan(&r.ID, &r.FSM, &r.IdempotencyID, &r.Parent, &runAfter, &r.Queue, &request, &response,
		&r.Transition, &r.State, &r.Attempts, &r.LastError, &created, &updated, &started, &finished); err != nil {
		return RunRecord{}, err
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

func nullNanos(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixNano(), Valid: true}
}

// CreateRun implements Store: the lookup of a live run with r's FSM and
// idempotency id and the insert are one write transaction, so concurrent
// callers with one id get one run.
func (s *SQLiteStore) CreateRun(ctx context.Context, r RunRecord) (RunRecord, bool, error) {
	if r.ID == "" || r.FSM == "" || r.IdempotencyID == "" || r.Transition == "" {
		return RunRecord{}, false, fmt.Errorf("fsm: creating run %q of %q id %q: run id, fsm, idempotency id and transition are required", r.ID, r.FSM, r.IdempotencyID)
	}
	if !r.State.Valid() || r.State.Terminal() {
		return RunRecord{}, false, fmt.Errorf("fsm: creating run %s: state %q is not a live state", r.ID, r.State)
	}
	for _, id := range r.RunAfter {
		if id == "" || strings.ContainsAny(id, " \t\n") {
			return RunRecord{}, false, fmt.Errorf("fsm: creating run %s: run-after id %q is empty or has blanks", r.ID, id)
		}
	}
	if len(r.Response) == 0 {
		r.Response = []byte("null")
	}
	var (
		out     RunRecord
		created bool
	)
	err := s.db.WithTx(ctx, func(tx *sql.Tx) error {
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
			r.ID, r.FSM, r.IdempotencyID, r.Parent, strings.Join(r.RunAfter, " "), r.Queue,
			string(r.Request), string(r.Response), r.Transition, string(r.State), r.Attempts, r.LastError,
			r.CreatedAt.UnixNano(), r.UpdatedAt.UnixNano(), nullNanos(r.StartedAt), nullNanos(r.FinishedAt))
		if err != nil {
			return err
		}
		out, created = r, true
		return nil
	})
	if err != nil {
		return RunRecord{}, false, fmt.Errorf("fsm: creating run %s of %q id %q: %w", r.ID, r.FSM, r.IdempotencyID, err)
	}
	return out, created, nil
}

// Checkpoint implements Store in one statement: started_at is set the
// first time the run goes running, finished_at when it reaches a terminal
// state. A run already terminal wraps ErrRunFinished.
func (s *SQLiteStore) Checkpoint(ctx context.Context, c Checkpoint) error {
	if !c.State.Valid() {
		return fmt.Errorf("fsm: checkpoint of run %s: unknown state %q", c.RunID, c.State)
	}
	if c.Attempts < 0 {
		return fmt.Errorf("fsm: checkpoint of run %s: negative attempts %d", c.RunID, c.Attempts)
	}
	if s.db.ReadOnly() {
		return fmt.Errorf("fsm: checkpoint of run %s on %s: %w", c.RunID, s.db.Path(), metadata.ErrReadOnly)
	}
	at := c.At.UnixNano()
	var resp any
	if c.Response != nil {
		resp = string(c.Response)
	}
	res, err := s.db.Statements().ExecContext(ctx, `UPDATE fsm_runs SET
			state = ?1, transition = ?2, attempts = ?3, response = COALESCE(?4, response),
			last_error = ?5, updated_at = ?6,
			started_at = CASE WHEN started_at IS NULL AND ?1 = 'running' THEN ?6 ELSE started_at END,
			finished_at = CASE WHEN ?1 IN ('complete', 'aborted', 'failed') THEN ?6 ELSE NULL END
		WHERE run_id = ?7 AND state IN ('pending', 'running')`,
		string(c.State), c.Transition, c.Attempts, resp, c.LastError, at, c.RunID)
	if err != nil {
		return fmt.Errorf("fsm: checkpoint of run %s (state %s, transition %q): %w", c.RunID, c.State, c.Transition, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	r, err := s.GetRun(ctx, c.RunID)
	if err != nil {
		return fmt.Errorf("fsm: checkpoint of run %s: %w", c.RunID, err)
	}
	return fmt.Errorf("fsm: checkpoint of run %s to %s: run is %s: %w", c.RunID, c.State, r.State, ErrRunFinished)
}

// GetRun implements Store.
func (s *SQLiteStore) GetRun(ctx context.Context, runID string) (RunRecord, error) {
	r, err := scanRun(s.db.Statements().QueryRowContext(ctx, `SELECT `+runColumns+` FROM fsm_runs WHERE run_id = ?`, runID))
	if errors.Is(err, sql.ErrNoRows) {
		return RunRecord{}, fmt.Errorf("fsm: run %q: %w", runID, ErrRunNotFound)
	}
	if err != nil {
		return RunRecord{}, fmt.Errorf("fsm: reading run %q: %w", runID, err)
	}
	return r, nil
}

// UnfinishedRuns implements Store.
func (s *SQLiteStore) UnfinishedRuns(ctx context.Context) ([]RunRecord, error) {
	return s.queryRuns(ctx, `SELECT `+runColumns+` FROM fsm_runs
		WHERE state IN ('pending', 'running') ORDER BY created_at, run_id`)
}

// RunFilter selects runs for ListRuns; zero fields select everything.
type RunFilter struct {
	States []State // any of these states
	FSM    string  // this FSM only
	Limit  int     // at most this many, newest first; 0 = no limit
}

// ListRuns returns the runs f selects, newest first.
func (s *SQLiteStore) ListRuns(ctx context.Context, f RunFilter) ([]RunRecord, error) {
	var (
		where []string
		args  []any
	)
	if len(f.States) > 0 {
		marks := make([]string, len(f.States))
		for i, st := range f.States {
			if !st.Valid() {
				return nil, fmt.Errorf("fsm: listing runs: unknown state %q (want pending, running, complete, aborted or failed)", st)
			}
			marks[i] = "?"
			args = append(args, string(st))
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
	return s.queryRuns(ctx, q, args...)
}

func (s *SQLiteStore) queryRuns(ctx context.Context, q string, args ...any) ([]RunRecord, error) {
	rows, err := s.db.Statements().QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("fsm: listing runs: %w", err)
	}
	defer rows.Close()
	var out []RunRecord
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("fsm: listing runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("fsm: listing runs: %w", err)
	}
	return out, nil
}
