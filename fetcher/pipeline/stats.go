package pipeline

// The figures of the pipelines' records for the metrics endpoint.

import (
	"context"
	"fmt"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// RunCount is how many FSM runs of one machine are in one state.
type RunCount struct {
	FSM   string
	State string
	Runs  int
}

// Stats is what the S3 pipelines hold, for the metrics endpoint.
type Stats struct {
	Runs          []RunCount     // fsm_runs by machine and state
	Images        map[string]int // images by download_status (of the images view)
	Blobs         int            // layer files kept (table layers)
	BlobBytes     int64
	Unpacked      int // unpacked chains, each one device
	UnpackedBytes int64
	Activations   int // activations of images
}

// Stats reads Stats in one read transaction.
func (r Records) Stats(ctx context.Context) (Stats, error) {
	st := Stats{Images: map[string]int{}}
	err := r.db.ReadSnapshot(ctx, func(tx metadata.Querier) error { return stats(ctx, tx, &st) })
	return st, err
}

func stats(ctx context.Context, tx metadata.Querier, st *Stats) error {
	rows, err := tx.QueryContext(ctx, `SELECT fsm, state, COUNT(*) FROM fsm_runs GROUP BY fsm, state ORDER BY fsm, state`)
	if err != nil {
		return fmt.Errorf("pipeline: stats: runs: %w", err)
	}
	for rows.Next() {
		var c RunCount
		if err := rows.Scan(&c.FSM, &c.State, &c.Runs); err != nil {
			rows.Close()
			return fmt.Errorf("pipeline: stats: runs: %w", err)
		}
		st.Runs = append(st.Runs, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pipeline: stats: runs: %w", err)
	}
	rows, err = tx.QueryContext(ctx, `SELECT download_status, COUNT(*) FROM images GROUP BY download_status`)
	if err != nil {
		return fmt.Errorf("pipeline: stats: images: %w", err)
	}
	for rows.Next() {
		var status string
		var n int
		if err := rows.Scan(&status, &n); err != nil {
			rows.Close()
			return fmt.Errorf("pipeline: stats: images: %w", err)
		}
		st.Images[status] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pipeline: stats: images: %w", err)
	}
	for _, q := range []struct {
		sql   string
		count *int
		bytes *int64
	}{
		{`SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM layers`, &st.Blobs, &st.BlobBytes},
		{`SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM chains`, &st.Unpacked, &st.UnpackedBytes},
	} {
		if err := tx.QueryRowContext(ctx, q.sql).Scan(q.count, q.bytes); err != nil {
			return fmt.Errorf("pipeline: stats: %w", err)
		}
	}
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM snapshots WHERE active = 1`).Scan(&st.Activations); err != nil {
		return fmt.Errorf("pipeline: stats: activations: %w", err)
	}
	return nil
}
