package fsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/containerd/log"
)

// machine is a built FSM: its transitions and how one run executes.
type machine[R, W any] struct {
	m           *Manager
	name        string
	transitions []transition[R, W]
	end         string
	onFail      CleanupFunc[R, W]
}

func (f *machine[R, W]) fsmName() string { return f.name }

func (f *machine[R, W]) index(name string) int {
	for i, t := range f.transitions {
		if t.name == name {
			return i
		}
	}
	return -1
}

// start records a new run (or finds the live one with the same id) and
// launches it.
func (f *machine[R, W]) start(ctx context.Context, id string, req *R, opts ...StartOption) (string, error) {
	if id == "" {
		return "", fmt.Errorf("fsm: starting %q: empty idempotency id", f.name)
	}
	if req == nil {
		return "", fmt.Errorf("fsm: starting %q id %q: nil request", f.name, id)
	}
	var cfg startConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.queue != "" && f.m.queues[cfg.queue] == nil {
		return "", fmt.Errorf("fsm: starting %q id %q: queue %q has no limit configured (WithQueueLimit)", f.name, id, cfg.queue)
	}
	// A start under way holds Close until its run is written: once Close
	// returns, no caller of this manager writes a run, which a process
	// resuming from the same database would otherwise miss or race.
	f.m.mu.Lock()
	closed := f.m.closed
	if !closed {
		f.m.wg.Add(1)
	}
	f.m.mu.Unlock()
	if closed {
		return "", fmt.Errorf("fsm: starting %q id %q: %w", f.name, id, ErrClosed)
	}
	defer f.m.wg.Done()
	for _, after := range cfg.runAfter {
		if _, err := f.m.store.GetRun(ctx, after); err != nil {
			return "", fmt.Errorf("fsm: starting %q id %q: run-after %s: %w", f.name, id, after, err)
		}
	}
	reqJSON, err := json.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("fsm: starting %q id %q: encoding request: %w", f.name, id, err)
	}
	now := time.Now()
	rec, created, err := f.m.store.CreateRun(ctx, RunRecord{
		ID:            newRunID(),
		FSM:           f.name,
		IdempotencyID: id,
		Parent:        cfg.parent,
		RunAfter:      cfg.runAfter,
		Queue:         cfg.queue,
		Request:       reqJSON,
		Response:      json.RawMessage("null"),
		Transition:    f.transitions[0].name,
		State:         StatePending,
		CreatedAt:     now,
		UpdatedAt:     now,
	})
	if err != nil {
		return "", fmt.Errorf("fsm: starting %q id %q: %w", f.name, id, err)
	}
	// A live run found instead of created may be one a previous process
	// left and no Resume has launched yet: launch it (no-op if active).
	if err := f.m.launch(ctx, f, rec, !created); err != nil {
		// The run is recorded; the next Resume runs it.
		return rec.ID, fmt.Errorf("fsm: starting %q id %q: %w", f.name, id, err)
	}
	return rec.ID, nil
}

// execute drives one run from wherever its record says it is to a terminal
// state, or until ctx ends (shutdown: the record stays live for Resume).
func (f *machine[R, W]) execute(ctx context.Context, rec RunRecord) {
	lg := log.G(ctx).WithField("run", rec.ID).WithField("fsm", f.name)
	ctx = log.WithLogger(ctx, lg)
	info := RunInfo{
		ID: rec.ID, FSM: rec.FSM, IdempotencyID: rec.IdempotencyID, Parent: rec.Parent,
		Queue: rec.Queue, RunAfter: rec.RunAfter,
	}

	for _, id := range rec.RunAfter {
		p, err := f.m.awaitPredecessor(ctx, id)
		switch {
		case ctx.Err() != nil, errors.Is(err, ErrClosed):
			return
		case errors.Is(err, ErrRunNotFound):
			f.finish(ctx, &rec, StateAborted, fmt.Sprintf("run-after run %s does not exist", id))
			return
		case err != nil:
			f.stall(ctx, rec, fmt.Errorf("fsm: run %s waiting for run-after run %s: %w", rec.ID, id, err))
			return
		case p.State != StateComplete:
			f.finish(ctx, &rec, StateAborted, fmt.Sprintf("run-after run %s (%s) ended %s at %q: %s", p.ID, p.FSM, p.State, p.Transition, p.LastError))
			return
		}
		info.Predecessors = append(info.Predecessors, Predecessor{ID: p.ID, FSM: p.FSM, IdempotencyID: p.IdempotencyID, Response: p.Response})
	}

	if rec.Queue != "" {
		q := f.m.queues[rec.Queue]
		if q == nil {
			lg.WithField("queue", rec.Queue).Warn("fsm: queue of a resumed run has no limit configured; running it unqueued")
		} else {
			if !q.tryAcquire() {
				if rec.State == StateRunning {
					// Resumed but must wait for a slot: say so.
					rec.State = StatePending
					if err := f.m.checkpoint(ctx, f.cp(rec, rec.Transition, rec.Attempts, nil)); err != nil {
						f.stall(ctx, rec, err)
						return
					}
				}
				if q.acquire(ctx) != nil {
					return
				}
			}
			defer q.release()
		}
	}

	idx := f.index(rec.Transition)
	if idx < 0 {
		names := make([]string, len(f.transitions))
		for i, t := range f.transitions {
			names[i] = t.name
		}
		f.finish(ctx, &rec, StateFailed, fmt.Sprintf("recorded transition %q is not one of %s's transitions (%s)", rec.Transition, f.name, strings.Join(names, ", ")))
		return
	}
	f.runFrom(ctx, &rec, idx, info)
}

// runFrom executes transitions from idx on; the first attempt made here
// is attempt rec.Attempts+1 (rec.Attempts counts the current transition's
// attempts that failed or that a crash cut short; one cut by shutdown is
// not counted).
func (f *machine[R, W]) runFrom(ctx context.Context, rec *RunRecord, idx int, info RunInfo) {
	attempt := rec.Attempts + 1
	t := f.transitions[idx]
	if max := t.cfg.retry.attempts(); attempt > max {
		// Counted attempts failed or were cut short by a crash of the
		// process (a failed last attempt ends the run where it fails, so
		// one resumed here lost at least its last attempt to a crash).
		last := rec.LastError
		if last == "" {
			last = "none, every attempt was cut short"
		}
		f.finish(ctx, rec, StateFailed, fmt.Sprintf("transition %q has no attempt left: %d counted of %d allowed, each failed or cut short by a crash of the process; last error: %s", t.name, rec.Attempts, max, last))
		return
	}
	rec.State = StateRunning
	if err := f.m.checkpoint(ctx, f.cp(*rec, t.name, attempt, nil)); err != nil {
		f.stall(ctx, *rec, err)
		return
	}
	for {
		t = f.transitions[idx]
		if ctx.Err() != nil {
			f.interrupted(ctx, *rec, t.name, attempt-1)
			return
		}
		info.Transition, info.Attempt = t.name, attempt
		lg := log.G(ctx).WithField("transition", t.name).WithField("attempt", attempt)
		resp, err := f.attempt(ctx, t, *rec, info)

		rec.Attempts = attempt
		var handoff *handoffError
		isHandoff := errors.As(err, &handoff)
		switch {
		case err != nil && !isHandoff && ctx.Err() != nil:
			// Shutdown cut the attempt short: it does not count, whatever
			// error the transition made of its canceled context.
			f.interrupted(ctx, *rec, t.name, attempt-1)
			return
		case err == nil || isHandoff:
			raw, merr := json.Marshal(resp)
			if merr != nil {
				f.conclude(ctx, rec, StateFailed, fmt.Sprintf("transition %q: encoding response: %v", t.name, merr))
				return
			}
			rec.Response = raw
			if err != nil || idx == len(f.transitions)-1 {
				rec.Transition = f.end
				f.finish(ctx, rec, StateComplete, rec.LastError)
				return
			}
			idx, attempt = idx+1, 1
			rec.Transition, rec.Attempts = f.transitions[idx].name, attempt
			if err := f.m.checkpoint(ctx, f.cp(*rec, rec.Transition, attempt, raw)); err != nil {
				f.stall(ctx, *rec, err)
				return
			}
		case IsAbort(err):
			lg.WithError(err).Warn("fsm: transition aborted the run")
			f.m.keepCause(rec.ID, err)
			f.conclude(ctx, rec, StateAborted, fmt.Sprintf("transition %q: %v", t.name, err))
			return
		case IsUnrecoverable(err):
			lg.WithError(err).Error("fsm: transition failed unrecoverably")
			f.m.keepCause(rec.ID, err)
			f.conclude(ctx, rec, StateFailed, fmt.Sprintf("transition %q: %v", t.name, err))
			return
		default:
			rec.LastError = fmt.Sprintf("transition %q attempt %d: %v", t.name, attempt, err)
			if attempt >= t.cfg.retry.attempts() {
				lg.WithError(err).Error("fsm: transition out of attempts")
				f.m.keepCause(rec.ID, err)
				f.conclude(ctx, rec, StateFailed, fmt.Sprintf("transition %q failed after %d attempts: %v", t.name, attempt, err))
				return
			}
			delay := t.cfg.retry.Delay(attempt)
			lg.WithError(err).WithField("retry_in", delay).Warn("fsm: transition failed, will retry")
			if f.m.onRetry != nil {
				f.m.onRetry(f.name, t.name)
			}
			// The row counts only attempts that started: a crash during the
			// wait resumes with the next attempt, not as an interrupted one.
			if err := f.m.checkpoint(ctx, f.cp(*rec, t.name, attempt, nil)); err != nil {
				f.stall(ctx, *rec, err)
				return
			}
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-ctx.Done():
				// Shutdown during the wait: the row already holds the
				// attempts that ran.
				timer.Stop()
				return
			}
			// Count the next attempt before it starts, so a crash inside it
			// counts against MaxAttempts and a crashing transition cannot loop.
			attempt++
			rec.Attempts = attempt
			if err := f.m.checkpoint(ctx, f.cp(*rec, t.name, attempt, nil)); err != nil {
				f.stall(ctx, *rec, err)
				return
			}
		}
	}
}

// attempt runs one attempt of t with fresh copies of request and response,
// its timeout, and panic recovery. It returns the new response (for
// success and handoff) and the classified error.
func (f *machine[R, W]) attempt(ctx context.Context, t transition[R, W], rec RunRecord, info RunInfo) (resp *W, err error) {
	msg, cur := new(R), new(W)
	if err := json.Unmarshal(rec.Request, msg); err != nil {
		return nil, Unrecoverable(fmt.Errorf("decoding request of run %s as %T: %w", rec.ID, msg, err))
	}
	if len(rec.Response) > 0 {
		if err := json.Unmarshal(rec.Response, cur); err != nil {
			return nil, Unrecoverable(fmt.Errorf("decoding checkpointed response of run %s as %T: %w", rec.ID, cur, err))
		}
	}
	actx := ctx
	if t.cfg.timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, t.cfg.timeout)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			log.G(ctx).WithField("transition", t.name).WithField("stack", string(debug.Stack())).Error("fsm: transition panicked")
			resp, err = nil, Unrecoverable(fmt.Errorf("panic: %v", p))
		}
	}()
	out, err := t.fn(actx, &Request[R, W]{Msg: msg, Resp: cur, Run: info})
	if out != nil && out.Msg != nil {
		cur = out.Msg
	}
	var handoff *handoffError
	if errors.As(err, &handoff) && handoff.resp != nil {
		w, ok := handoff.resp.(*W)
		if !ok {
			return nil, Unrecoverable(fmt.Errorf("handoff response is %T, FSM %s wants %T", handoff.resp, f.name, cur))
		}
		cur = w
	}
	if err != nil && !IsAbort(err) && !IsUnrecoverable(err) && handoff == nil &&
		ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("timed out after %s: %w", t.cfg.timeout, err)
	}
	return cur, err
}

// cp builds the checkpoint of rec at transition name with attempts.
func (f *machine[R, W]) cp(rec RunRecord, name string, attempts int, resp json.RawMessage) Checkpoint {
	return Checkpoint{RunID: rec.ID, State: rec.State, Transition: name, Attempts: attempts, Response: resp, LastError: rec.LastError}
}

// conclude finishes rec, whose current transition has just ended it without
// completing. When there is a cleanup to run, the row first says that
// transition has no attempt left, with reason as its last error: a crash
// during the cleanup then resumes into the end (runFrom), which runs the
// cleanup again, instead of into the transition, which may have removed
// what it would need to reach its verdict again (a rejected file), and
// the run keeps its reason.
func (f *machine[R, W]) conclude(ctx context.Context, rec *RunRecord, state State, reason string) {
	if f.onFail != nil {
		decided := *rec
		decided.LastError = reason
		attempts := max(rec.Attempts, f.transitions[f.index(rec.Transition)].cfg.retry.attempts())
		if err := f.m.checkpoint(ctx, f.cp(decided, rec.Transition, attempts, nil)); err != nil {
			f.stall(ctx, *rec, err)
			return
		}
	}
	f.finish(ctx, rec, state, reason)
}

// finish records a terminal state and wakes waiters.
func (f *machine[R, W]) finish(ctx context.Context, rec *RunRecord, state State, reason string) {
	if state != StateComplete {
		f.cleanup(ctx, *rec)
	}
	rec.State, rec.LastError = state, reason
	c := f.cp(*rec, rec.Transition, rec.Attempts, rec.Response)
	if err := f.m.checkpoint(ctx, c); err != nil {
		f.stall(ctx, *rec, err)
		return
	}
	lg := log.G(ctx).WithField("state", state).WithField("transition", rec.Transition)
	if state == StateComplete {
		lg.Debug("fsm: run complete")
	} else {
		lg.WithField("reason", reason).Warn("fsm: run ended")
	}
	f.m.notify(rec.ID, nil)
}

// cleanup runs the machine's OnFail function for rec, with the request and
// last checkpointed response decoded as far as they can be.
func (f *machine[R, W]) cleanup(ctx context.Context, rec RunRecord) {
	if f.onFail == nil {
		return
	}
	msg, cur := new(R), new(W)
	if err := json.Unmarshal(rec.Request, msg); err != nil {
		log.G(ctx).WithError(err).Error("fsm: cleanup skipped: the run's request cannot be decoded")
		return
	}
	if len(rec.Response) > 0 {
		_ = json.Unmarshal(rec.Response, cur) // a zero response is what cleanup gets before the first checkpoint
	}
	info := RunInfo{ID: rec.ID, FSM: rec.FSM, IdempotencyID: rec.IdempotencyID, Parent: rec.Parent, Queue: rec.Queue,
		RunAfter: rec.RunAfter, Transition: rec.Transition, Attempt: rec.Attempts}
	if err := f.onFail(context.WithoutCancel(ctx), &Request[R, W]{Msg: msg, Resp: cur, Run: info}); err != nil {
		log.G(ctx).WithError(err).WithField("transition", rec.Transition).Error("fsm: cleanup of a run that did not complete")
	}
}

// interrupted records, on shutdown, how many attempts of the current
// transition really ran, so the resumed run does not count the cut one.
func (f *machine[R, W]) interrupted(ctx context.Context, rec RunRecord, name string, attempts int) {
	if err := f.m.checkpoint(ctx, f.cp(rec, name, attempts, nil)); err != nil {
		log.G(ctx).WithError(err).Warn("fsm: recording interrupted attempt")
	}
}

// stall stops the run in memory after a checkpoint could not be written; its
// row stays live and the next Resume continues it.
func (f *machine[R, W]) stall(ctx context.Context, rec RunRecord, err error) {
	log.G(ctx).WithError(err).Error("fsm: run stalled: state could not be recorded; it resumes at next start")
	f.m.notify(rec.ID, err)
}
