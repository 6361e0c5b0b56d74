package fsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// SQLiteStore keeps runs in the fsm_runs table of the project's database.
type SQLiteStore struct {
	db *metadata.DB
}

// NewSQLiteStore returns the Store over db (opened read-write).
func NewSQLiteStore(db *metadata.DB) *SQLiteStore { return &SQLiteStore{db: db} }

var _ Store = (*SQLiteStore)(nil)

// CreateRun implements Store.
func (s *SQLiteStore) CreateRun(ctx context.Context, r RunRecord) (RunRecord, bool, error) {
	got, created, err := s.db.CreateRun(ctx, metadata.Run{
		ID: r.ID, FSM: r.FSM, IdempotencyID: r.IdempotencyID, ParentID: r.Parent,
		RunAfter: r.RunAfter, Queue: r.Queue, Request: r.Request, Response: r.Response,
		Transition: r.Transition, State: string(r.State), Attempts: r.Attempts, LastError: r.LastError,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
	})
	if err != nil {
		return RunRecord{}, false, err
	}
	return fromMetadata(got), created, nil
}

// Checkpoint implements Store.
func (s *SQLiteStore) Checkpoint(ctx context.Context, c Checkpoint) error {
	return notFound(s.db.CheckpointRun(ctx, metadata.RunCheckpoint{
		RunID: c.RunID, State: string(c.State), Transition: c.Transition, Attempts: c.Attempts,
		Response: c.Response, LastError: c.LastError, At: c.At,
	}))
}

// GetRun implements Store.
func (s *SQLiteStore) GetRun(ctx context.Context, runID string) (RunRecord, error) {
	r, err := s.db.GetRun(ctx, runID)
	if err != nil {
		return RunRecord{}, notFound(err)
	}
	return fromMetadata(r), nil
}

// UnfinishedRuns implements Store.
func (s *SQLiteStore) UnfinishedRuns(ctx context.Context) ([]RunRecord, error) {
	runs, err := s.db.UnfinishedRuns(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]RunRecord, len(runs))
	for i, r := range runs {
		out[i] = fromMetadata(r)
	}
	return out, nil
}

// notFound makes metadata's not-found error match ErrRunNotFound too.
func notFound(err error) error {
	if errors.Is(err, metadata.ErrRunNotFound) {
		return fmt.Errorf("%w: %w", ErrRunNotFound, err)
	}
	return err
}

func fromMetadata(r metadata.Run) RunRecord {
	return RunRecord{
		ID: r.ID, FSM: r.FSM, IdempotencyID: r.IdempotencyID, Parent: r.ParentID,
		RunAfter: r.RunAfter, Queue: r.Queue, Request: json.RawMessage(r.Request), Response: json.RawMessage(r.Response),
		Transition: r.Transition, State: State(r.State), Attempts: r.Attempts, LastError: r.LastError,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
	}
}
