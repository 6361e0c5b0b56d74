package fsm

import (
	"errors"
	"fmt"
)

// abortError marks an error that stops the run at once with state aborted.
type abortError struct{ err error }

func (e *abortError) Error() string { return e.err.Error() }
func (e *abortError) Unwrap() error { return e.err }

// unrecoverableError marks an error that stops the run at once with state
// failed.
type unrecoverableError struct{ err error }

func (e *unrecoverableError) Error() string { return e.err.Error() }
func (e *unrecoverableError) Unwrap() error { return e.err }

// handoffError carries the response a run completes with.
type handoffError struct{ resp any }

func (e *handoffError) Error() string { return "fsm: handoff" }

// Abort returns an error that, returned by a transition, stops the run
// immediately with state aborted and err's message recorded as the reason.
// No retry happens. A nil err gets a generic reason.
func Abort(err error) error {
	if err == nil {
		err = errors.New("aborted")
	}
	return &abortError{err: err}
}

// Unrecoverable returns an error that, returned by a transition, stops the
// run immediately with state failed and err's message recorded. No retry
// happens. A nil err gets a generic reason.
func Unrecoverable(err error) error {
	if err == nil {
		err = errors.New("unrecoverable error")
	}
	return &unrecoverableError{err: err}
}

// Handoff returns an error that, returned by a transition, completes the run
// at once with resp as its final response, skipping the remaining
// transitions. A nil resp keeps the response the transition returned (or the
// run's current one). resp's type must be the FSM's response type, or the run
// fails.
func Handoff[W any](resp *W) error {
	if resp == nil {
		return &handoffError{}
	}
	return &handoffError{resp: resp}
}

// IsAbort reports whether err (or an error it wraps) was made by Abort.
func IsAbort(err error) bool {
	var a *abortError
	return errors.As(err, &a)
}

// IsUnrecoverable reports whether err (or an error it wraps) was made by
// Unrecoverable.
func IsUnrecoverable(err error) bool {
	var u *unrecoverableError
	return errors.As(err, &u)
}

// IsHandoff reports whether err (or an error it wraps) was made by Handoff.
func IsHandoff(err error) bool {
	var h *handoffError
	return errors.As(err, &h)
}

// ErrAborted matches (errors.Is) a RunError of an aborted run.
var ErrAborted = errors.New("fsm: run aborted")

// ErrFailed matches (errors.Is) a RunError of a failed run.
var ErrFailed = errors.New("fsm: run failed")

// ErrClosed is returned by start functions and Resume after Close, and by
// Wait for a run Close left live.
var ErrClosed = errors.New("fsm: manager closed")

// RunError is how Wait reports a run that ended aborted or failed: which
// run, at which transition, and the recorded reason. errors.Is matches
// ErrAborted or ErrFailed by state. When the run ended in this process, the
// error its transition returned is wrapped too (Unwrap), so errors.As finds
// a typed cause; a run that ended in an earlier process has only its
// recorded reason.
type RunError struct {
	RunID      string
	FSM        string
	State      State
	Transition string
	Reason     string
	cause      error
}

// Unwrap returns the error the run's transition ended it with, when the
// run ended in this process (nil otherwise).
func (e *RunError) Unwrap() error { return e.cause }

// Error names the run, its FSM, the transition it stopped at and why.
func (e *RunError) Error() string {
	return fmt.Sprintf("run %s (%s) %s at transition %q: %s", e.RunID, e.FSM, e.State, e.Transition, e.Reason)
}

// Is matches ErrAborted for aborted runs and ErrFailed for failed runs.
func (e *RunError) Is(target error) bool {
	return (target == ErrAborted && e.State == StateAborted) || (target == ErrFailed && e.State == StateFailed)
}

// runError builds the RunError of a terminal, not complete, record.
func runError(r RunRecord) *RunError {
	return &RunError{RunID: r.ID, FSM: r.FSM, State: r.State, Transition: r.Transition, Reason: r.LastError}
}
