package fsm_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
)

// waitLimit bounds every wait in these tests so that a bug shows as a
// failure naming what hung, not as a stuck test binary.
const waitLimit = 60 * time.Second

type testReq struct {
	Name string `json:"name"`
}

type testResp struct {
	Steps []string `json:"steps"`
	Path  string   `json:"path,omitempty"`
}

// openDB opens a fresh database file in a temporary directory.
func openDB(t testing.TB) *metadata.DB {
	t.Helper()
	return openDBAt(t, filepath.Join(t.TempDir(), "metadata.db"))
}

func openDBAt(t testing.TB, path string) *metadata.DB {
	t.Helper()
	return metadatatest.OpenPath(t, path)
}

func newManager(t testing.TB, db *metadata.DB, opts ...fsm.ManagerOption) *fsm.Manager {
	t.Helper()
	m := fsm.NewManager(fsm.NewSQLiteStore(db), opts...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("closing manager: %v", err)
		}
	})
	return m
}

// newManagerOnNewDB opens a fresh database and a manager on it with opts,
// closed when the test ends; it returns both, the database for the test to
// read the runs' rows.
func newManagerOnNewDB(t testing.TB, opts ...fsm.ManagerOption) (*metadata.DB, *fsm.Manager) {
	t.Helper()
	db := openDB(t)
	return db, newManager(t, db, opts...)
}

// fast is a retry policy with millisecond delays.
func fast(attempts int) fsm.TransitionOption {
	return fsm.WithRetry(fsm.ExponentialBackoff(attempts).WithDelays(time.Millisecond, 4*time.Millisecond))
}

// step returns a transition that appends name to the response's steps.
func step(name string, calls *atomic.Int32) fsm.TransitionFunc[testReq, testResp] {
	return func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
		if calls != nil {
			calls.Add(1)
		}
		req.Resp.Steps = append(req.Resp.Steps, name)
		return fsm.NewResponse(req.Resp), nil
	}
}

func waitCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// startX starts a run of start, idempotency id "x" with an empty request,
// failing the test if it does not start. It returns the context to wait
// for the run with, which ends at the test's wait limit, and the run's id.
func startX(t testing.TB, start fsm.StartFunc[testReq]) (context.Context, string) {
	t.Helper()
	ctx := waitCtx(t)
	id, err := start(ctx, "x", &testReq{})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, id
}

func mustBuild[R, W any](t testing.TB, b *fsm.Builder[R, W]) fsm.StartFunc[R] {
	t.Helper()
	start, _, err := b.Build(context.Background())
	if err != nil {
		t.Fatalf("building FSM: %v", err)
	}
	return start
}

func TestTransitionsRunInOrderAndCheckpoint(t *testing.T) {
	db, m := newManagerOnNewDB(t)
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "ordered").
		Start("one", step("one", nil)).
		To("two", step("two", nil)).
		To("three", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			// The checkpointed response of the earlier transitions is visible.
			if got := strings.Join(req.Resp.Steps, ","); got != "one,two" {
				return nil, fsm.Unrecoverable(fmt.Errorf("response before three = %q", got))
			}
			if req.Msg.Name != "hello" || req.Run.Transition != "three" || req.Run.Attempt != 1 {
				return nil, fsm.Unrecoverable(fmt.Errorf("request %+v, run info %+v", req.Msg, req.Run))
			}
			req.Resp.Steps = append(req.Resp.Steps, "three") // in place, returning nil
			return nil, nil
		}).
		End("done"))

	ctx := waitCtx(t)
	id, err := start(ctx, "img-1", &testReq{Name: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := fsm.Await[testResp](ctx, m, id)
	if err != nil {
		t.Fatalf("Await: %v", err)
	}
	if got := strings.Join(resp.Steps, ","); got != "one,two,three" {
		t.Fatalf("steps = %q, want one,two,three", got)
	}
	row, err := fsm.NewSQLiteStore(db).GetRun(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if row.State != fsm.StateComplete || row.Transition != "done" || row.FSM != "ordered" || row.IdempotencyID != "img-1" {
		t.Fatalf("row = state %s transition %q fsm %q id %q", row.State, row.Transition, row.FSM, row.IdempotencyID)
	}
	if row.StartedAt.IsZero() || row.FinishedAt.IsZero() || row.FinishedAt.Before(row.StartedAt) {
		t.Fatalf("started %v finished %v", row.StartedAt, row.FinishedAt)
	}
	if string(row.Request) != `{"name":"hello"}` {
		t.Fatalf("request JSON = %s", row.Request)
	}
}

func TestRetryWithBackoffThenSuccess(t *testing.T) {
	db, m := newManagerOnNewDB(t)
	var calls atomic.Int32
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "flaky").
		Start("fetch", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			n := calls.Add(1)
			// Changes made by a failing attempt must not survive it.
			req.Resp.Steps = append(req.Resp.Steps, fmt.Sprintf("attempt-%d", n))
			if int(n) != req.Run.Attempt {
				return nil, fsm.Unrecoverable(fmt.Errorf("call %d saw attempt %d", n, req.Run.Attempt))
			}
			if n < 3 {
				return nil, fmt.Errorf("503 number %d", n)
			}
			return fsm.NewResponse(req.Resp), nil
		}, fast(5)).
		End("done"))
	ctx, id := startX(t, start)
	resp, err := fsm.Await[testResp](ctx, m, id)
	if err != nil {
		t.Fatalf("Await: %v", err)
	}
	if calls.Load() != 3 || strings.Join(resp.Steps, ",") != "attempt-3" {
		t.Fatalf("calls = %d, steps = %v; want 3 calls and only the successful attempt's change", calls.Load(), resp.Steps)
	}
	row, _ := fsm.NewSQLiteStore(db).GetRun(ctx, id)
	if row.State != fsm.StateComplete || !strings.Contains(row.LastError, "503 number 2") {
		t.Fatalf("state %s, last error %q; want complete with the last retried error kept", row.State, row.LastError)
	}
}

func TestMaxAttemptsFailsWithLastError(t *testing.T) {
	db, m := newManagerOnNewDB(t)
	var calls, after atomic.Int32
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "broken").
		Start("fetch", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			return nil, fmt.Errorf("connection reset %d", calls.Add(1))
		}, fast(3)).
		To("never", step("never", &after)).
		End("done"))
	ctx, id := startX(t, start)
	state, _, err := m.Wait(ctx, id)
	if state != fsm.StateFailed || !errors.Is(err, fsm.ErrFailed) {
		t.Fatalf("Wait = %s, %v; want failed", state, err)
	}
	if !strings.Contains(err.Error(), "after 3 attempts") || !strings.Contains(err.Error(), "connection reset 3") {
		t.Fatalf("error %q does not name the attempts and the last error", err)
	}
	if calls.Load() != 3 || after.Load() != 0 {
		t.Fatalf("calls = %d, next transition calls = %d; want 3 and 0", calls.Load(), after.Load())
	}
	row, _ := fsm.NewSQLiteStore(db).GetRun(ctx, id)
	if row.State != fsm.StateFailed || row.Transition != "fetch" || row.Attempts != 3 || !strings.Contains(row.LastError, "connection reset 3") {
		t.Fatalf("row = %s %q attempts %d error %q", row.State, row.Transition, row.Attempts, row.LastError)
	}
}

func TestAbortUnrecoverableHandoff(t *testing.T) {
	cases := []struct {
		name      string
		ret       error
		wantState fsm.State
		wantIs    error
	}{
		{"abort", fsm.Abort(errors.New("tarball has ../etc/passwd")), fsm.StateAborted, fsm.ErrAborted},
		{"unrecoverable", fsm.Unrecoverable(errors.New("checksum mismatch")), fsm.StateFailed, fsm.ErrFailed},
		{"handoff", fsm.Handoff(&testResp{Path: "/already/there"}), fsm.StateComplete, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db, m := newManagerOnNewDB(t)
			var calls, after atomic.Int32
			start := mustBuild(t, fsm.Register[testReq, testResp](m, "kinds").
				Start("first", step("first", nil)).
				To("second", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
					calls.Add(1)
					return nil, tc.ret
				}, fast(5)).
				To("third", step("third", &after)).
				End("done"))
			ctx, id := startX(t, start)
			state, raw, err := m.Wait(ctx, id)
			if state != tc.wantState {
				t.Fatalf("state = %s (%v), want %s", state, err, tc.wantState)
			}
			if calls.Load() != 1 || after.Load() != 0 {
				t.Fatalf("second ran %d times, third %d times; want 1 and 0", calls.Load(), after.Load())
			}
			row, _ := fsm.NewSQLiteStore(db).GetRun(ctx, id)
			if tc.wantIs != nil {
				if !errors.Is(err, tc.wantIs) || !strings.Contains(err.Error(), tc.ret.Error()) || !strings.Contains(err.Error(), `"second"`) {
					t.Fatalf("err = %v; want %v naming the transition and reason", err, tc.wantIs)
				}
				if row.Transition != "second" || !strings.Contains(row.LastError, tc.ret.Error()) {
					t.Fatalf("row transition %q reason %q", row.Transition, row.LastError)
				}
				return
			}
			if err != nil || string(raw) != `{"steps":null,"path":"/already/there"}` || row.Transition != "done" {
				t.Fatalf("handoff: err %v response %s transition %q", err, raw, row.Transition)
			}
		})
	}
}

func TestPanicFailsRun(t *testing.T) {
	m := newManager(t, openDB(t))
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "panics").
		Start("boom", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			var p *testResp
			p.Path = "x" // nil dereference
			return nil, nil
		}).End("done"))
	ctx, id := startX(t, start)
	state, _, err := m.Wait(ctx, id)
	if state != fsm.StateFailed || !strings.Contains(err.Error(), "panic") {
		t.Fatalf("Wait = %s, %v; want failed naming the panic", state, err)
	}
}

func TestTimeoutIsRetryable(t *testing.T) {
	db, m := newManagerOnNewDB(t)
	var calls atomic.Int32
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "slow").
		Start("download", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			if calls.Add(1) == 1 {
				<-ctx.Done() // a server slower than the timeout
				return nil, ctx.Err()
			}
			if _, ok := ctx.Deadline(); !ok {
				return nil, fsm.Unrecoverable(errors.New("attempt has no deadline"))
			}
			return fsm.NewResponse(&testResp{Path: "/got/it"}), nil
		}, fsm.WithTimeout(20*time.Millisecond), fast(3)).
		End("done"))
	ctx, id := startX(t, start)
	resp, err := fsm.Await[testResp](ctx, m, id)
	if err != nil || resp.Path != "/got/it" || calls.Load() != 2 {
		t.Fatalf("Await = %+v, %v after %d calls; want success on the second call", resp, err, calls.Load())
	}
	row, _ := fsm.NewSQLiteStore(db).GetRun(ctx, id)
	if !strings.Contains(row.LastError, "timed out after 20ms") {
		t.Fatalf("last error %q does not record the timeout", row.LastError)
	}
}

func TestTimeoutExhaustedFails(t *testing.T) {
	m := newManager(t, openDB(t))
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "slow").
		Start("download", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, fsm.WithTimeout(5*time.Millisecond), fast(2)).
		End("done"))
	ctx, id := startX(t, start)
	state, _, err := m.Wait(ctx, id)
	if state != fsm.StateFailed || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("Wait = %s, %v; want failed by timeout", state, err)
	}
}

func TestQueueLimitRespected(t *testing.T) {
	const limit, runs = 2, 8
	db, m := newManagerOnNewDB(t, fsm.WithQueueLimit("unpacking", limit))
	var cur, maxSeen atomic.Int32
	allStarted := make(chan struct{})
	reached := make(chan struct{})
	var once sync.Once
	var checkErr atomic.Value
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "queued").
		Start("work", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			<-allStarted
			n := cur.Add(1)
			for {
				old := maxSeen.Load()
				if n <= old || maxSeen.CompareAndSwap(old, n) {
					break
				}
			}
			if n == limit {
				once.Do(func() {
					// While the limit is in use, every other run is pending.
					running, err1 := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{States: []fsm.State{fsm.StateRunning}})
					pending, err2 := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{States: []fsm.State{fsm.StatePending}})
					if err := errors.Join(err1, err2); err != nil || len(running) != limit || len(pending) != runs-limit {
						checkErr.Store(fmt.Sprintf("running %d pending %d (err %v); want %d and %d", len(running), len(pending), err, limit, runs-limit))
					}
					close(reached)
				})
			}
			<-reached
			cur.Add(-1)
			return nil, nil
		}).End("done"))
	ctx := waitCtx(t)
	var ids []string
	for i := range runs {
		id, err := start(ctx, fmt.Sprintf("layer-%d", i), &testReq{}, fsm.WithQueue("unpacking"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	close(allStarted)
	for _, id := range ids {
		if _, _, err := m.Wait(ctx, id); err != nil {
			t.Fatalf("run %s: %v", id, err)
		}
	}
	if got := maxSeen.Load(); got != limit {
		t.Fatalf("max concurrently running = %d, want exactly the limit %d", got, limit)
	}
	if msg := checkErr.Load(); msg != nil {
		t.Fatal(msg)
	}
}

func TestUnknownQueueRefused(t *testing.T) {
	m := newManager(t, openDB(t), fsm.WithQueueLimit("downloads", 5))
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "q").Start("a", step("a", nil)).End("done"))
	if _, err := start(context.Background(), "x", &testReq{}, fsm.WithQueue("dowloads")); err == nil || !strings.Contains(err.Error(), `"dowloads"`) {
		t.Fatalf("start with a misspelt queue = %v; want an error naming it", err)
	}
}

// download/unpack mimic the pipelines' chaining: unpack reads download's
// response through its run-after predecessor.
func chainFSMs(t *testing.T, m *fsm.Manager, downloadGate chan struct{}, downloadErr error, unpackCalls *atomic.Int32) (fsm.StartFunc[testReq], fsm.StartFunc[testReq]) {
	download := mustBuild(t, fsm.Register[testReq, testResp](m, "download-image").
		Start("download", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			<-downloadGate
			if downloadErr != nil {
				return nil, downloadErr
			}
			return fsm.NewResponse(&testResp{Path: "/images/" + req.Msg.Name + ".tar"}), nil
		}).End("complete"))
	unpack := mustBuild(t, fsm.Register[testReq, testResp](m, "unpack-image").
		Start("extract", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			unpackCalls.Add(1)
			dl, err := fsm.PredecessorResponse[testResp](req.Run, "download-image")
			if err != nil {
				return nil, fsm.Unrecoverable(err)
			}
			return fsm.NewResponse(&testResp{Path: "unpacked " + dl.Path}), nil
		}).End("complete"))
	return download, unpack
}

func TestRunAfterChaining(t *testing.T) {
	db, m := newManagerOnNewDB(t)
	gate := make(chan struct{})
	var unpackCalls atomic.Int32
	download, unpack := chainFSMs(t, m, gate, nil, &unpackCalls)
	ctx := waitCtx(t)
	dlID, err := download(ctx, "alpine", &testReq{Name: "alpine"})
	if err != nil {
		t.Fatal(err)
	}
	upID, err := unpack(ctx, "alpine", &testReq{Name: "alpine"}, fsm.WithRunAfter(dlID), fsm.WithParent("pull-1"))
	if err != nil {
		t.Fatal(err)
	}
	// The download is held: the unpack must still be pending.
	row, _ := fsm.NewSQLiteStore(db).GetRun(ctx, upID)
	if row.State != fsm.StatePending || unpackCalls.Load() != 0 {
		t.Fatalf("unpack before its predecessor finished: state %s, calls %d", row.State, unpackCalls.Load())
	}
	if len(row.RunAfter) != 1 || row.RunAfter[0] != dlID || row.Parent != "pull-1" {
		t.Fatalf("row run-after %v parent %q", row.RunAfter, row.Parent)
	}
	close(gate)
	resp, err := fsm.Await[testResp](ctx, m, upID)
	if err != nil {
		t.Fatalf("unpack: %v", err)
	}
	if resp.Path != "unpacked /images/alpine.tar" {
		t.Fatalf("unpack response %q; want it built from download's response", resp.Path)
	}
	got, err := fsm.ResponseOf[testResp](ctx, m, dlID)
	if err != nil || got.Path != "/images/alpine.tar" {
		t.Fatalf("ResponseOf(download) = %+v, %v", got, err)
	}
}

func TestRunAfterAbortPropagates(t *testing.T) {
	m := newManager(t, openDB(t))
	gate := make(chan struct{})
	close(gate)
	var unpackCalls atomic.Int32
	download, unpack := chainFSMs(t, m, gate, fsm.Abort(errors.New("S3 access denied")), &unpackCalls)
	ctx := waitCtx(t)
	dlID, _ := download(ctx, "alpine", &testReq{Name: "alpine"})
	upID, err := unpack(ctx, "alpine", &testReq{}, fsm.WithRunAfter(dlID))
	if err != nil {
		t.Fatal(err)
	}
	state, _, err := m.Wait(ctx, upID)
	if state != fsm.StateAborted || !errors.Is(err, fsm.ErrAborted) {
		t.Fatalf("dependent = %s, %v; want aborted", state, err)
	}
	if !strings.Contains(err.Error(), dlID) || !strings.Contains(err.Error(), "S3 access denied") {
		t.Fatalf("reason %q does not name the predecessor %s and its reason", err, dlID)
	}
	if unpackCalls.Load() != 0 {
		t.Fatalf("dependent's transition ran %d times after its predecessor aborted", unpackCalls.Load())
	}
	if _, err := unpack(ctx, "other", &testReq{}, fsm.WithRunAfter("no-such-run")); !errors.Is(err, fsm.ErrRunNotFound) {
		t.Fatalf("run-after an unknown run = %v; want ErrRunNotFound", err)
	}
}

// fakeFlakyStore is the SQLite store but for the reads of one run, the
// next failures of which fail as a database that is briefly unavailable
// fails them: a fault injected at the store's boundary.
type fakeFlakyStore struct {
	fsm.Store
	mu       sync.Mutex
	run      string
	failures int
}

func (s *fakeFlakyStore) failReads(runID string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.run, s.failures = runID, n
}

func (s *fakeFlakyStore) GetRun(ctx context.Context, runID string) (fsm.RunRecord, error) {
	s.mu.Lock()
	fail := runID == s.run && s.failures > 0
	if fail {
		s.failures--
	}
	s.mu.Unlock()
	if fail {
		return fsm.RunRecord{}, fmt.Errorf("fake: reading run %s: database is locked", runID)
	}
	return s.Store.GetRun(ctx, runID)
}

// TestRunAfterSurvivesAFailedReadOfThePredecessor: a read of a run-after
// predecessor that fails once (the database briefly unavailable) is read
// again; the waiting run goes on when its predecessor completes instead
// of stopping in memory, pending, until the next start of the process.
func TestRunAfterSurvivesAFailedReadOfThePredecessor(t *testing.T) {
	db := openDB(t)
	store := &fakeFlakyStore{Store: fsm.NewSQLiteStore(db)}
	m := fsm.NewManager(store)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("closing manager: %v", err)
		}
	})
	gate := make(chan struct{})
	var unpackCalls atomic.Int32
	download, unpack := chainFSMs(t, m, gate, nil, &unpackCalls)
	ctx := waitCtx(t)
	dlID, err := download(ctx, "alpine", &testReq{Name: "alpine"})
	if err != nil {
		t.Fatal(err)
	}
	upID, err := unpack(ctx, "alpine", &testReq{Name: "alpine"}, fsm.WithRunAfter(dlID))
	if err != nil {
		t.Fatal(err)
	}
	store.failReads(dlID, 1)
	close(gate)
	resp, err := fsm.Await[testResp](ctx, m, upID)
	if err != nil || resp.Path != "unpacked /images/alpine.tar" {
		row, _ := fsm.NewSQLiteStore(db).GetRun(ctx, upID)
		t.Fatalf("unpack after one failed read of its predecessor: %+v, %v (row %s at %q); want it complete", resp, err, row.State, row.Transition)
	}
}

func TestIdempotentStart(t *testing.T) {
	db, m := newManagerOnNewDB(t)
	var calls atomic.Int32
	gate := make(chan struct{})
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "download-image").
		Start("download", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			calls.Add(1)
			<-gate
			return nil, nil
		}).End("complete"))
	ctx := waitCtx(t)
	const pulls = 10
	ids := make([]string, pulls)
	errs := make([]error, pulls)
	var wg sync.WaitGroup
	for i := range pulls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], errs[i] = start(ctx, "sha256:abc", &testReq{Name: fmt.Sprint(i)})
		}()
	}
	wg.Wait()
	for i := range pulls {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("pull %d got run %q (%v); pull 0 got %q", i, ids[i], errs[i], ids[0])
		}
	}
	close(gate)
	for i := range pulls {
		if _, _, err := m.Wait(ctx, ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	runs, _ := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{FSM: "download-image"})
	if calls.Load() != 1 || len(runs) != 1 {
		t.Fatalf("transition ran %d times, %d runs recorded; want one of each", calls.Load(), len(runs))
	}
	// Once finished, the same id starts a fresh run (which can hand off).
	again, err := start(ctx, "sha256:abc", &testReq{})
	if err != nil || again == ids[0] {
		t.Fatalf("start after completion = %q, %v; want a new run", again, err)
	}
}

// TestShutdownThenResume stops a manager mid-transition and continues the
// run in a new manager on the same database file, through Resume or through
// a start of the same idempotency id.
func TestShutdownThenResume(t *testing.T) {
	for _, mode := range []string{"resume", "start-again"} {
		t.Run(mode, func(t *testing.T) { testShutdownThenResume(t, mode) })
	}
}

func testShutdownThenResume(t *testing.T, mode string) {
	path := filepath.Join(t.TempDir(), "metadata.db")
	db := openDBAt(t, path)
	var firstCalls atomic.Int32
	entered := make(chan struct{})
	m1 := fsm.NewManager(fsm.NewSQLiteStore(db))
	start := mustBuild(t, fsm.Register[testReq, testResp](m1, "resumable").
		Start("one", step("one", &firstCalls)).
		To("two", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			close(entered)
			<-ctx.Done()
			return nil, ctx.Err()
		}, fast(2)).
		End("done"))
	ctx, id := startX(t, start)
	<-entered
	if err := m1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	row, _ := fsm.NewSQLiteStore(db).GetRun(ctx, id)
	if row.State != fsm.StateRunning || row.Transition != "two" || row.Attempts != 0 {
		t.Fatalf("after shutdown: %s at %q attempts %d; want running at two with the cut attempt uncounted", row.State, row.Transition, row.Attempts)
	}
	if _, err := start(ctx, "y", &testReq{}); !errors.Is(err, fsm.ErrClosed) {
		t.Fatalf("start after Close = %v; want ErrClosed", err)
	}

	db2 := openDBAt(t, path)
	m2 := newManager(t, db2)
	var secondCalls atomic.Int32
	start2, resume, err := fsm.Register[testReq, testResp](m2, "resumable").
		Start("one", step("one", &secondCalls)).
		To("two", step("two", nil)).
		End("done").Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mode == "resume" {
		if err := resume(ctx); err != nil {
			t.Fatal(err)
		}
	} else if again, err := start2(ctx, "x", &testReq{}); err != nil || again != id {
		t.Fatalf("start of the interrupted id = %q, %v; want the interrupted run %s", again, err, id)
	}
	resp, err := fsm.Await[testResp](ctx, m2, id)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(resp.Steps, ",") != "one,two" || firstCalls.Load() != 1 || secondCalls.Load() != 0 {
		t.Fatalf("steps %v, transition one ran %d+%d times; want one,two and once", resp.Steps, firstCalls.Load(), secondCalls.Load())
	}
	row, _ = fsm.NewSQLiteStore(db2).GetRun(ctx, id)
	if row.Attempts != 1 {
		t.Fatalf("attempts of the resumed transition = %d, want 1 (the shutdown-cut attempt does not count)", row.Attempts)
	}
}

func TestBuildRejectsBadDeclarations(t *testing.T) {
	m := newManager(t, openDB(t))
	noop := step("x", nil)
	cases := map[string]*fsm.Builder[testReq, testResp]{
		"To(\"a\") before Start": fsm.Register[testReq, testResp](m, "a").To("a", noop).End("done"),
		"declared twice":         fsm.Register[testReq, testResp](m, "b").Start("a", noop).To("a", noop).End("done"),
		"no End":                 fsm.Register[testReq, testResp](m, "c").Start("a", noop),
		"has the name of":        fsm.Register[testReq, testResp](m, "d").Start("a", noop).End("a"),
		"nil function":           fsm.Register[testReq, testResp](m, "e").Start("a", nil).End("done"),
		"empty FSM name":         fsm.Register[testReq, testResp](m, " ").Start("a", noop).End("done"),
		"after End":              fsm.Register[testReq, testResp](m, "f").Start("a", noop).End("done").To("b", noop),
		"Start must come first":  fsm.Register[testReq, testResp](m, "g").Start("a", noop).Start("b", noop).End("done"),
	}
	for want, b := range cases {
		if _, _, err := b.Build(context.Background()); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Build = %v; want an error containing %q", err, want)
		}
	}
	mustBuild(t, fsm.Register[testReq, testResp](m, "ok").Start("a", noop).End("done"))
	if _, _, err := fsm.Register[testReq, testResp](m, "ok").Start("a", noop).End("done").Build(context.Background()); err == nil {
		t.Error("registering one name twice succeeded")
	}
}

func TestRetryPolicyDelays(t *testing.T) {
	p := fsm.ExponentialBackoff(5).WithDelays(10*time.Millisecond, 50*time.Millisecond)
	want := []time.Duration{10, 20, 40, 50, 50}
	for i, w := range want {
		if got := p.Delay(i + 1); got != w*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	j := fsm.ExponentialJitter(5).WithDelays(time.Second, time.Minute)
	for range 100 {
		if d := j.Delay(3); d < 2*time.Second || d > 4*time.Second {
			t.Fatalf("jittered Delay(3) = %v, want within [2s, 4s]", d)
		}
	}
	if d := fsm.FixedRetry(2, time.Second).Delay(7); d != time.Second {
		t.Fatalf("fixed Delay(7) = %v", d)
	}
}

// TestResumeOfLeftoverRows resumes rows as a crashed process leaves them: a
// transition interrupted as often as it may be attempted fails instead of
// crash-looping, a transition the FSM no longer has fails naming it, and a
// pending run starts from its first transition.
func TestResumeOfLeftoverRows(t *testing.T) {
	db := openDB(t)
	ctx := waitCtx(t)
	now := time.Now()
	leftover := func(id, transition string, state fsm.State, attempts int) {
		t.Helper()
		if _, _, err := fsm.NewSQLiteStore(db).CreateRun(ctx, fsm.RunRecord{ID: id, FSM: "leftover", IdempotencyID: id, Request: []byte(`{"name":"n"}`),
			Transition: transition, State: fsm.StatePending, CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if state != fsm.StatePending {
			if err := fsm.NewSQLiteStore(db).Checkpoint(ctx, fsm.Checkpoint{RunID: id, State: state, Transition: transition,
				Attempts: attempts, LastError: "killed", At: now}); err != nil {
				t.Fatal(err)
			}
		}
	}
	leftover("crashloop", "fetch", fsm.StateRunning, 3)
	leftover("renamed", "fetch-old-name", fsm.StateRunning, 1)
	leftover("fresh", "fetch", fsm.StatePending, 0)
	leftover("second-try", "fetch", fsm.StateRunning, 2)

	m := newManager(t, db)
	var calls atomic.Int32
	_, resume, err := fsm.Register[testReq, testResp](m, "leftover").
		Start("fetch", step("fetch", &calls), fast(3)).
		End("done").Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := resume(ctx); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{
		"crashloop": "no attempt left: 3 counted of 3 allowed",
		"renamed":   `"fetch-old-name" is not one of leftover's transitions (fetch)`,
	} {
		state, _, err := m.Wait(ctx, id)
		if state != fsm.StateFailed || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %s, %v; want failed with %q", id, state, err, want)
		}
	}
	for id, attempts := range map[string]int{"fresh": 1, "second-try": 3} {
		if _, _, err := m.Wait(ctx, id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if row, _ := fsm.NewSQLiteStore(db).GetRun(ctx, id); row.Attempts != attempts {
			t.Errorf("%s: completed with attempts %d, want %d", id, row.Attempts, attempts)
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("transition ran %d times; want 2 (fresh and second-try only)", calls.Load())
	}
}

// TestResumedRunsWaitForTheirQueue: two runs interrupted while running in a
// queue of one resume one at a time, the waiting one recorded as pending.
func TestResumedRunsWaitForTheirQueue(t *testing.T) {
	db := openDB(t)
	ctx := waitCtx(t)
	now := time.Now()
	for _, id := range []string{"a", "b"} {
		if _, _, err := fsm.NewSQLiteStore(db).CreateRun(ctx, fsm.RunRecord{ID: id, FSM: "queued", IdempotencyID: id, Queue: "unpacking",
			Request: []byte(`{}`), Transition: "work", State: fsm.StatePending, CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := fsm.NewSQLiteStore(db).Checkpoint(ctx, fsm.Checkpoint{RunID: id, State: fsm.StateRunning, Transition: "work", Attempts: 1, At: now}); err != nil {
			t.Fatal(err)
		}
	}
	m := newManager(t, db, fsm.WithQueueLimit("unpacking", 1))
	entered, release := make(chan string, 2), make(chan struct{})
	_, resume, err := fsm.Register[testReq, testResp](m, "queued").
		Start("work", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			entered <- req.Run.ID
			<-release
			return nil, nil
		}).End("done").Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := resume(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-entered
	other := map[string]string{"a": "b", "b": "a"}[first]
	// The other run records that it waits, then waits.
	for {
		row, err := fsm.NewSQLiteStore(db).GetRun(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		if row.State == fsm.StatePending {
			break
		}
		select {
		case id := <-entered:
			t.Fatalf("run %s entered while %s held the only slot", id, first)
		case <-ctx.Done():
			t.Fatalf("run %s never recorded as pending: %s", other, row.State)
		case <-time.After(time.Millisecond):
		}
	}
	close(release)
	for _, id := range []string{"a", "b"} {
		if _, _, err := m.Wait(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if second := <-entered; second != other {
		t.Fatalf("second run entered = %s, want %s", second, other)
	}
}

// TestRetryObserverAndOnFail: every retried attempt is reported to the
// manager's retry observer, and a run that ends without completing (here,
// attempts used up) runs the machine's cleanup once, with its request and
// where it stopped, before its end is recorded.
func TestRetryObserverAndOnFail(t *testing.T) {
	db := openDB(t)
	var mu sync.Mutex
	var retried []string
	m := newManager(t, db, fsm.WithRetryObserver(func(name, transition string) {
		mu.Lock()
		defer mu.Unlock()
		retried = append(retried, name+"/"+transition)
	}))
	var cleanups atomic.Int32
	var cleaned string
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "leaky").
		Start("make", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			return nil, errors.New("half made")
		}, fast(3)).
		End("done").
		OnFail(func(ctx context.Context, req *fsm.Request[testReq, testResp]) error {
			cleanups.Add(1)
			cleaned = req.Run.Transition
			if row, err := fsm.NewSQLiteStore(db).GetRun(ctx, req.Run.ID); err != nil || row.State == fsm.StateFailed {
				t.Errorf("cleanup ran after the end was recorded: %+v %v", row, err)
			}
			return nil
		}))
	ctx, id := startX(t, start)
	if state, _, _ := m.Wait(ctx, id); state != fsm.StateFailed {
		t.Fatalf("state %s, want failed", state)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(retried, ",") != "leaky/make,leaky/make" {
		t.Errorf("retries observed: %v, want the two retried attempts of leaky/make", retried)
	}
	if cleanups.Load() != 1 || cleaned != "make" {
		t.Errorf("cleanups = %d at %q, want 1 at make", cleanups.Load(), cleaned)
	}
}

// TestWaitEndsWhenTheManagerCloses: a caller waiting for a run the closing
// manager leaves live (it resumes at the next start) is told the manager
// closed, instead of waiting for an end that never comes in this process.
func TestWaitEndsWhenTheManagerCloses(t *testing.T) {
	db := openDB(t)
	m := fsm.NewManager(fsm.NewSQLiteStore(db))
	entered := make(chan struct{})
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "cut").
		Start("one", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			close(entered)
			<-ctx.Done()
			return nil, ctx.Err()
		}).
		End("done"))
	ctx, id := startX(t, start)
	<-entered
	waited := make(chan error, 1)
	go func() {
		_, _, err := m.Wait(ctx, id)
		waited <- err
	}()
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if !errors.Is(err, fsm.ErrClosed) {
			t.Fatalf("Wait for a run cut by Close = %v; want ErrClosed", err)
		}
	case <-time.After(waitLimit):
		t.Fatalf("Wait for run %s still blocked %s after Close returned", id, waitLimit)
	}
	if _, _, err := m.Wait(ctx, id); !errors.Is(err, fsm.ErrClosed) {
		t.Fatalf("Wait after Close = %v; want ErrClosed", err)
	}
}

// pausingStore is a fake Store that holds CreateRun until released, to
// put a start between its check of the manager and its row.
type pausingStore struct {
	fsm.Store
	creating, release chan struct{}
}

func (s *pausingStore) CreateRun(ctx context.Context, r fsm.RunRecord) (fsm.RunRecord, bool, error) {
	close(s.creating)
	<-s.release
	return s.Store.CreateRun(ctx, r)
}

// TestCloseWaitsForStartsUnderWay: a start already past its check of the
// manager when Close begins has written its run before Close returns, so
// that nothing this manager's callers do reaches the database after it is
// closed (a new process resuming from the same file would otherwise miss
// that run, or race it).
func TestCloseWaitsForStartsUnderWay(t *testing.T) {
	db := openDB(t)
	store := &pausingStore{Store: fsm.NewSQLiteStore(db), creating: make(chan struct{}), release: make(chan struct{})}
	m := fsm.NewManager(store)
	start := mustBuild(t, fsm.Register[testReq, testResp](m, "late").Start("one", step("one", nil)).End("done"))
	ctx := waitCtx(t)
	started := make(chan error, 1)
	go func() {
		_, err := start(ctx, "x", &testReq{})
		started <- err
	}()
	<-store.creating
	closed := make(chan error, 1)
	go func() { closed <- m.Close(ctx) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a start was writing its run", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(store.release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	// What Close promises: the start's run is written by the time it
	// returns (the start itself returns just after).
	runs, err := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{FSM: "late"})
	if err != nil || len(runs) != 1 || runs[0].State != fsm.StatePending {
		t.Fatalf("runs once Close returned: %+v, %v; want the one started, pending for the next Resume", runs, err)
	}
	select {
	case err := <-started:
		if !errors.Is(err, fsm.ErrClosed) {
			t.Fatalf("start cut by Close = %v; want its run recorded and ErrClosed", err)
		}
	case <-time.After(waitLimit):
		t.Fatalf("the start under way has not returned %s after Close did", waitLimit)
	}
}
