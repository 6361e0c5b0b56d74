package fsm_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
)

// BenchmarkFiveTransitionRun measures one whole run of a 5-transition FSM
// whose transitions do nothing: start (one write transaction), running (one
// write), four checkpoints and the final one (five writes), and Wait. The
// anchor, measured in the same loop on the same database file, is one
// checkpoint write of a live run; ns/run is the run alone, and
// "checkpoints/run" the ratio (the run's cost in units of one SQLite write).
// ns/op is one run plus one anchor write.
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

	// Anchor: one checkpoint write on a live (pending) run, interleaved
	// with the runs so that load on the machine affects both alike.
	anchorID, err := start(ctx, "anchor-holder", &testReq{}, fsm.WithRunAfter(mustHeldRun(b, m)))
	if err != nil {
		b.Fatal(err)
	}
	var runTime, anchorTime time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		id, err := start(ctx, fmt.Sprintf("bench-%d", i), &testReq{Name: "x"})
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := m.Wait(ctx, id); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := store.Checkpoint(ctx, fsm.Checkpoint{RunID: anchorID, State: fsm.StatePending, Transition: "a", Attempts: i % 2, At: t1}); err != nil {
			b.Fatal(err)
		}
		runTime += t1.Sub(t0)
		anchorTime += time.Since(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(runTime.Nanoseconds())/float64(b.N), "ns/run")
	b.ReportMetric(float64(anchorTime.Nanoseconds())/float64(b.N), "ns/checkpoint")
	b.ReportMetric(float64(runTime)/float64(anchorTime), "checkpoints/run")
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
