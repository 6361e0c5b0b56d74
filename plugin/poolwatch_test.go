package plugin

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// fakeWatcher stands in for the pool's event watch: its first watches
// fail, the next one reports one low-water event and then runs until its
// context ends, as thinpool.Pool.Watch does.
type fakeWatcher struct {
	mu       sync.Mutex
	failures int // watches left to fail
	watches  int
}

func (w *fakeWatcher) Watch(ctx context.Context, fn func(context.Context, thinpool.Event)) error {
	w.mu.Lock()
	w.watches++
	fail := w.failures > 0
	w.failures--
	w.mu.Unlock()
	if fail {
		return errors.New("dm wait: no such device or address")
	}
	fn(ctx, thinpool.Event{EventNr: 7, LowWater: true})
	<-ctx.Done()
	return ctx.Err()
}

// TestKeepWatchingAfterFailure: a watch of the pool's events that fails is
// counted and started again, and the watch started again hands its events
// to the handler; when the context ends, the watching ends.
func TestKeepWatchingAfterFailure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &fakeWatcher{failures: 1}
	failed := 0
	events := make(chan thinpool.Event, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		keepWatching(ctx, w, log.G(ctx), func() { failed++ }, func(_ context.Context, ev thinpool.Event) { events <- ev })
	}()
	select {
	case ev := <-events:
		if !ev.LowWater || ev.EventNr != 7 {
			t.Errorf("handler got %+v, want the low-water event 7", ev)
		}
	case <-time.After(time.Minute):
		t.Fatal("no event handled within a minute of a failed watch: the watch was not started again")
	}
	cancel()
	<-done
	if failed != 1 || w.watches != 2 {
		t.Errorf("failures counted %d, watches %d; want 1 and 2", failed, w.watches)
	}
}

// TestKeepWatchingStopsDuringPause: a context that ends while a failed
// watch waits to be started again ends the watching without another watch.
func TestKeepWatchingStopsDuringPause(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &fakeWatcher{failures: 1}
	done := make(chan struct{})
	go func() {
		defer close(done)
		keepWatching(ctx, w, log.G(ctx), func() { cancel() }, func(context.Context, thinpool.Event) {
			t.Error("a watch ran after the context ended")
		})
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the watching did not end within a minute of its context")
	}
	if w.watches != 1 {
		t.Errorf("%d watches, want 1: the watching went on after its context ended", w.watches)
	}
}
