package pipeline

import (
	"sync"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// hub fans progress events out to the pulls that watch the runs.
//
// The runs raise events on their own goroutines, and a run is shared by
// every pull that needs its layer, so an event's delivery must never wait
// on a watcher: a client that stops reading its answer (suspended with
// Ctrl-Z, piped into a paused pager) would otherwise stop the runs, and
// through them every pull in the daemon. emit therefore only routes the
// event into each watcher's mailbox; each watcher has a goroutine of its
// own that hands the events to its callback.
type hub struct {
	mu   sync.Mutex
	next int
	subs map[int]*mailbox
	// grace is how long cancel waits for a watcher to take the events
	// routed to it (defaultFlushGrace when zero).
	grace time.Duration
}

// defaultFlushGrace is how long a pull's end waits for its watcher to
// take the last events. A watcher blocked longer (a client suspended for
// good) gets them when it reads again, after the pull has ended and let
// go of its image, so that the image can be collected or removed.
const defaultFlushGrace = 5 * time.Second

// subscribe starts delivering events to deliver, one at a time, in the
// order they were raised. route is called on the emitting goroutine, so
// it must not block: it returns the event as the watcher wants it, and
// false for events the watcher does not want. The returned cancel stops
// the subscription once the events routed before it are delivered, or
// once the hub's grace has passed with deliver blocked; the events left
// are then delivered when deliver returns.
func (h *hub) subscribe(route func(api.Event) (api.Event, bool), deliver func(api.Event)) (cancel func()) {
	mb := &mailbox{route: route, wake: make(chan struct{}, 1), done: make(chan struct{}), idle: make(chan struct{})}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[int]*mailbox{}
	}
	id := h.next
	h.next++
	h.subs[id] = mb
	h.mu.Unlock()
	go mb.run(deliver)
	return func() {
		h.mu.Lock()
		delete(h.subs, id)
		h.mu.Unlock()
		close(mb.done)
		grace := h.grace
		if grace <= 0 {
			grace = defaultFlushGrace
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-mb.idle:
		case <-t.C:
		}
	}
}

func (h *hub) emit(e api.Event) {
	h.mu.Lock()
	subs := make([]*mailbox, 0, len(h.subs))
	for _, s := range h.subs {
		subs = append(subs, s)
	}
	h.mu.Unlock()
	for _, s := range subs {
		s.put(e)
	}
}

// stepKey names what an event reports on: one step of one run. The events
// of a step only grow (bytes, files), so the latest one says all the
// earlier ones did.
type stepKey struct{ run, fsm, state string }

// mailbox holds the events routed to one watcher and not yet delivered:
// at most one per step, the latest, in the order the steps first raised
// one. A watcher that stops reading therefore holds at most one event per
// step of its own runs, however long it stops, and loses no step's last
// figures.
type mailbox struct {
	route func(api.Event) (api.Event, bool)
	wake  chan struct{} // one token: events are waiting
	done  chan struct{} // closed by cancel
	idle  chan struct{} // closed when run has delivered its last event

	mu      sync.Mutex
	pending []api.Event
	at      map[stepKey]int // index in pending
}

func (m *mailbox) put(e api.Event) {
	e, ok := m.route(e)
	if !ok {
		return
	}
	k := stepKey{e.Run, e.FSM, e.State}
	m.mu.Lock()
	if i, ok := m.at[k]; ok {
		m.pending[i] = e
	} else {
		if m.at == nil {
			m.at = map[stepKey]int{}
		}
		m.at[k] = len(m.pending)
		m.pending = append(m.pending, e)
	}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// take empties the mailbox and returns what it held.
func (m *mailbox) take() []api.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	batch := m.pending
	m.pending, m.at = nil, nil
	return batch
}

func (m *mailbox) run(deliver func(api.Event)) {
	defer close(m.idle)
	for done := false; !done; {
		select {
		case <-m.wake:
		case <-m.done:
			done = true
		}
		for _, e := range m.take() {
			deliver(e)
		}
	}
}
