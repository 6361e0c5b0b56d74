// Package fsm is the durable state-machine runner of the S3 pipelines
// (Download, Unpack, Activate): every run lives in one row of the project's
// SQLite database (table fsm_runs) and survives a SIGKILL at any point.
//
// Declare a machine once per process, then start runs:
//
//	m := fsm.NewManager(fsm.NewSQLiteStore(db), fsm.WithQueueLimit("downloads", 5))
//	start, resume, err := fsm.Register[Req, Resp](m, "download-image").
//		Start("check-exists", checkExists).
//		To("download", download, fsm.WithTimeout(5*time.Minute), fsm.WithRetry(fsm.ExponentialJitter(5))).
//		End("complete").
//		Build(ctx)
//	err = m.Resume(ctx) // at start-up, after every Build
//	runID, err := start(ctx, imageID, &Req{...}, fsm.WithQueue("downloads"))
//	resp, err := fsm.Await[Resp](ctx, m, runID)
//
// What a transition returns decides what happens next: nil moves to the next
// transition (its response is checkpointed first); a plain error retries the
// same transition after its RetryPolicy's delay, up to MaxAttempts, then the
// run fails; Abort ends the run aborted, Unrecoverable ends it failed, and
// Handoff completes it at once with the given response. A per-transition
// timeout is the deadline of each attempt's context and counts as a plain
// error.
//
// Guarantees, given transitions that are idempotent:
//   - a transition whose completion was checkpointed never runs again for
//     that run; after a crash only the interrupted transition runs again,
//     from its start, with the response checkpointed before it; one that
//     ended the run does not run again once the OnFail cleanup has begun
//     (a crash then runs the cleanup again and the run ends failed with
//     the transition's reason);
//   - at most one pending or running run exists per (FSM, idempotency id):
//     concurrent starts with one id share one run;
//   - at most the queue's limit of runs of one queue execute at once; a run
//     waiting for a slot, or for its run-after predecessors, is pending;
//   - a run started WithRunAfter starts only after every predecessor
//     completed, and is aborted (reason naming the predecessor) if one was
//     aborted or failed; transitions read predecessors' responses with
//     PredecessorResponse;
//   - Close cancels in-flight attempts and leaves runs live for the next
//     Resume; an attempt cut by Close does not count against MaxAttempts,
//     one cut by a crash does (so a transition that crashes the process
//     every time ends failed instead of looping); a crash during the delay
//     between two attempts costs none, the next attempt runs after restart.
package fsm
