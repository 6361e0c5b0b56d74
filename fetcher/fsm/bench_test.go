package fsm_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
)

// BenchmarkFiveTransitionRun measures one whole run of a 5-transition FSM
// whose transitions do nothing: start (one write), running (one write), four
// checkpoints and the final one (five writes), and Wait. The anchor, measured
// in the same process on the same database file, is one checkpoint write of
// a live run; "checkpoints/run" is the ratio (the run's cost in units of one
// durable SQLite write).
func BenchmarkFiveTransitionRun(b *testing.B) {
	db := openDB(b)
	store := fsm.NewSQLiteStore(db)
	m := newManager(b, db)
	noop := func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
		return nil, nil
	}
	start := mustBuild(b, fsm.Register[testReq, testResp](m, "noop5").
		Start("a", noop).To("b", noop).To("c", noop).To("d", noop).To("e", noop).End("done"))
	ctx := context.Background()

	// Anchor: single checkpoint writes on one live run.
	anchorID, err := start(ctx, "anchor-holder", &testReq{}, fsm.WithRunAfter(mustHeldRun(b, m)))
	if err != nil {
		b.Fatal(err)
	}
	const anchorN = 2000
	t0 := time.Now()
	for i := range anchorN {
		if err := store.Checkpoint(ctx, fsm.Checkpoint{RunID: anchorID, State: fsm.StatePending, Transition: "a", Attempts: i % 2, At: time.Now()}); err != nil {
			b.Fatal(err)
		}
	}
	anchor := time.Since(t0) / anchorN

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id, err := start(ctx, fmt.Sprintf("bench-%d", i), &testReq{Name: "x"})
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := m.Wait(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	perRun := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(float64(anchor.Nanoseconds()), "ns/checkpoint")
	b.ReportMetric(perRun/float64(anchor.Nanoseconds()), "checkpoints/run")
}

// mustHeldRun starts a run that never finishes during the benchmark (it
// waits for the manager to close), so that a run after it stays pending and
// can take anchor checkpoints.
func mustHeldRun(b *testing.B, m *fsm.Manager) string {
	start := mustBuild(b, fsm.Register[testReq, testResp](m, "held").
		Start("hold", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}).End("done"))
	id, err := start(context.Background(), "held", &testReq{})
	if err != nil {
		b.Fatal(err)
	}
	return id
}
