package fsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Request is what a transition receives: the run's request, the response
// checkpointed by the transitions before it, and facts about the run. Each
// attempt gets fresh copies decoded from the checkpoint, so changes made by a
// failed attempt never leak into the next one.
type Request[R, W any] struct {
	Msg  *R      // the request the run was started with; never nil
	Resp *W      // the response so far; never nil (zero before the first checkpoint)
	Run  RunInfo // which run, transition and attempt this is
}

// Response is what a transition returns on success: the run's new response.
// A nil *Response (or nil Msg) keeps req.Resp, including changes the
// transition made to it in place.
type Response[W any] struct {
	Msg *W
}

// NewResponse wraps msg as a transition's result.
func NewResponse[W any](msg *W) *Response[W] { return &Response[W]{Msg: msg} }

// TransitionFunc is one step of a state machine. It must be idempotent: after
// a crash the interrupted transition runs again from its start. A nil error
// moves the run to the next transition; a plain error retries this one with
// its RetryPolicy; Abort, Unrecoverable and Handoff end the run.
type TransitionFunc[R, W any] func(ctx context.Context, req *Request[R, W]) (*Response[W], error)

// RunInfo describes the run and attempt a transition executes in.
type RunInfo struct {
	ID            string
	FSM           string
	IdempotencyID string
	Parent        string
	Queue         string
	RunAfter      []string
	Transition    string
	Attempt       int           // 1 for the first attempt of this transition
	Predecessors  []Predecessor // the completed run-after runs, in RunAfter order
}

// Predecessor is a completed run-after run and its final response.
type Predecessor struct {
	ID            string
	FSM           string
	IdempotencyID string
	Response      json.RawMessage
}

// PredecessorRun is the one run-after predecessor of info's run that
// belongs to FSM fsmName; zero or several such predecessors is an error
// naming the run.
func PredecessorRun(info RunInfo, fsmName string) (*Predecessor, error) {
	var found *Predecessor
	for i := range info.Predecessors {
		if info.Predecessors[i].FSM != fsmName {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("fsm: run %s has several run-after predecessors of %q (%s, %s)", info.ID, fsmName, found.ID, info.Predecessors[i].ID)
		}
		found = &info.Predecessors[i]
	}
	if found == nil {
		return nil, fmt.Errorf("fsm: run %s has no run-after predecessor of %q", info.ID, fsmName)
	}
	return found, nil
}

// PredecessorResponse decodes, as T, the final response of the one
// run-after predecessor of info's run that belongs to FSM fsmName. It is how
// a chained FSM reads its input (Unpack reads Download's response). Zero or
// several such predecessors is an error naming the run.
func PredecessorResponse[T any](info RunInfo, fsmName string) (*T, error) {
	found, err := PredecessorRun(info, fsmName)
	if err != nil {
		return nil, err
	}
	return decodeResponse[T](found.ID, found.Response)
}

// TransitionOption configures one transition.
type TransitionOption func(*transitionConfig)

type transitionConfig struct {
	timeout time.Duration
	retry   RetryPolicy
}

// WithTimeout bounds each attempt of the transition: its context's deadline
// is d after the attempt starts. Running out of time is a retryable error.
func WithTimeout(d time.Duration) TransitionOption {
	return func(c *transitionConfig) { c.timeout = d }
}

// WithRetry sets the transition's attempts and backoff (default
// DefaultRetry).
func WithRetry(p RetryPolicy) TransitionOption {
	return func(c *transitionConfig) { c.retry = p }
}

// StartOption configures one run at start.
type StartOption func(*startConfig)

type startConfig struct {
	queue    string
	runAfter []string
	parent   string
}

// WithQueue makes the run take a slot of the named queue (configured with
// WithQueueLimit) for as long as it executes.
func WithQueue(name string) StartOption {
	return func(c *startConfig) { c.queue = name }
}

// WithRunAfter makes the run wait until every named run completes; if one
// ends aborted or failed, this run is aborted with a reason naming it. The
// predecessors' responses reach the transitions as RunInfo.Predecessors.
// Each id must name an existing run.
func WithRunAfter(runIDs ...string) StartOption {
	return func(c *startConfig) {
		for _, id := range runIDs {
			if id != "" {
				c.runAfter = append(c.runAfter, id)
			}
		}
	}
}

// WithParent records runID as the run's parent (for tracking a pipeline).
func WithParent(runID string) StartOption {
	return func(c *startConfig) { c.parent = runID }
}

// StartFunc starts a run of one FSM. id is the idempotency id: while a run
// of this FSM with the same id is pending or running, starting again returns
// that run's id and starts nothing new (options given to the later call are
// ignored); a live run left by a previous process is resumed by it. After
// the run completes, the same id starts a fresh run. The run is durable
// when StartFunc returns; it executes in the background (see Manager.Wait).
type StartFunc[R any] func(ctx context.Context, id string, req *R, opts ...StartOption) (runID string, err error)

// ResumeFunc re-enters the unfinished runs of one FSM (see Manager.Resume).
type ResumeFunc func(ctx context.Context) error

// Builder declares an FSM's transitions; get one from Register.
type Builder[R, W any] struct {
	m           *Manager
	name        string
	transitions []transition[R, W]
	end         string
	onEnd       CleanupFunc[R, W]
	errs        []error
}

// CleanupFunc removes what a run made before it ended without completing.
// It gets the run's request, its last checkpointed response and the run's
// facts (Run.Transition is where it stopped). It must be idempotent: a
// crash during it (or before the run's end is recorded) runs it again at
// the next start.
type CleanupFunc[R, W any] func(ctx context.Context, req *Request[R, W]) error

// OnFail declares the machine's cleanup: it runs whenever a run ends
// aborted or failed, on every path (an Abort, attempts used up by errors or
// by crashes, a predecessor that did not complete, a record that cannot be
// decoded), before the end is recorded. A cleanup error is logged and the
// run still ends; start-up sweeps (the caller's) catch what it left.
func (b *Builder[R, W]) OnFail(fn CleanupFunc[R, W]) *Builder[R, W] {
	if b.onEnd != nil {
		b.errs = append(b.errs, errors.New("OnFail declared twice"))
	}
	b.onEnd = fn
	return b
}

type transition[R, W any] struct {
	name string
	fn   TransitionFunc[R, W]
	cfg  transitionConfig
}

// Register begins the declaration of FSM name on m, with request type R and
// response type W (both JSON-encodable: they are checkpointed as JSON).
func Register[R, W any](m *Manager, name string) *Builder[R, W] {
	b := &Builder[R, W]{m: m, name: name}
	if strings.TrimSpace(name) == "" {
		b.errs = append(b.errs, errors.New("empty FSM name"))
	}
	return b
}

// Start declares the first transition.
func (b *Builder[R, W]) Start(name string, fn TransitionFunc[R, W], opts ...TransitionOption) *Builder[R, W] {
	if len(b.transitions) > 0 {
		b.errs = append(b.errs, fmt.Errorf("Start(%q) after transition %q: Start must come first, once", name, b.transitions[0].name))
	}
	return b.add(name, fn, opts)
}

// To declares the next transition.
func (b *Builder[R, W]) To(name string, fn TransitionFunc[R, W], opts ...TransitionOption) *Builder[R, W] {
	if len(b.transitions) == 0 {
		b.errs = append(b.errs, fmt.Errorf("To(%q) before Start", name))
	}
	return b.add(name, fn, opts)
}

// End names the final state a complete run records as its transition.
func (b *Builder[R, W]) End(name string) *Builder[R, W] {
	if b.end != "" {
		b.errs = append(b.errs, fmt.Errorf("End(%q) after End(%q)", name, b.end))
	}
	if b.taken(name) {
		b.errs = append(b.errs, fmt.Errorf("end state %q has the name of a transition", name))
	}
	b.end = name
	return b
}

func (b *Builder[R, W]) taken(name string) bool {
	for _, t := range b.transitions {
		if t.name == name {
			return true
		}
	}
	return false
}

func (b *Builder[R, W]) add(name string, fn TransitionFunc[R, W], opts []TransitionOption) *Builder[R, W] {
	switch {
	case strings.TrimSpace(name) == "":
		b.errs = append(b.errs, errors.New("empty transition name"))
	case b.taken(name):
		b.errs = append(b.errs, fmt.Errorf("transition %q declared twice", name))
	case fn == nil:
		b.errs = append(b.errs, fmt.Errorf("transition %q has a nil function", name))
	case b.end != "":
		b.errs = append(b.errs, fmt.Errorf("transition %q declared after End(%q)", name, b.end))
	}
	cfg := transitionConfig{retry: DefaultRetry}
	for _, o := range opts {
		o(&cfg)
	}
	b.transitions = append(b.transitions, transition[R, W]{name: name, fn: fn, cfg: cfg})
	return b
}

// Build checks the declaration, registers the FSM on the manager and returns
// its start and resume functions. Every mistake in the declaration is
// reported, naming the FSM.
func (b *Builder[R, W]) Build(ctx context.Context) (StartFunc[R], ResumeFunc, error) {
	errs := b.errs
	if len(b.transitions) == 0 {
		errs = append(errs, errors.New("no transitions"))
	}
	if b.end == "" {
		errs = append(errs, errors.New("no End"))
	}
	if len(errs) > 0 {
		return nil, nil, fmt.Errorf("fsm: building state machine %q: %w", b.name, errors.Join(errs...))
	}
	f := &machine[R, W]{m: b.m, name: b.name, transitions: b.transitions, end: b.end, onFail: b.onEnd}
	if err := b.m.register(f); err != nil {
		return nil, nil, err
	}
	resume := func(ctx context.Context) error { return b.m.resume(ctx, f.name) }
	return f.start, resume, nil
}
