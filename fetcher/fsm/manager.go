package fsm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/log"
)

// Manager runs the registered state machines of one process against one
// Store: it starts runs, executes them in goroutines, enforces queue limits
// and run-after ordering, checkpoints every step, and resumes interrupted
// runs after a restart. All methods are safe for concurrent use.
type Manager struct {
	store   Store
	limits  map[string]int
	onRetry func(fsm, transition string)

	base   context.Context // canceled by Close: every run's context derives from it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	fsms    map[string]runner        // registered FSMs by name
	active  map[string]bool          // run ids that have a goroutine in this process
	waiters map[string]chan struct{} // closed when the run ends or stalls
	stalled map[string]error         // runs stopped in memory by a checkpoint failure
	queues  map[string]*queue
	// causes are the errors the transitions of this process's last runs to
	// end aborted or failed returned (RunError.Unwrap), the newest
	// maxCauses of them in causeOrder.
	causes     map[string]error
	causeOrder []string
}

// maxCauses bounds the run errors kept in memory for Wait: enough for the
// runs a pull waits on, little beside a daemon's months of runs.
const maxCauses = 256

// keepCause remembers why run runID ended (see RunError.Unwrap).
func (m *Manager) keepCause(runID string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.causes == nil {
		m.causes = map[string]error{}
	}
	if _, ok := m.causes[runID]; !ok {
		m.causeOrder = append(m.causeOrder, runID)
	}
	m.causes[runID] = err
	for len(m.causeOrder) > maxCauses {
		delete(m.causes, m.causeOrder[0])
		m.causeOrder = m.causeOrder[1:]
	}
}

func (m *Manager) causeOf(runID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.causes[runID]
}

// runner is the type-erased side of a registered FSM.
type runner interface {
	fsmName() string
	execute(ctx context.Context, rec RunRecord)
}

// ManagerOption configures NewManager.
type ManagerOption func(*Manager)

// WithQueueLimit lets at most limit runs of queue name execute at once
// (a limit below 1 means 1); a run waiting for a slot stays pending. Runs
// started with a queue that has no limit configured are refused.
func WithQueueLimit(name string, limit int) ManagerOption {
	return func(m *Manager) { m.limits[name] = max(limit, 1) }
}

// WithRetryObserver has fn told of every failed attempt that will be
// retried (the FSM's and the transition's names), for counters; fn must
// not block.
func WithRetryObserver(fn func(fsm, transition string)) ManagerOption {
	return func(m *Manager) { m.onRetry = fn }
}

// NewManager returns a manager over store. Register FSMs on it, Build them,
// then call Resume once at start-up to re-enter interrupted runs.
func NewManager(store Store, opts ...ManagerOption) *Manager {
	base, cancel := context.WithCancel(context.Background())
	m := &Manager{
		store:   store,
		limits:  map[string]int{},
		base:    base,
		cancel:  cancel,
		fsms:    map[string]runner{},
		active:  map[string]bool{},
		waiters: map[string]chan struct{}{},
		stalled: map[string]error{},
		queues:  map[string]*queue{},
	}
	for _, o := range opts {
		o(m)
	}
	for name, limit := range m.limits {
		m.queues[name] = &queue{limit: limit}
	}
	return m
}

// Close stops every run goroutine of this manager: their contexts are
// canceled, in-flight attempts end, and runs stay recorded as they are
// (running or pending) so that the next process resumes them. Waits for
// runs left live end with ErrClosed. It returns when all goroutines have
// ended, and every start under way has written its run, or ctx is done.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fsm: closing manager: runs still ending: %w", ctx.Err())
	}
}

// Done returns a channel that is closed once Close has begun: every run's
// context is being canceled, and each run stops at its next check of it
// (an attempt cut short so does not count).
func (m *Manager) Done() <-chan struct{} { return m.base.Done() }

// Resume re-enters every unfinished run of every registered FSM: running
// runs at their current transition with their checkpointed response,
// pending runs from their wait for predecessors and queue. Runs already
// executing in this process are left alone, as are runs of FSMs not
// registered (they are logged). It returns once the runs are launched.
func (m *Manager) Resume(ctx context.Context) error {
	return m.resume(ctx, "")
}

// resume launches unfinished runs of fsmName ("" = every registered FSM).
func (m *Manager) resume(ctx context.Context, fsmName string) error {
	runs, err := m.store.UnfinishedRuns(ctx)
	if err != nil {
		return fmt.Errorf("fsm: resume: loading unfinished runs: %w", err)
	}
	for _, r := range runs {
		if fsmName != "" && r.FSM != fsmName {
			continue
		}
		m.mu.Lock()
		f, ok := m.fsms[r.FSM]
		m.mu.Unlock()
		if !ok {
			log.G(ctx).WithField("run", r.ID).WithField("fsm", r.FSM).Warn("fsm: not resuming run of an unregistered state machine")
			continue
		}
		if err := m.launch(ctx, f, r, true); err != nil {
			return err
		}
		log.G(ctx).WithField("run", r.ID).WithField("fsm", r.FSM).WithField("transition", r.Transition).
			WithField("state", r.State).Info("fsm: resuming run")
	}
	return nil
}

// launch starts the goroutine of rec unless one is already active. With
// reload, the goroutine first re-reads the run and leaves it alone if it
// ended meanwhile: rec may be older than a goroutine that just finished it.
func (m *Manager) launch(ctx context.Context, f runner, rec RunRecord, reload bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if m.active[rec.ID] {
		return nil
	}
	m.active[rec.ID] = true
	delete(m.stalled, rec.ID)
	// The run outlives the caller's context (a canceled request must not
	// cancel a shared download) but keeps its values (loggers), and ends
	// with the manager.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(m.base, cancel)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		defer stop()
		defer func() {
			m.mu.Lock()
			delete(m.active, rec.ID)
			m.mu.Unlock()
		}()
		if reload {
			fresh, err := m.store.GetRun(runCtx, rec.ID)
			if err != nil {
				if runCtx.Err() == nil {
					log.G(runCtx).WithError(err).WithField("run", rec.ID).Error("fsm: reloading run before resuming it")
					m.notify(rec.ID, err)
				}
				return
			}
			if fresh.State.Terminal() {
				return
			}
			rec = fresh
		}
		f.execute(runCtx, rec)
	}()
	return nil
}

// register adds f under its name; a duplicate name is an error.
func (m *Manager) register(f runner) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.fsms[f.fsmName()]; dup {
		return fmt.Errorf("fsm: state machine %q registered twice on one manager", f.fsmName())
	}
	m.fsms[f.fsmName()] = f
	return nil
}

// waitChan returns the channel closed when runID ends or stalls, or the
// stall error if it already stalled.
func (m *Manager) waitChan(runID string) (<-chan struct{}, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err, ok := m.stalled[runID]; ok {
		return nil, err
	}
	ch, ok := m.waiters[runID]
	if !ok {
		ch = make(chan struct{})
		m.waiters[runID] = ch
	}
	return ch, nil
}

// notify wakes the waiters of runID; stallErr != nil records that the run
// stopped in memory without a terminal state.
func (m *Manager) notify(runID string, stallErr error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if stallErr != nil {
		m.stalled[runID] = stallErr
	}
	if ch, ok := m.waiters[runID]; ok {
		close(ch)
		delete(m.waiters, runID)
	}
}

// awaitTerminal blocks until runID is terminal and returns its record.
func (m *Manager) awaitTerminal(ctx context.Context, runID string) (RunRecord, error) {
	for {
		ch, err := m.waitChan(runID)
		if err != nil {
			return RunRecord{}, err
		}
		rec, err := m.store.GetRun(ctx, runID)
		if err != nil {
			return RunRecord{}, err
		}
		if rec.State.Terminal() {
			return rec, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return rec, ctx.Err()
		case <-m.base.Done():
			// The run stops without an end in this process; the next
			// one's Resume carries it on.
			return rec, ErrClosed
		}
	}
}

// awaitPredecessor is awaitTerminal for a run waiting for its run-after
// run runID, a failed read of that run tried again a few times as a
// checkpoint is: the waiting run stops in memory on the error it returns,
// and stays pending with nothing driving it until the next start.
func (m *Manager) awaitPredecessor(ctx context.Context, runID string) (RunRecord, error) {
	delay := 50 * time.Millisecond
	for try := 1; ; try++ {
		rec, err := m.awaitTerminal(ctx, runID)
		if err == nil || ctx.Err() != nil || errors.Is(err, ErrRunNotFound) || errors.Is(err, ErrClosed) || try == 5 {
			return rec, err
		}
		log.G(ctx).WithError(err).WithField("run_after", runID).WithField("try", try).Warn("fsm: reading a run-after run failed, retrying")
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return rec, ctx.Err()
		}
		delay *= 2
	}
}

// Wait blocks until run runID reaches a terminal state (or ctx ends) and
// returns that state and the run's final response JSON. The error is nil
// only for a complete run; an aborted or failed run gives a *RunError
// (errors.Is ErrAborted / ErrFailed); an unknown id wraps ErrRunNotFound.
// A run that stopped because its checkpoints could not be written returns
// that error while its state stays live for the next Resume; a run still
// live once Close has begun gives ErrClosed.
func (m *Manager) Wait(ctx context.Context, runID string) (State, json.RawMessage, error) {
	rec, err := m.awaitTerminal(ctx, runID)
	if err != nil {
		return rec.State, nil, fmt.Errorf("fsm: waiting for run %s: %w", runID, err)
	}
	if rec.State != StateComplete {
		re := runError(rec)
		re.cause = m.causeOf(rec.ID)
		return rec.State, rec.Response, re
	}
	return rec.State, rec.Response, nil
}

// Await waits for run runID like Wait and decodes its final response as W.
func Await[W any](ctx context.Context, m *Manager, runID string) (*W, error) {
	_, raw, err := m.Wait(ctx, runID)
	if err != nil {
		return nil, err
	}
	return decodeResponse[W](runID, raw)
}

// ResponseOf returns the response run runID has checkpointed so far (its
// final response once complete), decoded as W, without waiting.
func ResponseOf[W any](ctx context.Context, m *Manager, runID string) (*W, error) {
	rec, err := m.store.GetRun(ctx, runID)
	if err != nil {
		return nil, fmt.Errorf("fsm: response of run %s: %w", runID, err)
	}
	return decodeResponse[W](runID, rec.Response)
}

// Run returns the stored record of run runID.
func (m *Manager) Run(ctx context.Context, runID string) (RunRecord, error) {
	return m.store.GetRun(ctx, runID)
}

func decodeResponse[W any](runID string, raw json.RawMessage) (*W, error) {
	w := new(W)
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, w); err != nil {
			return nil, fmt.Errorf("fsm: decoding response of run %s as %T: %w", runID, w, err)
		}
	}
	return w, nil
}

// checkpoint writes c, retrying a failing write a few times. Writes are not
// canceled by shutdown: a finished transition's result is always recorded
// if the database accepts it.
func (m *Manager) checkpoint(ctx context.Context, c Checkpoint) error {
	ctx = context.WithoutCancel(ctx)
	var err error
	delay := 50 * time.Millisecond
	for try := 1; try <= 5; try++ {
		c.At = time.Now()
		if err = m.store.Checkpoint(ctx, c); err == nil {
			return nil
		}
		if errors.Is(err, ErrRunNotFound) {
			break
		}
		log.G(ctx).WithError(err).WithField("run", c.RunID).WithField("try", try).Warn("fsm: checkpoint failed, retrying")
		time.Sleep(delay)
		delay *= 2
	}
	return fmt.Errorf("fsm: checkpoint of run %s (state %s, transition %q): %w", c.RunID, c.State, c.Transition, err)
}

// newRunID returns a unique id that sorts by creation time.
func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%013x", time.Now().UnixMicro()) + hex.EncodeToString(b[:])
}

// queue is a FIFO counting semaphore.
type queue struct {
	mu      sync.Mutex
	limit   int
	running int
	waiting []chan struct{}
}

// tryAcquire takes a slot if one is free and nobody is waiting.
func (q *queue) tryAcquire() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running < q.limit && len(q.waiting) == 0 {
		q.running++
		return true
	}
	return false
}

// acquire blocks for a slot, first come first served.
func (q *queue) acquire(ctx context.Context) error {
	q.mu.Lock()
	if q.running < q.limit && len(q.waiting) == 0 {
		q.running++
		q.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	q.waiting = append(q.waiting, ch)
	q.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		q.mu.Lock()
		defer q.mu.Unlock()
		for i, w := range q.waiting {
			if w == ch {
				q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
				return ctx.Err()
			}
		}
		// The slot was handed to us just as ctx ended: pass it on.
		q.releaseLocked()
		return ctx.Err()
	}
}

// release frees a slot, handing it to the oldest waiter.
func (q *queue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.releaseLocked()
}

func (q *queue) releaseLocked() {
	if len(q.waiting) > 0 {
		ch := q.waiting[0]
		q.waiting = q.waiting[1:]
		close(ch) // the slot moves to the waiter; running is unchanged
		return
	}
	q.running--
}
