package metadata

import (
	"context"
	"database/sql"
	"fmt"
)

// PruneResult counts what PruneOrphans removed.
type PruneResult struct {
	Snapshots    int // seed snapshots rows whose snapshot is gone
	Chains       int // unpacked chains (unpacked_images and pipeline_chains) whose committed snapshot is gone
	PulledImages int // pipeline_images whose top chain is gone
	Images       int // images rows nothing refers to any more
	// BlobPaths are the files of the pipeline_blobs rows removed; the
	// caller deletes them once PruneOrphans has returned (the rows are
	// gone first, so a crash leaves a stray file, never a row without one).
	BlobPaths []string
	// Deferred is true when live runs kept the images and blobs part from
	// running (a pull under way may be about to use them).
	Deferred bool
}

// LayerURLs returns the s3:// URLs of the layers a pulled image record
// lists (its Layers JSON belongs to the pipeline package).
type LayerURLs func(PulledImage) ([]string, error)

// PruneOrphans forgets, in one transaction, the pipeline's records whose
// snapshots the snapshotter no longer has, the way containerd's garbage
// collector leaves them after it removed an image's snapshots through the
// proxy plugin:
//   - seed snapshots rows whose snapshot key is not in cd_snapshots;
//   - unpacked chains whose committed chain snapshot is gone (with their
//     unpacked_images rows);
//   - pulled images (pipeline_images) whose top chain is gone.
//
// Then, only when no FSM run is pending or running, images rows (other than
// failed ones, kept for the operator) that no unpacked record, snapshot,
// pulled image or layer of a pulled image refers to, and the blobs no
// remaining images row or chain refers to. layerURLs names a pulled
// image's layers.
func (d *DB) PruneOrphans(ctx context.Context, layerURLs LayerURLs) (PruneResult, error) {
	var res PruneResult
	err := d.WithTx(ctx, func(tx *sql.Tx) error {
		res = PruneResult{}
		n, err := execCount(ctx, tx, `DELETE FROM snapshots WHERE NOT EXISTS
			(SELECT 1 FROM cd_snapshots c WHERE c.key = snapshots.snapshot_name)`)
		if err != nil {
			return fmt.Errorf("metadata: prune snapshots: %w", err)
		}
		res.Snapshots = n
		// A chain row is written after its snapshot is committed (updateDB),
		// so a row without a committed snapshot was removed behind it.
		orphan := `SELECT image_id FROM pipeline_chains p WHERE NOT EXISTS
			(SELECT 1 FROM cd_snapshots c WHERE c.key = p.chain_id AND c.kind = 'committed')`
		if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE origin_device_id IN
			(SELECT device_id FROM unpacked_images WHERE image_id IN (`+orphan+`))`); err != nil {
			return fmt.Errorf("metadata: prune snapshots of removed chains: %w", err)
		}
		ids, err := queryStrings(ctx, tx, orphan)
		if err != nil {
			return fmt.Errorf("metadata: prune chains: %w", err)
		}
		for _, id := range ids {
			for _, q := range []string{
				`DELETE FROM pipeline_chains WHERE image_id = ?`,
				`DELETE FROM unpacked_images WHERE image_id = ?`,
			} {
				if _, err := tx.ExecContext(ctx, q, id); err != nil {
					return fmt.Errorf("metadata: prune chain of image %s: %w", id, err)
				}
			}
		}
		res.Chains = len(ids)
		if res.PulledImages, err = execCount(ctx, tx, `DELETE FROM pipeline_images WHERE NOT EXISTS
			(SELECT 1 FROM pipeline_chains c WHERE c.chain_id = pipeline_images.top_chain_id)`); err != nil {
			return fmt.Errorf("metadata: prune pulled images: %w", err)
		}

		var live int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM fsm_runs WHERE state IN ('pending', 'running')`).Scan(&live); err != nil {
			return fmt.Errorf("metadata: prune: live runs: %w", err)
		}
		if live > 0 {
			res.Deferred = true
			return nil
		}
		if res.Images, err = pruneImages(ctx, tx, layerURLs); err != nil {
			return err
		}
		res.BlobPaths, err = pruneBlobs(ctx, tx)
		return err
	})
	if err != nil {
		return PruneResult{}, err
	}
	return res, nil
}

// LiveRuns counts the FSM runs pending or running.
func (d *DB) LiveRuns(ctx context.Context) (int, error) {
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM fsm_runs WHERE state IN ('pending', 'running')`).Scan(&n); err != nil {
		return 0, fmt.Errorf("metadata: live runs: %w", err)
	}
	return n, nil
}

// pruneImages deletes the images rows nothing refers to.
func pruneImages(ctx context.Context, tx *sql.Tx, layerURLs LayerURLs) (int, error) {
	rows, err := tx.QueryContext(ctx, `SELECT `+pulledColumns+` FROM pipeline_images`)
	if err != nil {
		return 0, fmt.Errorf("metadata: prune images: %w", err)
	}
	var pulled []*PulledImage
	for rows.Next() {
		p, err := scanPulled(rows)
		if err != nil {
			rows.Close()
			return 0, fmt.Errorf("metadata: prune images: %w", err)
		}
		pulled = append(pulled, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("metadata: prune images: %w", err)
	}
	keep := map[string]bool{}
	for _, p := range pulled {
		urls, err := layerURLs(*p)
		if err != nil {
			return 0, fmt.Errorf("metadata: prune images: layers of %s: %w", p.Ref, err)
		}
		for _, u := range urls {
			keep[u] = true
		}
	}
	rows, err = tx.QueryContext(ctx, `SELECT image_id, s3_key FROM images WHERE download_status <> 'failed'
		AND image_id NOT IN (SELECT image_id FROM unpacked_images)
		AND image_id NOT IN (SELECT image_id FROM snapshots)
		AND image_id NOT IN (SELECT image_id FROM pipeline_images)`)
	if err != nil {
		return 0, fmt.Errorf("metadata: prune images: %w", err)
	}
	var drop []string
	for rows.Next() {
		var id, key string
		if err := rows.Scan(&id, &key); err != nil {
			rows.Close()
			return 0, fmt.Errorf("metadata: prune images: %w", err)
		}
		if !keep[key] {
			drop = append(drop, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("metadata: prune images: %w", err)
	}
	for _, id := range drop {
		if _, err := tx.ExecContext(ctx, `DELETE FROM images WHERE image_id = ?`, id); err != nil {
			return 0, fmt.Errorf("metadata: prune image %s: %w", id, err)
		}
	}
	return len(drop), nil
}

// pruneBlobs deletes the blob rows no images row or chain refers to and
// returns their paths.
func pruneBlobs(ctx context.Context, tx *sql.Tx) ([]string, error) {
	const unused = `FROM pipeline_blobs WHERE
		digest NOT IN (SELECT checksum FROM images WHERE checksum IS NOT NULL)
		AND digest NOT IN (SELECT diff_id FROM pipeline_chains)`
	paths, err := queryStrings(ctx, tx, `SELECT path `+unused)
	if err != nil {
		return nil, fmt.Errorf("metadata: prune blobs: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE `+unused); err != nil {
		return nil, fmt.Errorf("metadata: prune blobs: %w", err)
	}
	return paths, nil
}

func execCount(ctx context.Context, tx *sql.Tx, q string, args ...any) (int, error) {
	r, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	n, err := r.RowsAffected()
	return int(n), err
}

// queryStrings returns the one text column of every row of q.
func queryStrings(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
