package metadata

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func newRun(id, fsm, idem string, created time.Time) Run {
	return Run{ID: id, FSM: fsm, IdempotencyID: idem, Request: []byte(`{"k":1}`), Transition: "check-exists",
		State: RunPending, CreatedAt: created, UpdatedAt: created}
}

func openRunsDB(t *testing.T) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs.db")
	d, err := Open(context.Background(), Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d, path
}

func TestCreateRunOneLiveRunPerID(t *testing.T) {
	d, _ := openRunsDB(t)
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	var wg sync.WaitGroup
	got := make([]Run, 10)
	created := make([]bool, 10)
	errs := make([]error, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], created[i], errs[i] = d.CreateRun(ctx, newRun(fmt.Sprintf("run-%d", i), "download-image", "sha256:aa", t0))
		}()
	}
	wg.Wait()
	n := 0
	for i := range 10 {
		if errs[i] != nil {
			t.Fatalf("CreateRun %d: %v", i, errs[i])
		}
		if created[i] {
			n++
		}
		if got[i].ID != got[0].ID {
			t.Fatalf("caller %d got run %s, caller 0 got %s", i, got[i].ID, got[0].ID)
		}
	}
	if n != 1 {
		t.Fatalf("%d runs created for one id, want 1", n)
	}
	// Another FSM may use the same idempotency id.
	if _, c, err := d.CreateRun(ctx, newRun("other", "unpack-image", "sha256:aa", t0)); err != nil || !c {
		t.Fatalf("same id in another FSM: created %v, %v", c, err)
	}
	// Once the run is finished, the id is free again.
	if err := d.CheckpointRun(ctx, RunCheckpoint{RunID: got[0].ID, State: RunComplete, Transition: "complete", At: t0}); err != nil {
		t.Fatal(err)
	}
	if r, c, err := d.CreateRun(ctx, newRun("again", "download-image", "sha256:aa", t0)); err != nil || !c || r.ID != "again" {
		t.Fatalf("after completion: %+v created %v, %v; want a new run", r.ID, c, err)
	}
	if _, _, err := d.CreateRun(ctx, Run{ID: "x", FSM: "f", IdempotencyID: "i", Transition: "t", State: RunComplete}); err == nil {
		t.Fatal("creating a run in a terminal state succeeded")
	}
}

func TestCheckpointRun(t *testing.T) {
	d, path := openRunsDB(t)
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	r := newRun("r1", "download-image", "img", t0)
	r.RunAfter = []string{"a1", "a2"}
	r.ParentID, r.Queue = "p", "downloads"
	if _, _, err := d.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	steps := []RunCheckpoint{
		{RunID: "r1", State: RunRunning, Transition: "check-exists", Attempts: 1, At: t0.Add(1 * time.Second)},
		{RunID: "r1", State: RunRunning, Transition: "download", Attempts: 1, Response: []byte(`{"exists":false}`), At: t0.Add(2 * time.Second)},
		{RunID: "r1", State: RunRunning, Transition: "download", Attempts: 2, LastError: "503", At: t0.Add(3 * time.Second)},
	}
	for _, c := range steps {
		if err := d.CheckpointRun(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := d.GetRun(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != RunRunning || got.Transition != "download" || got.Attempts != 2 || got.LastError != "503" ||
		string(got.Response) != `{"exists":false}` || !got.StartedAt.Equal(t0.Add(time.Second)) || !got.FinishedAt.IsZero() ||
		len(got.RunAfter) != 2 || got.RunAfter[1] != "a2" || got.ParentID != "p" || got.Queue != "downloads" {
		t.Fatalf("after checkpoints: %+v", got)
	}
	if err := d.CheckpointRun(ctx, RunCheckpoint{RunID: "r1", State: RunAborted, Transition: "download", Attempts: 2, LastError: "access denied", At: t0.Add(4 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	err = d.CheckpointRun(ctx, RunCheckpoint{RunID: "r1", State: RunRunning, Transition: "validate", At: t0.Add(5 * time.Second)})
	if !errors.Is(err, ErrRunFinished) {
		t.Fatalf("checkpoint of a finished run: %v, want ErrRunFinished", err)
	}
	got, _ = d.GetRun(ctx, "r1")
	if got.State != RunAborted || !got.FinishedAt.Equal(t0.Add(4*time.Second)) || got.LastError != "access denied" {
		t.Fatalf("finished run changed or finished_at wrong: %+v", got)
	}
	if err := d.CheckpointRun(ctx, RunCheckpoint{RunID: "nope", State: RunRunning, At: t0}); !errors.Is(err, ErrRunNotFound) || !errdefs.IsNotFound(err) {
		t.Fatalf("checkpoint of an unknown run: %v", err)
	}
	if err := d.CheckpointRun(ctx, RunCheckpoint{RunID: "r1", State: "paused", At: t0}); err == nil {
		t.Fatal("unknown state accepted")
	}

	ro, err := Open(ctx, Options{Path: path, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.CheckpointRun(ctx, RunCheckpoint{RunID: "r1", State: RunRunning, At: t0}); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only checkpoint: %v, want ErrReadOnly", err)
	}
	if runs, err := ro.ListRuns(ctx, RunFilter{}); err != nil || len(runs) != 1 {
		t.Fatalf("read-only list: %d runs, %v", len(runs), err)
	}
}

func TestListAndPruneRuns(t *testing.T) {
	d, _ := openRunsDB(t)
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	for i, spec := range []struct{ fsm, state string }{
		{"download-image", RunComplete}, {"download-image", RunFailed}, {"unpack-image", RunPending},
		{"unpack-image", RunRunning}, {"download-image", RunPending},
	} {
		id := fmt.Sprintf("r%d", i)
		if _, _, err := d.CreateRun(ctx, newRun(id, spec.fsm, id, t0.Add(time.Duration(i)*time.Second))); err != nil {
			t.Fatal(err)
		}
		if spec.state != RunPending {
			if err := d.CheckpointRun(ctx, RunCheckpoint{RunID: id, State: spec.state, Transition: "x", At: t0.Add(time.Duration(i) * time.Second)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := func(runs []Run) string {
		s := ""
		for _, r := range runs {
			s += r.ID + " "
		}
		return s
	}
	for _, tc := range []struct {
		f    RunFilter
		want string
	}{
		{RunFilter{}, "r4 r3 r2 r1 r0 "},
		{RunFilter{FSM: "download-image"}, "r4 r1 r0 "},
		{RunFilter{States: []string{RunPending, RunRunning}}, "r4 r3 r2 "},
		{RunFilter{States: []string{RunPending}, FSM: "unpack-image"}, "r2 "},
		{RunFilter{Limit: 2}, "r4 r3 "},
	} {
		runs, err := d.ListRuns(ctx, tc.f)
		if err != nil || ids(runs) != tc.want {
			t.Errorf("ListRuns(%+v) = %q, %v; want %q", tc.f, ids(runs), err, tc.want)
		}
	}
	if _, err := d.ListRuns(ctx, RunFilter{States: []string{"done"}}); err == nil {
		t.Error("unknown state filter accepted")
	}
	live, err := d.UnfinishedRuns(ctx)
	if err != nil || ids(live) != "r2 r3 r4 " {
		t.Fatalf("UnfinishedRuns = %q, %v; want oldest first r2 r3 r4", ids(live), err)
	}
	n, err := d.DeleteFinishedRuns(ctx, t0.Add(time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("DeleteFinishedRuns = %d, %v; want the 2 finished runs", n, err)
	}
	if all, _ := d.ListRuns(ctx, RunFilter{}); ids(all) != "r4 r3 r2 " {
		t.Fatalf("after pruning: %q; live runs must stay", ids(all))
	}
}
