package metadata

import (
	"context"
	"database/sql"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// TestViewsOfTheFirstSchema: the images, unpacked_images, snapshots and
// image_locks views, read with plain SQL as an operator would, show the
// records with the first schema's columns.
func TestViewsOfTheFirstSchema(t *testing.T) {
	ctx, db := context.Background(), openTestDB(t)
	w, _ := seed.Listed(t, db)
	rows := func(q string) []string {
		t.Helper()
		rs, err := db.db.QueryContext(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rs.Close()
		cols, _ := rs.Columns()
		var out []string
		for rs.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rs.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			var f []string
			for _, v := range vals {
				if v.Valid {
					f = append(f, v.String)
				} else {
					f = append(f, "NULL")
				}
			}
			out = append(out, strings.Join(f, "|"))
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(q string, want ...string) {
		t.Helper()
		if got := rows(q); !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got  %q\n want %q", q, got, want)
		}
	}
	check(`SELECT image_id, s3_key, download_status, activation_status, checksum, size_bytes, local_path, failure_reason,
		activated_at, downloaded_at IS NOT NULL FROM images ORDER BY id`,
		"s3-a|s3://bkt/a/|completed|active|sha256:c-a|3000|/blobs/d-a|NULL|1970-01-01 00:00:02|1",
		"s3-b|s3://bkt/b/|completed|inactive|sha256:c-b|3000|/blobs/d-b|NULL|NULL|1",
		`s3-c|s3://bkt/c.tar|failed|inactive|NULL|0||validate s3://bkt/c.tar: entry "../x" climbs above the root|NULL|0`)
	check(`SELECT image_id, device_id, device_name, device_path, size_bytes, file_count, layout_verified FROM unpacked_images ORDER BY id`,
		"s3-a|2|pool-snap-2|/dev/mapper/pool-snap-2|6000|6|1",
		"s3-b|4|pool-snap-4|/dev/mapper/pool-snap-4|6000|6|1")
	check(`SELECT image_id, snapshot_id, snapshot_name, device_path, origin_device_id, active, created_at, deactivated_at FROM snapshots`,
		"s3-a|2-snap-s3-a|snap-s3-a|/dev/mapper/pool-snap-3|2|1|1970-01-01 00:00:02|NULL")
	check(`SELECT image_id, locked_at, locked_by FROM image_locks`, "s3-a|1800000000|activate-image:r-a")

	// The views are derived: they cannot be written.
	for _, q := range []string{
		`INSERT INTO images (image_id, s3_key, local_path, size_bytes) VALUES ('x', 'x', '/x', 1)`,
		`DELETE FROM unpacked_images`,
		`UPDATE snapshots SET active = 0`,
		`DELETE FROM image_locks`,
	} {
		if _, err := db.db.ExecContext(ctx, q); err == nil || !strings.Contains(err.Error(), "view") {
			t.Errorf("%s: err = %v, want a refusal to modify a view", q, err)
		}
	}

	// The run finishing releases its lock.
	w.Must(seed.FinishRun(ctx, db, "r-a", "complete", time.Unix(1_800_000_100, 0)))
	check(`SELECT image_id FROM image_locks`)
}
