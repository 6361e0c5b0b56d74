package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// TestWatcherThatStopsReadingHoldsUpNoRun: a pull whose progress blocks,
// as a control-socket client does once it stops reading its answer,
// holds up its own answer only. Another image's pull, and a second pull
// of the same image (which shares the blocked pull's runs), finish; once
// the watcher reads again it gets each step's last figures.
func TestWatcherThatStopsReadingHoldsUpNoRun(t *testing.T) {
	e := newPullEnv(t, nil)
	e.p.hub.grace = time.Hour // the pull waits for its watcher to read again
	e.srv.Put(t, "a/1.tar", layerTar(t, "a1", 4000))
	e.srv.Put(t, "a/2.tar", layerTar(t, "a2", 4000))
	e.srv.Put(t, "b/1.tar", layerTar(t, "b", 4000))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	stuck, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var seen []api.Event
	type result struct {
		res *api.PullResult
		err error
	}
	aDone := make(chan result, 1)
	go func() {
		res, err := e.p.Pull(ctx, api.PullRequest{Bucket: e.srv.Bucket, Key: "a/", Ref: "a"}, func(ev api.Event) {
			once.Do(func() { close(stuck) })
			<-release
			seen = append(seen, ev)
		})
		aDone <- result{res, err}
	}()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	select {
	case <-stuck:
	case <-ctx.Done():
		t.Fatal("pull a raised no event")
	}

	if _, err := e.p.Pull(ctx, api.PullRequest{Bucket: e.srv.Bucket, Key: "b/", Ref: "b"}, nil); err != nil {
		t.Fatalf("pull of another image while a's watcher does not read: %v", err)
	}
	again, err := e.p.Pull(ctx, api.PullRequest{Bucket: e.srv.Bucket, Key: "a/", Ref: "a"}, func(api.Event) {})
	if err != nil {
		t.Fatalf("second pull of a while the first one's watcher does not read: %v", err)
	}
	select {
	case r := <-aDone:
		t.Fatalf("pull a returned while its watcher was blocked, before its events were delivered: %+v, %v", r.res, r.err)
	default:
	}

	close(release)
	released = true
	r := <-aDone
	if r.err != nil {
		t.Fatalf("pull a: %v", r.err)
	}
	if r.res.ImageID != again.ImageID {
		t.Fatalf("the two pulls of a answered images %s and %s", r.res.ImageID, again.ImageID)
	}
	// What the watcher was shown last, per layer and step: the download's
	// bytes reached the layer's size.
	last := map[[2]any]api.Event{}
	for _, ev := range seen {
		last[[2]any{ev.Layer, ev.State}] = ev
	}
	for layer := 1; layer <= 2; layer++ {
		dl, ok := last[[2]any{layer, "download"}]
		if !ok {
			// A layer the blocked pull found downloaded by the other
			// one shows its validation instead.
			dl, ok = last[[2]any{layer, "validate"}]
		}
		if !ok || dl.Total == 0 || dl.Bytes != dl.Total {
			t.Errorf("layer %d: the last download event shown is %+v (ok %v), want bytes = total", layer, dl, ok)
		}
	}
}

// TestPullEndsPastAWatcherThatNeverReads: a watcher blocked for good
// holds up its pull's end only for the hub's grace; the pull then returns
// (and lets go of its image), and the watcher gets the last events
// whenever it reads again.
func TestPullEndsPastAWatcherThatNeverReads(t *testing.T) {
	e := newPullEnv(t, nil)
	e.p.hub.grace = 100 * time.Millisecond
	e.srv.Put(t, "a/1.tar", layerTar(t, "a1", 4000))
	release := make(chan struct{})
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := e.p.Pull(ctx, api.PullRequest{Bucket: e.srv.Bucket, Key: "a/", Ref: "a"}, func(api.Event) { <-release })
	if err != nil || res.Ref != "a" {
		t.Fatalf("pull whose watcher never reads: %+v, %v", res, err)
	}
}

// TestMailboxKeepsEachStepsLatestEvent: while a watcher is blocked, the
// events of one step replace each other and the steps keep the order in
// which they first raised one; cancel delivers what is waiting.
func TestMailboxKeepsEachStepsLatestEvent(t *testing.T) {
	var h hub
	first, release := make(chan struct{}), make(chan struct{})
	var got []api.Event
	var once sync.Once
	cancel := h.subscribe(func(e api.Event) (api.Event, bool) { return e, e.Run != "other" }, func(e api.Event) {
		once.Do(func() { close(first) })
		<-release
		got = append(got, e)
	})
	h.emit(api.Event{Run: "r1", FSM: api.FSMDownload, State: "check-exists"})
	<-first // the watcher is now blocked on that event
	for i := int64(1); i <= 1000; i++ {
		h.emit(api.Event{Run: "r1", FSM: api.FSMDownload, State: "download", Bytes: i, Total: 1000})
		h.emit(api.Event{Run: "other", FSM: api.FSMDownload, State: "download", Bytes: i})
		if i == 10 {
			h.emit(api.Event{Run: "r2", FSM: api.FSMUnpack, State: "extract-layers", Bytes: 5})
		}
	}
	h.emit(api.Event{Run: "r2", FSM: api.FSMUnpack, State: "extract-layers", Bytes: 7})
	close(release)
	cancel()
	want := []api.Event{
		{Run: "r1", FSM: api.FSMDownload, State: "check-exists"},
		{Run: "r1", FSM: api.FSMDownload, State: "download", Bytes: 1000, Total: 1000},
		{Run: "r2", FSM: api.FSMUnpack, State: "extract-layers", Bytes: 7},
	}
	if len(got) != len(want) {
		t.Fatalf("delivered %d events, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	h.emit(api.Event{Run: "r1", FSM: api.FSMDownload, State: "download"})
	if len(got) != len(want) {
		t.Errorf("an event raised after cancel was delivered: %+v", got[len(want):])
	}
}
