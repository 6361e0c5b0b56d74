package fsm_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// The kill test: a child process (this test binary, re-executed) runs a
// five-transition FSM whose transitions append to a journal file; the parent
// SIGKILLs it at random moments, restarts it, and checks from the journal and
// the checkpoints that no completed transition ever ran again.

const killFSM = "kill-five"

var killSteps = []string{"t1", "t2", "t3", "t4", "t5"}

type killReq struct {
	Image string `json:"image"`
}

type killResp struct {
	Done []string `json:"done"`
}

func appendJournal(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(line + "\n") // one write: atomic with O_APPEND
	return errors.Join(werr, f.Close())
}

// TestKillChild is the child side of TestKillResume; it does nothing unless
// that test started it.
func TestKillChild(t *testing.T) {
	dbPath, journal := os.Getenv("FSM_KILL_DB"), os.Getenv("FSM_KILL_JOURNAL")
	if dbPath == "" {
		t.Skip("helper process of TestKillResume")
	}
	idem, life := os.Getenv("FSM_KILL_ID"), os.Getenv("FSM_KILL_LIFE")
	ctx, db, m := childManager(t, dbPath)
	b := fsm.Register[killReq, killResp](m, killFSM)
	for i, name := range killSteps {
		fn := func(ctx context.Context, req *fsm.Request[killReq, killResp]) (*fsm.Response[killResp], error) {
			tag := fmt.Sprintf("life=%s run=%s", life, req.Run.ID)
			if err := appendJournal(journal, fmt.Sprintf("%s start %s attempt=%d", tag, name, req.Run.Attempt)); err != nil {
				return nil, err
			}
			select { // the work: long enough to be killed in the middle of
			case <-time.After(time.Duration(20+rand.IntN(40)) * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if err := appendJournal(journal, fmt.Sprintf("%s done %s", tag, name)); err != nil {
				return nil, err
			}
			req.Resp.Done = append(req.Resp.Done, name)
			return fsm.NewResponse(req.Resp), nil
		}
		// Crashes count as attempts: allow plenty.
		retry := fsm.WithRetry(fsm.FixedRetry(1000, time.Millisecond))
		if i == 0 {
			b.Start(name, fn, retry)
		} else {
			b.To(name, fn, retry)
		}
	}
	start, resume, err := b.End("complete").Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := resume(ctx); err != nil {
		t.Fatal(err)
	}
	runs, err := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{FSM: killFSM})
	if err != nil {
		t.Fatal(err)
	}
	runID := ""
	for _, r := range runs {
		if r.IdempotencyID == idem {
			runID = r.ID
		}
	}
	if runID == "" {
		if runID, err = start(ctx, idem, &killReq{Image: idem}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := m.Wait(ctx, runID); err != nil {
		t.Fatalf("run %s: %v", runID, err)
	}
}

func TestKillResume(t *testing.T) {
	const minKills, minMidTransition, maxLives = 20, 5, 400
	dir := t.TempDir()
	dbPath, journal := filepath.Join(dir, "metadata.db"), filepath.Join(dir, "journal")
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("random seed %d", seed)

	kills, lives, runs, mostKills := 0, 0, 0, 0
	window, stuck, lastDone := 120*time.Millisecond, 0, 0
	for kills < minKills || midTransitionKills(t, journal) < minMidTransition {
		idem := fmt.Sprintf("image-%d", runs)
		runKills, runLives := kills, lives
		for complete := false; !complete; {
			lives++
			if lives > maxLives {
				t.Fatalf("%d child lives used (%d kills): %s still not complete after %d of them", maxLives, kills, idem, lives-runLives)
			}
			var stderr bytes.Buffer
			cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), "FSM_KILL_DB="+dbPath, "FSM_KILL_JOURNAL="+journal,
				"FSM_KILL_ID="+idem, "FSM_KILL_LIFE="+strconv.Itoa(lives))
			cmd.Stdout, cmd.Stderr = &stderr, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("child life %d of %s failed: %v\n%s", lives, idem, err, stderr.String())
				}
				complete = true
			case <-time.After(time.Duration(rng.Int64N(int64(window)))):
				_ = cmd.Process.Signal(syscall.SIGKILL)
				err := <-done
				var ee *exec.ExitError
				if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() {
					kills++
					// A slow machine (or -race) may need longer to start the
					// child: widen the window after lives without progress,
					// so that kills stay random but the run moves on.
					if d := doneCount(t, journal); d > lastDone {
						lastDone, stuck = d, 0
						window = max(120*time.Millisecond, window*3/4)
					} else if stuck++; stuck >= 3 && window < 10*time.Second {
						window, stuck = 2*window, 0
					}
				} else if err != nil {
					t.Fatalf("child life %d of %s failed: %v\n%s", lives, idem, err, stderr.String())
				} else {
					complete = true // it finished just before the signal
				}
			}
		}
		verifyKilledRun(t, dbPath, journal, idem)
		mostKills = max(mostKills, kills-runKills)
		runs++
	}
	t.Logf("%d SIGKILLs (%d in the middle of a transition, at most %d on one run) over %d child lives and %d runs, kill window %v; every run complete, no completed transition re-run",
		kills, midTransitionKills(t, journal), mostKills, lives, runs, window)
}

type journalEntry struct {
	life    int
	run     string
	event   string // start or done
	step    int    // index in killSteps
	attempt int
}

func readJournal(t *testing.T, path string) []journalEntry {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []journalEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e journalEntry
		var name string
		line := sc.Text()
		n, _ := fmt.Sscanf(line, "life=%d run=%s %s %s attempt=%d", &e.life, &e.run, &e.event, &name, &e.attempt)
		if n < 4 {
			t.Fatalf("journal line %q is malformed", line)
		}
		e.step = -1
		for i, s := range killSteps {
			if s == name {
				e.step = i
			}
		}
		if e.step < 0 {
			t.Fatalf("journal line %q names no transition", line)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// doneCount counts completed-transition entries in the journal.
func doneCount(t *testing.T, path string) int {
	n := 0
	for _, e := range readJournal(t, path) {
		if e.event == "done" {
			n++
		}
	}
	return n
}

// midTransitionKills counts child lives whose last journal entry is a
// start: killed while a transition was executing.
func midTransitionKills(t *testing.T, path string) int {
	last := map[int]journalEntry{}
	for _, e := range readJournal(t, path) {
		last[e.life] = e
	}
	n := 0
	for _, e := range last {
		if e.event == "start" {
			n++
		}
	}
	return n
}

// verifyKilledRun checks one run after it completed under kills.
func verifyKilledRun(t *testing.T, dbPath, journal, idem string) {
	t.Helper()
	ctx := context.Background()
	db, err := metadata.Open(ctx, metadata.Options{Path: dbPath, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	all, err := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{FSM: killFSM})
	if err != nil {
		t.Fatal(err)
	}
	var runs []fsm.RunRecord
	for _, r := range all {
		if r.IdempotencyID == idem {
			runs = append(runs, r)
		}
	}
	if len(runs) != 1 {
		t.Fatalf("%s: %d runs recorded, want exactly 1", idem, len(runs))
	}
	r := runs[0]
	// Checkpoints: each transition's completion recorded exactly once, in order.
	if r.State != fsm.StateComplete || r.Transition != "complete" || string(r.Response) != `{"done":["t1","t2","t3","t4","t5"]}` {
		t.Fatalf("%s: run %s state %s transition %q response %s; want complete with t1..t5 each once", idem, r.ID, r.State, r.Transition, r.Response)
	}
	// Journal: transitions start in order; one starts again only in a new
	// life after the previous life was killed in it; none starts before its
	// predecessor's completion.
	prevStep, prevLife, starts := -1, 0, 0
	doneSeen := map[int]bool{}
	for _, e := range readJournal(t, journal) {
		if e.run != r.ID {
			continue
		}
		if e.event == "done" {
			if e.step != prevStep || e.life != prevLife {
				t.Fatalf("%s: %s done in life %d while life %d ran %s", idem, killSteps[e.step], e.life, prevLife, killSteps[max(prevStep, 0)])
			}
			doneSeen[e.step] = true
			continue
		}
		switch {
		case e.step == prevStep:
			if e.life == prevLife {
				t.Fatalf("%s: %s started twice in life %d (no retries expected)", idem, killSteps[e.step], e.life)
			}
			starts++
		case e.step == prevStep+1:
			if prevStep >= 0 && !doneSeen[prevStep] {
				t.Fatalf("%s: %s started before %s completed", idem, killSteps[e.step], killSteps[prevStep])
			}
			starts = 1
		default:
			t.Fatalf("%s: %s started after %s: a completed transition ran again or one was skipped", idem, killSteps[e.step], killSteps[max(prevStep, 0)])
		}
		if e.attempt < starts {
			t.Fatalf("%s: %s start number %d reported attempt %d", idem, killSteps[e.step], starts, e.attempt)
		}
		prevStep, prevLife = e.step, e.life
	}
	if prevStep != len(killSteps)-1 || !doneSeen[prevStep] {
		t.Fatalf("%s: journal ends at %s (done %v)", idem, killSteps[max(prevStep, 0)], doneSeen[prevStep])
	}
	if r.FinishedAt.IsZero() {
		t.Fatalf("%s: finished_at not recorded", idem)
	}
}

// The retry-kill tests: a child process (this test binary, re-executed)
// runs one transition allowed two attempts whose first attempt fails with a
// transient error and whose later attempts hang; the parent SIGKILLs the
// child at a chosen moment and resumes the run itself.

const retryKillFSM = "retry-kill"

// TestRetryKillChild is the child side of the retry-kill tests; it does
// nothing unless one of them started it.
func TestRetryKillChild(t *testing.T) {
	dbPath, journal := os.Getenv("FSM_RETRY_KILL_DB"), os.Getenv("FSM_RETRY_KILL_JOURNAL")
	if dbPath == "" {
		t.Skip("helper process of the retry-kill tests")
	}
	delay, err := time.ParseDuration(os.Getenv("FSM_RETRY_KILL_DELAY"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, _, m := childManager(t, dbPath)
	start := mustBuild(t, fsm.Register[testReq, testResp](m, retryKillFSM).
		Start("work", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
			if err := appendJournal(journal, fmt.Sprintf("attempt=%d", req.Run.Attempt)); err != nil {
				return nil, err
			}
			if req.Run.Attempt == 1 {
				return nil, errors.New("connection reset by peer")
			}
			<-ctx.Done() // hang until killed
			return nil, ctx.Err()
		}, fsm.WithRetry(fsm.FixedRetry(2, delay))).
		End("done"))
	id, err := start(ctx, "x", &testReq{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = m.Wait(ctx, id)
	t.Fatalf("run %s ended (%v) before the parent killed this process", id, err)
}

// killRetryChild starts TestRetryKillChild on a fresh database with delay
// between the attempts, SIGKILLs it as soon as killNow accepts the run's row
// and the attempts the journal shows started, and returns the database and
// the row as the kill left it.
func killRetryChild(t *testing.T, delay time.Duration, killNow func(r fsm.RunRecord, started []string) bool) (*metadata.DB, fsm.RunRecord) {
	t.Helper()
	dir := t.TempDir()
	dbPath, journal := filepath.Join(dir, "metadata.db"), filepath.Join(dir, "journal")
	ctx := waitCtx(t)
	db := openDBAt(t, dbPath)
	var stderr bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestRetryKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FSM_RETRY_KILL_DB="+dbPath, "FSM_RETRY_KILL_JOURNAL="+journal,
		"FSM_RETRY_KILL_DELAY="+delay.String())
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case err := <-done:
			t.Fatalf("child ended before it was killed: %v\n%s", err, stderr.String())
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
			t.Fatalf("child never reached the moment to kill it\n%s", stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
		runs, err := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{FSM: retryKillFSM})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(journal)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if len(runs) == 1 && killNow(runs[0], strings.Fields(string(raw))) {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	runs, err := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{FSM: retryKillFSM})
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs after the kill: %v, %v; want one", runs, err)
	}
	return db, runs[0]
}

// resumeRetryKill resumes the killed child's run on db with a transition
// that succeeds, and returns how the run ended and how often the resumed
// transition ran.
func resumeRetryKill(t *testing.T, db *metadata.DB, id string) (fsm.RunRecord, int32) {
	t.Helper()
	ctx := waitCtx(t)
	m := newManager(t, db)
	var calls atomic.Int32
	_, resume, err := fsm.Register[testReq, testResp](m, retryKillFSM).
		Start("work", step("work", &calls), fsm.WithRetry(fsm.FixedRetry(2, time.Millisecond))).
		End("done").Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := resume(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, _ = m.Wait(ctx, id)
	r, err := fsm.NewSQLiteStore(db).GetRun(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return r, calls.Load()
}

// TestKillDuringRetryDelayCostsNoAttempt: a transition allowed two attempts
// fails once with a transient error and the process is SIGKILLed while it
// waits to retry. The row shows the one attempt that ran, and after the
// restart the second attempt runs and the run completes: a crash between
// attempts does not turn a transient error into a failed run.
func TestKillDuringRetryDelayCostsNoAttempt(t *testing.T) {
	db, killed := killRetryChild(t, time.Minute, func(r fsm.RunRecord, _ []string) bool {
		return r.LastError != ""
	})
	if killed.State != fsm.StateRunning || killed.Attempts != 1 || !strings.Contains(killed.LastError, "connection reset by peer") {
		t.Fatalf("row killed during the retry delay: %s, attempts %d, last error %q; want running, 1 attempt, the transient error",
			killed.State, killed.Attempts, killed.LastError)
	}
	r, calls := resumeRetryKill(t, db, killed.ID)
	if r.State != fsm.StateComplete || calls != 1 || r.Attempts != 2 {
		t.Fatalf("after a kill during the retry delay the run ended %s (%q) with %d further attempts and attempts %d; "+
			"want complete after its second attempt", r.State, r.LastError, calls, r.Attempts)
	}
}

// TestKillDuringRetriedAttemptCounts: the same transition's second (last)
// attempt is cut by a SIGKILL. That attempt counts, so the resumed run fails
// naming the interruption instead of running the transition a third time.
func TestKillDuringRetriedAttemptCounts(t *testing.T) {
	db, killed := killRetryChild(t, time.Millisecond, func(_ fsm.RunRecord, started []string) bool {
		return slices.Contains(started, "attempt=2")
	})
	if killed.State != fsm.StateRunning || killed.Attempts != 2 {
		t.Fatalf("row killed during the second attempt: %s, attempts %d; want running, 2 attempts", killed.State, killed.Attempts)
	}
	r, calls := resumeRetryKill(t, db, killed.ID)
	if r.State != fsm.StateFailed || calls != 0 || !strings.Contains(r.LastError, "no attempt left: 2 counted of 2 allowed") ||
		!strings.Contains(r.LastError, "connection reset by peer") || strings.Contains(r.LastError, "interrupted 2 times") {
		t.Fatalf("after a kill during the last attempt the run ended %s (%q) with %d further attempts; "+
			"want failed naming the first attempt's error, and no third attempt", r.State, r.LastError, calls)
	}
}

// childManager opens the database at dbPath for a child process of a kill
// test, bounded by waitLimit, and returns the context, the database and a
// manager on it.
func childManager(t *testing.T, dbPath string) (context.Context, *metadata.DB, *fsm.Manager) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	db, err := metadata.Open(ctx, metadata.Options{Path: dbPath})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, db, fsm.NewManager(fsm.NewSQLiteStore(db))
}

// TestKilledDuringCleanupEndsWithTheTransitionsReason: a process stopped
// for good (as kill -9 stops it) inside the cleanup of a run its
// transition aborted leaves the run live. The next start runs the cleanup
// again and ends the run with the transition's reason, without running
// the transition again: this one, like a validation that removes the file
// it rejects, cannot reach its verdict twice.
func TestKilledDuringCleanupEndsWithTheTransitionsReason(t *testing.T) {
	db := openDB(t)
	ctx := waitCtx(t)
	file := filepath.Join(t.TempDir(), "layer")
	if err := os.WriteFile(file, []byte("hostile"), 0o600); err != nil {
		t.Fatal(err)
	}
	var calls, cleanups atomic.Int32
	build := func(m *fsm.Manager, inCleanup func()) (fsm.StartFunc[testReq], func(context.Context) error) {
		t.Helper()
		start, resume, err := fsm.Register[testReq, testResp](m, "rejecting").
			Start("validate", func(ctx context.Context, req *fsm.Request[testReq, testResp]) (*fsm.Response[testResp], error) {
				calls.Add(1)
				if _, err := os.Stat(file); err != nil {
					return nil, fmt.Errorf("validate: %w", err)
				}
				if err := os.Remove(file); err != nil {
					return nil, err
				}
				return nil, fsm.Abort(errors.New("security: tarball rejected: path escapes the root"))
			}, fsm.WithRetry(fsm.FixedRetry(2, time.Millisecond))).
			End("complete").
			OnFail(func(ctx context.Context, req *fsm.Request[testReq, testResp]) error {
				cleanups.Add(1)
				inCleanup()
				return nil
			}).Build(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return start, resume
	}

	m1 := fsm.NewManager(fsm.NewSQLiteStore(db))
	inCleanup, killed := make(chan struct{}), make(chan struct{})
	start, _ := build(m1, func() { close(inCleanup); <-killed })
	id, err := start(ctx, "x", &testReq{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-inCleanup:
	case <-ctx.Done():
		t.Fatal("the aborted run never reached its cleanup")
	}
	t.Cleanup(func() {
		close(killed)
		if err := m1.Close(ctx); err != nil {
			t.Errorf("closing the first manager: %v", err)
		}
	})

	m2 := newManager(t, db)
	_, resume := build(m2, func() {})
	if err := resume(ctx); err != nil {
		t.Fatal(err)
	}
	state, _, err := m2.Wait(ctx, id)
	if !state.Terminal() || state == fsm.StateComplete || err == nil || !strings.Contains(err.Error(), "security: tarball rejected") {
		t.Errorf("resumed run ended %s: %v; want it ended with the rejection as its reason", state, err)
	}
	if calls.Load() != 1 || cleanups.Load() != 2 {
		t.Errorf("transition ran %d times, cleanup %d; want the transition once and the cleanup again after the restart", calls.Load(), cleanups.Load())
	}
}
