package pipeline

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// Defaults of Retention.
const (
	// DefaultRunsMaxAge is how long a finished state-machine run is kept.
	DefaultRunsMaxAge = 7 * 24 * time.Hour
	// DefaultRunsMaxCount is how many finished runs are kept at most, the
	// most recently finished.
	DefaultRunsMaxCount = 10000
	// DefaultFailedImagesMaxAge is how long an image whose only pulls
	// failed is kept (with its failure, which `ls images` shows).
	DefaultFailedImagesMaxAge = 7 * 24 * time.Hour
	// DefaultRetentionInterval spaces the retention passes.
	DefaultRetentionInterval = time.Hour
)

// Retention says which history records are forgotten. A zero field takes
// its default; a negative age or count keeps those records forever.
type Retention struct {
	// RunsMaxAge: finished runs (complete, aborted, failed) that finished
	// longer ago are deleted.
	RunsMaxAge time.Duration
	// RunsMaxCount: finished runs beyond this many, oldest first, are
	// deleted.
	RunsMaxCount int
	// FailedImagesMaxAge: images never pulled successfully (a failure
	// recorded, no layers) last tried longer ago are deleted, with their
	// names.
	FailedImagesMaxAge time.Duration
}

func (r Retention) withDefaults() Retention {
	if r.RunsMaxAge == 0 {
		r.RunsMaxAge = DefaultRunsMaxAge
	}
	if r.RunsMaxCount == 0 {
		r.RunsMaxCount = DefaultRunsMaxCount
	}
	if r.FailedImagesMaxAge == 0 {
		r.FailedImagesMaxAge = DefaultFailedImagesMaxAge
	}
	return r
}

// RetentionConfig is the daemon's [retention] section (the toml tags are
// its keys): the Retention policy and how often it runs.
type RetentionConfig struct {
	// Interval spaces the retention passes (Pipelines.RetainEvery).
	Interval conf.Duration `toml:"interval"`
	// RunsMaxAge and RunsMaxCount bound the finished state-machine runs
	// kept (Retention.RunsMaxAge, Retention.RunsMaxCount).
	RunsMaxAge   conf.Duration `toml:"runs_max_age"`
	RunsMaxCount int           `toml:"runs_max_count"`
	// FailedImagesMaxAge is how long an image never pulled successfully is
	// kept with its failure (Retention.FailedImagesMaxAge).
	FailedImagesMaxAge conf.Duration `toml:"failed_images_max_age"`
}

// DefaultRetentionConfig returns the [retention] defaults.
func DefaultRetentionConfig() RetentionConfig {
	return RetentionConfig{
		Interval:           conf.D(DefaultRetentionInterval),
		RunsMaxAge:         conf.D(DefaultRunsMaxAge),
		RunsMaxCount:       DefaultRunsMaxCount,
		FailedImagesMaxAge: conf.D(DefaultFailedImagesMaxAge),
	}
}

// Validate checks the [retention] keys and returns one error per bad
// value, joined, each naming the key. The daemon keeps no record forever:
// every bound must be positive.
func (c RetentionConfig) Validate() error {
	var p conf.Problems
	p.PositiveDuration("retention.interval", c.Interval)
	p.PositiveDuration("retention.runs_max_age", c.RunsMaxAge)
	p.PositiveDuration("retention.failed_images_max_age", c.FailedImagesMaxAge)
	if c.RunsMaxCount <= 0 {
		p.Add("retention.runs_max_count", "must be positive, got %d", c.RunsMaxCount)
	}
	return p.Err()
}

// Policy returns the Retention that c describes.
func (c RetentionConfig) Policy() Retention {
	return Retention{RunsMaxAge: c.RunsMaxAge.Duration, RunsMaxCount: c.RunsMaxCount, FailedImagesMaxAge: c.FailedImagesMaxAge.Duration}
}

// RetentionResult counts what one retention pass deleted.
type RetentionResult struct {
	Runs         int
	FailedImages int
}

// finishedRunFree is true for the finished run r that no live run still
// names as its parent or as a run it waits for, and whose idempotency id
// is not among the JSON array held (the runs a pull or an activate under
// way may still read).
const finishedRunFree = `r.state IN ('complete', 'aborted', 'failed') AND NOT EXISTS (
	SELECT 1 FROM fsm_runs l WHERE l.state IN ('pending', 'running')
	   AND (l.parent_id = r.run_id OR ' ' || l.run_after || ' ' LIKE '% ' || r.run_id || ' %'))
	AND r.idempotency_id NOT IN (SELECT value FROM json_each(?))`

// Retain deletes, as of now, the history records pol says to forget, in
// transactions of at most pruneBatch rows (the write lock is held one batch
// at a time). A run a live run still refers to is kept, and so is an image
// a live run is pulling. It knows of no pull under way: a process that
// pulls retains through Pipelines.Retain, which keeps its pulls' runs too.
func (r Records) Retain(ctx context.Context, pol Retention, now time.Time) (RetentionResult, error) {
	return r.retain(ctx, pol, now, pruneBatch, nil)
}

// Retain is Records.Retain keeping, besides, every finished run a pull or
// an activate under way in this process may still read: the runs it names
// as the run-after predecessors of the runs it starts (the download runs
// of its layers, the unpack runs of its chains), which it names only once
// they have ended, when no live run refers to them yet, and the activate
// run of its image, whose response it reads once the run has ended.
func (p *Pipelines) Retain(ctx context.Context, pol Retention, now time.Time) (RetentionResult, error) {
	return RecordsOf(p.db).retain(ctx, pol, now, pruneBatch, p.heldRunIDs)
}

// heldRunIDs lists the idempotency ids of the runs the pulls and
// activates under way may still read: the chains they build on (their
// unpack runs' ids), the downloads of their layers and their images (the
// activate runs' ids).
func (p *Pipelines) heldRunIDs() []string {
	return append(p.building.ids(), p.runHolds.ids()...)
}

// retain is Retain in transactions of at most batch rows; held, when set,
// is read in each transaction (under its write lock, so a pull's hold
// taken before it starts or joins a run is seen by every later batch).
func (r Records) retain(ctx context.Context, pol Retention, now time.Time, batch int, held func() []string) (RetentionResult, error) {
	// freeRuns is a batch of q, a DELETE of finished runs over
	// finishedRunFree, whose first argument is the JSON array of the runs
	// held, read in the batch's transaction; args follow it.
	freeRuns := func(q string, args ...any) func(*sql.Tx) (int, error) {
		return func(tx *sql.Tx) (int, error) {
			ids := []string{}
			if held != nil {
				ids = append(ids, held()...)
			}
			h, err := json.Marshal(ids)
			if err != nil {
				return 0, fmt.Errorf("runs held by pulls: %w", err)
			}
			return execCount(ctx, tx, q, append([]any{string(h)}, args...)...)
		}
	}
	pol = pol.withDefaults()
	var res RetentionResult
	var scratch PruneResult
	if pol.RunsMaxAge > 0 {
		q := `DELETE FROM fsm_runs WHERE run_id IN (SELECT r.run_id FROM fsm_runs r
			WHERE ` + finishedRunFree + ` AND IFNULL(r.finished_at, r.updated_at) < ? LIMIT ?)`
		cutoff := now.Add(-pol.RunsMaxAge).UnixNano()
		if err := r.pruneBatches(ctx, batch, &res.Runs, &scratch, freeRuns(q, cutoff, batch)); err != nil {
			return res, fmt.Errorf("pipeline: retention: finished runs older than %s: %w", pol.RunsMaxAge, err)
		}
	}
	if pol.RunsMaxCount > 0 {
		// The newest RunsMaxCount finished runs stay; a batch deletes the
		// oldest of the rest.
		q := `DELETE FROM fsm_runs WHERE run_id IN (SELECT r.run_id FROM fsm_runs r
			WHERE ` + finishedRunFree + ` AND r.run_id NOT IN (
				SELECT run_id FROM fsm_runs WHERE state IN ('complete', 'aborted', 'failed')
				 ORDER BY IFNULL(finished_at, updated_at) DESC, run_id DESC LIMIT ?)
			ORDER BY IFNULL(r.finished_at, r.updated_at), r.run_id LIMIT ?)`
		if err := r.pruneBatches(ctx, batch, &res.Runs, &scratch, freeRuns(q, pol.RunsMaxCount, batch)); err != nil {
			return res, fmt.Errorf("pipeline: retention: finished runs beyond %d: %w", pol.RunsMaxCount, err)
		}
	}
	if pol.FailedImagesMaxAge > 0 {
		q := `DELETE FROM s3_images WHERE image_id IN (SELECT i.image_id FROM s3_images i
			WHERE i.failure_reason IS NOT NULL AND i.pulled_ns IS NULL
			  AND NOT EXISTS (SELECT 1 FROM image_layers il WHERE il.image_id = i.image_id)
			  AND NOT ` + fmt.Sprintf(liveRunOn, "i.image_id") + `
			  AND COALESCE(i.used_ns, i.created_ns) < ? LIMIT ?)`
		cutoff := now.Add(-pol.FailedImagesMaxAge).UnixNano()
		if err := r.pruneBatches(ctx, batch, &res.FailedImages, &scratch, func(tx *sql.Tx) (int, error) {
			return execCount(ctx, tx, q, cutoff, batch)
		}); err != nil {
			return res, fmt.Errorf("pipeline: retention: failed images older than %s: %w", pol.FailedImagesMaxAge, err)
		}
	}
	return res, nil
}

// RetainEvery runs Retain with pol every interval (DefaultRetentionInterval
// when not positive), and once at once, until ctx is done, logging what
// each pass deleted and any error (a failed pass is tried again at the
// next tick).
func (p *Pipelines) RetainEvery(ctx context.Context, interval time.Duration, pol Retention) {
	if interval <= 0 {
		interval = DefaultRetentionInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := p.Retain(ctx, pol, time.Now())
		l := log.G(ctx).WithFields(log.Fields{"runs": res.Runs, "failed_images": res.FailedImages})
		switch {
		case err != nil && ctx.Err() == nil:
			l.WithError(err).Warn("retention pass failed; retrying at the next interval")
		case res.Runs+res.FailedImages > 0:
			l.Info("retention: forgot old history records")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
