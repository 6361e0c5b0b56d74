package metadata

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/containerd/log"
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

// RetentionResult counts what one retention pass deleted.
type RetentionResult struct {
	Runs         int
	FailedImages int
}

// finishedRunFree is true for the finished run r that no live run still
// names as its parent or as a run it waits for.
const finishedRunFree = `r.state IN ('complete', 'aborted', 'failed') AND NOT EXISTS (
	SELECT 1 FROM fsm_runs l WHERE l.state IN ('pending', 'running')
	   AND (l.parent_id = r.run_id OR ' ' || l.run_after || ' ' LIKE '% ' || r.run_id || ' %'))`

// Retain deletes, as of now, the history records r says to forget, in
// transactions of at most pruneBatch rows (the write lock is held one batch
// at a time). A run a live run still refers to is kept, and so is an image
// a live run is pulling.
func (d *DB) Retain(ctx context.Context, r Retention, now time.Time) (RetentionResult, error) {
	return d.retain(ctx, r, now, pruneBatch)
}

func (d *DB) retain(ctx context.Context, r Retention, now time.Time, batch int) (RetentionResult, error) {
	r = r.withDefaults()
	var res RetentionResult
	var scratch PruneResult
	if r.RunsMaxAge > 0 {
		q := `DELETE FROM fsm_runs WHERE run_id IN (SELECT r.run_id FROM fsm_runs r
			WHERE ` + finishedRunFree + ` AND IFNULL(r.finished_at, r.updated_at) < ? LIMIT ?)`
		cutoff := now.Add(-r.RunsMaxAge).UnixNano()
		if err := d.pruneBatches(ctx, batch, &res.Runs, false, &scratch, func(tx *sql.Tx) (int, error) {
			return execCount(ctx, tx, q, cutoff, batch)
		}); err != nil {
			return res, fmt.Errorf("metadata: retention: finished runs older than %s: %w", r.RunsMaxAge, err)
		}
	}
	if r.RunsMaxCount > 0 {
		// The newest RunsMaxCount finished runs stay; a batch deletes the
		// oldest of the rest.
		q := `DELETE FROM fsm_runs WHERE run_id IN (SELECT r.run_id FROM fsm_runs r
			WHERE ` + finishedRunFree + ` AND r.run_id NOT IN (
				SELECT run_id FROM fsm_runs WHERE state IN ('complete', 'aborted', 'failed')
				 ORDER BY IFNULL(finished_at, updated_at) DESC, run_id DESC LIMIT ?)
			ORDER BY IFNULL(r.finished_at, r.updated_at), r.run_id LIMIT ?)`
		if err := d.pruneBatches(ctx, batch, &res.Runs, false, &scratch, func(tx *sql.Tx) (int, error) {
			return execCount(ctx, tx, q, r.RunsMaxCount, batch)
		}); err != nil {
			return res, fmt.Errorf("metadata: retention: finished runs beyond %d: %w", r.RunsMaxCount, err)
		}
	}
	if r.FailedImagesMaxAge > 0 {
		q := `DELETE FROM s3_images WHERE image_id IN (SELECT i.image_id FROM s3_images i
			WHERE i.failure_reason IS NOT NULL AND i.pulled_ns IS NULL
			  AND NOT EXISTS (SELECT 1 FROM image_layers il WHERE il.image_id = i.image_id)
			  AND NOT ` + fmt.Sprintf(liveRunOn, "i.image_id") + `
			  AND COALESCE(i.used_ns, i.created_ns) < ? LIMIT ?)`
		cutoff := now.Add(-r.FailedImagesMaxAge).UnixNano()
		if err := d.pruneBatches(ctx, batch, &res.FailedImages, false, &scratch, func(tx *sql.Tx) (int, error) {
			return execCount(ctx, tx, q, cutoff, batch)
		}); err != nil {
			return res, fmt.Errorf("metadata: retention: failed images older than %s: %w", r.FailedImagesMaxAge, err)
		}
	}
	return res, nil
}

// RetainEvery runs Retain every interval (DefaultRetentionInterval when
// not positive), and once at once, until ctx is done, logging what each
// pass deleted and any error (a failed pass is tried again at the next
// tick).
func (d *DB) RetainEvery(ctx context.Context, interval time.Duration, r Retention) {
	if interval <= 0 {
		interval = DefaultRetentionInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := d.Retain(ctx, r, time.Now())
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
