-- 0005: runs of the durable state machines (fetcher/fsm).
--
-- One row per run. The row is the run's whole durable state: the runner
-- resumes a run from it alone. It is written in one transaction when the run
-- is created, when it starts, after each transition (checkpoint: next
-- transition, response), after each failed attempt (attempts, last_error)
-- and when it ends.
--
-- Times are INTEGER unix nanoseconds (UTC); started_at and finished_at are
-- NULL until the run first runs / ends.
-- state: pending (waiting for run-after predecessors or a queue slot),
-- running (executing, or interrupted while executing, `transition`),
-- complete, aborted, failed (terminal: never change again).
-- attempts: attempts of `transition` started so far (an attempt interrupted
-- by a crash counts; one cut short by a clean shutdown does not).
-- run_after: the run ids this run waits for, separated by single spaces.
-- request, response: JSON; response is 'null' until the first checkpoint.
CREATE TABLE fsm_runs (
    run_id         TEXT    PRIMARY KEY NOT NULL,
    fsm            TEXT    NOT NULL,
    idempotency_id TEXT    NOT NULL,
    parent_id      TEXT    NOT NULL DEFAULT '',
    run_after      TEXT    NOT NULL DEFAULT '',
    queue          TEXT    NOT NULL DEFAULT '',
    request        TEXT    NOT NULL,
    response       TEXT    NOT NULL DEFAULT 'null',
    transition     TEXT    NOT NULL,
    state          TEXT    NOT NULL
        CHECK (state IN ('pending', 'running', 'complete', 'aborted', 'failed')),
    attempts       INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error     TEXT    NOT NULL DEFAULT '',
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    started_at     INTEGER,
    finished_at    INTEGER
);

-- At most one live run per (fsm, idempotency id): ten concurrent pulls of
-- one image share one download run.
CREATE UNIQUE INDEX fsm_runs_live_idempotency
    ON fsm_runs (fsm, idempotency_id)
    WHERE state IN ('pending', 'running');

-- Resume and listings by state, oldest first.
CREATE INDEX fsm_runs_state_created ON fsm_runs (state, created_at);

CREATE INDEX fsm_runs_parent ON fsm_runs (parent_id) WHERE parent_id <> '';
