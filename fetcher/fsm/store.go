package fsm

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
)

// State is the lifecycle state of a run as recorded in its row.
type State string

// The states of a run. pending and running are live; the others are terminal
// and never change again.
const (
	// StatePending: the run is recorded but has not started its current
	// transition: it waits for a run-after predecessor or a queue slot.
	StatePending State = "pending"
	// StateRunning: the run is executing (or, after a crash, was executing)
	// its current transition.
	StateRunning State = "running"
	// StateComplete: every transition succeeded, or one handed off.
	StateComplete State = "complete"
	// StateAborted: a transition returned Abort, or a run-after
	// predecessor did not complete.
	StateAborted State = "aborted"
	// StateFailed: a transition exhausted its attempts or returned
	// Unrecoverable.
	StateFailed State = "failed"
)

// Terminal reports whether s is a final state (complete, aborted, failed).
func (s State) Terminal() bool {
	return s == StateComplete || s == StateAborted || s == StateFailed
}

// Valid reports whether s is one of the five states.
func (s State) Valid() bool {
	return s == StatePending || s == StateRunning || s.Terminal()
}

// ErrRunNotFound is returned (wrapped) by a Store, Wait and ResponseOf for a
// run id that has no row; it matches containerd's errdefs.ErrNotFound.
var ErrRunNotFound = fmt.Errorf("fsm: run not found: %w", errdefs.ErrNotFound)

// RunRecord is one run's durable row: everything needed to resume it.
type RunRecord struct {
	ID            string   // unique run id, time-ordered
	FSM           string   // name the FSM was registered under
	IdempotencyID string   // the caller's id; at most one live run per (FSM, IdempotencyID)
	Parent        string   // optional parent run id (tracking only)
	RunAfter      []string // run ids that must complete before this run starts
	Queue         string   // optional queue name limiting concurrency
	Request       json.RawMessage
	Response      json.RawMessage // checkpointed after each transition; "null" before the first
	Transition    string          // current transition (the end name once complete)
	State         State
	Attempts      int    // attempts of the current transition started so far
	LastError     string // the last error of the run, "" if none
	CreatedAt     time.Time
	UpdatedAt     time.Time
	StartedAt     time.Time // zero until the run first went running
	FinishedAt    time.Time // zero until the run reached a terminal state
}

// Checkpoint is one durable update of a run, written in one write
// transaction: the run's state, current transition, attempt count, last
// error and (unless nil) response all change together.
type Checkpoint struct {
	RunID      string
	State      State
	Transition string
	Attempts   int
	Response   json.RawMessage // nil leaves the stored response unchanged
	LastError  string
	At         time.Time // updated_at; also started_at when first running, finished_at when terminal
}

// Store is the durable home of runs. Every method is one database
// statement or one write transaction; a method that returns nil has made its
// change durable.
type Store interface {
	// CreateRun inserts r unless a live (pending or running) run with the
	// same FSM and IdempotencyID exists, in which case it returns that run
	// and created=false. Check and insert are one write transaction.
	CreateRun(ctx context.Context, r RunRecord) (run RunRecord, created bool, err error)
	// Checkpoint applies c to its run; an unknown run id is an error
	// wrapping ErrRunNotFound.
	Checkpoint(ctx context.Context, c Checkpoint) error
	// GetRun returns one run; an unknown id is an error wrapping
	// ErrRunNotFound.
	GetRun(ctx context.Context, runID string) (RunRecord, error)
	// UnfinishedRuns returns every pending or running run, oldest first.
	UnfinishedRuns(ctx context.Context) ([]RunRecord, error)
}
