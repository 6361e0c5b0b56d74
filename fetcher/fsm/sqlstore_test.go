package fsm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
)

func newRun(id, fsm, idem string, created time.Time) RunRecord {
	return RunRecord{ID: id, FSM: fsm, IdempotencyID: idem, Request: []byte(`{"k":1}`), Transition: "check-exists",
		State: StatePending, CreatedAt: created, UpdatedAt: created}
}

func openRunsDB(t *testing.T) (*SQLiteStore, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs.db")
	return NewSQLiteStore(metadatatest.OpenPath(t, path)), path
}

func TestCreateRunOneLiveRunPerID(t *testing.T) {
	d, _ := openRunsDB(t)
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	var wg sync.WaitGroup
	got := make([]RunRecord, 10)
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
	if err := d.Checkpoint(ctx, Checkpoint{RunID: got[0].ID, State: StateComplete, Transition: "complete", At: t0}); err != nil {
		t.Fatal(err)
	}
	if r, c, err := d.CreateRun(ctx, newRun("again", "download-image", "sha256:aa", t0)); err != nil || !c || r.ID != "again" {
		t.Fatalf("after completion: %+v created %v, %v; want a new run", r.ID, c, err)
	}
	if _, _, err := d.CreateRun(ctx, RunRecord{ID: "x", FSM: "f", IdempotencyID: "i", Transition: "t", State: StateComplete}); err == nil {
		t.Fatal("creating a run in a terminal state succeeded")
	}
}

func TestCheckpointRun(t *testing.T) {
	d, path := openRunsDB(t)
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	r := newRun("r1", "download-image", "img", t0)
	r.RunAfter = []string{"a1", "a2"}
	r.Parent, r.Queue = "p", "downloads"
	if _, _, err := d.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	steps := []Checkpoint{
		{RunID: "r1", State: StateRunning, Transition: "check-exists", Attempts: 1, At: t0.Add(1 * time.Second)},
		{RunID: "r1", State: StateRunning, Transition: "download", Attempts: 1, Response: []byte(`{"exists":false}`), At: t0.Add(2 * time.Second)},
		{RunID: "r1", State: StateRunning, Transition: "download", Attempts: 2, LastError: "503", At: t0.Add(3 * time.Second)},
	}
	for _, c := range steps {
		if err := d.Checkpoint(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := d.GetRun(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateRunning || got.Transition != "download" || got.Attempts != 2 || got.LastError != "503" ||
		string(got.Response) != `{"exists":false}` || !got.StartedAt.Equal(t0.Add(time.Second)) || !got.FinishedAt.IsZero() ||
		len(got.RunAfter) != 2 || got.RunAfter[1] != "a2" || got.Parent != "p" || got.Queue != "downloads" {
		t.Fatalf("after checkpoints: %+v", got)
	}
	if err := d.Checkpoint(ctx, Checkpoint{RunID: "r1", State: StateAborted, Transition: "download", Attempts: 2, LastError: "access denied", At: t0.Add(4 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	err = d.Checkpoint(ctx, Checkpoint{RunID: "r1", State: StateRunning, Transition: "validate", At: t0.Add(5 * time.Second)})
	if !errors.Is(err, ErrRunFinished) {
		t.Fatalf("checkpoint of a finished run: %v, want ErrRunFinished", err)
	}
	got, _ = d.GetRun(ctx, "r1")
	if got.State != StateAborted || !got.FinishedAt.Equal(t0.Add(4*time.Second)) || got.LastError != "access denied" {
		t.Fatalf("finished run changed or finished_at wrong: %+v", got)
	}
	if err := d.Checkpoint(ctx, Checkpoint{RunID: "nope", State: StateRunning, At: t0}); !errors.Is(err, ErrRunNotFound) || !errdefs.IsNotFound(err) {
		t.Fatalf("checkpoint of an unknown run: %v", err)
	}
	if err := d.Checkpoint(ctx, Checkpoint{RunID: "r1", State: "paused", At: t0}); err == nil {
		t.Fatal("unknown state accepted")
	}

	ro, err := metadata.Open(ctx, metadata.Options{Path: path, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := NewSQLiteStore(ro).Checkpoint(ctx, Checkpoint{RunID: "r1", State: StateRunning, At: t0}); !errors.Is(err, metadata.ErrReadOnly) {
		t.Fatalf("read-only checkpoint: %v, want ErrReadOnly", err)
	}
	if runs, err := NewSQLiteStore(ro).ListRuns(ctx, RunFilter{}); err != nil || len(runs) != 1 {
		t.Fatalf("read-only list: %d runs, %v", len(runs), err)
	}
}

func TestListRuns(t *testing.T) {
	d, _ := openRunsDB(t)
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	for i, spec := range []struct {
		fsm   string
		state State
	}{
		{"download-image", StateComplete}, {"download-image", StateFailed}, {"unpack-image", StatePending},
		{"unpack-image", StateRunning}, {"download-image", StatePending},
	} {
		id := fmt.Sprintf("r%d", i)
		if _, _, err := d.CreateRun(ctx, newRun(id, spec.fsm, id, t0.Add(time.Duration(i)*time.Second))); err != nil {
			t.Fatal(err)
		}
		if spec.state != StatePending {
			if err := d.Checkpoint(ctx, Checkpoint{RunID: id, State: spec.state, Transition: "x", At: t0.Add(time.Duration(i) * time.Second)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := func(runs []RunRecord) string {
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
		{RunFilter{States: []State{StatePending, StateRunning}}, "r4 r3 r2 "},
		{RunFilter{States: []State{StatePending}, FSM: "unpack-image"}, "r2 "},
		{RunFilter{Limit: 2}, "r4 r3 "},
	} {
		runs, err := d.ListRuns(ctx, tc.f)
		if err != nil || ids(runs) != tc.want {
			t.Errorf("ListRuns(%+v) = %q, %v; want %q", tc.f, ids(runs), err, tc.want)
		}
	}
	if _, err := d.ListRuns(ctx, RunFilter{States: []State{"done"}}); err == nil {
		t.Error("unknown state filter accepted")
	}
	live, err := d.UnfinishedRuns(ctx)
	if err != nil || ids(live) != "r2 r3 r4 " {
		t.Fatalf("UnfinishedRuns = %q, %v; want oldest first r2 r3 r4", ids(live), err)
	}
}
