package metadata

// Queries of image garbage collection: when each image was last used
// (s3_images.used_ns, migration 9) and what a removal needs to know.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// TouchImage records that image imageID was used now (a pull, also one
// answered from the records, or an activation). Absent is not an error.
func (d *DB) TouchImage(ctx context.Context, imageID string) error {
	if _, err := d.db.ExecContext(ctx, `UPDATE s3_images SET used_ns = ? WHERE image_id = ?`, time.Now().UnixNano(), imageID); err != nil {
		return fmt.Errorf("metadata: touch image %s: %w", imageID, err)
	}
	return nil
}

// GCImage is a pulled image as garbage collection sees it.
type GCImage struct {
	ImageID string
	Source  string
	// UsedAt is the last pull or activation.
	UsedAt time.Time
	// Names are the image's names, oldest first.
	Names []string
	// Chains are the chains of its layers, bottom first.
	Chains []string
	// SharedChains are those of Chains that another image's layers also
	// use: removing this image keeps them.
	SharedChains map[string]bool
	// Bytes is what extraction wrote into the chains only this image uses.
	Bytes int64
}

// GCImages lists every image pulled at least once, least recently used
// first (last pull or activation; the older image first on a tie).
func (d *DB) GCImages(ctx context.Context) ([]*GCImage, error) {
	type row struct {
		id, source string
		used       int64
	}
	rows, err := queryAll(ctx, d.db, "images by last use", func(s rowScanner) (row, error) {
		var r row
		return r, s.Scan(&r.id, &r.source, &r.used)
	}, `SELECT image_id, source, COALESCE(used_ns, pulled_ns) FROM s3_images
		WHERE pulled_ns IS NOT NULL ORDER BY COALESCE(used_ns, pulled_ns), id`)
	if err != nil {
		return nil, err
	}
	out := make([]*GCImage, 0, len(rows))
	for _, r := range rows {
		im, err := d.GCImage(ctx, r.id)
		if err != nil {
			return nil, err
		}
		if im != nil {
			out = append(out, im)
		}
	}
	return out, nil
}

// GCImage returns image imageID as garbage collection sees it, or nil (and
// no error) when it is not recorded.
func (d *DB) GCImage(ctx context.Context, imageID string) (*GCImage, error) {
	var (
		im     *GCImage
		usedNs int64
	)
	err := d.readSnapshot(ctx, func(tx queryer) error {
		g := GCImage{ImageID: imageID, SharedChains: map[string]bool{}}
		err := tx.QueryRowContext(ctx, `SELECT source, COALESCE(used_ns, pulled_ns, created_ns) FROM s3_images WHERE image_id = ?`, imageID).
			Scan(&g.Source, &usedNs)
		if err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return nil
			}
			return err
		}
		g.UsedAt = time.Unix(0, usedNs).UTC()
		type chainRow struct {
			id     string
			shared bool
			bytes  int64
		}
		chains, err := queryAll(ctx, tx, "chains of image "+imageID, func(s rowScanner) (chainRow, error) {
			var c chainRow
			return c, s.Scan(&c.id, &c.shared, &c.bytes)
		}, `SELECT il.chain_id,
				EXISTS (SELECT 1 FROM image_layers o WHERE o.chain_id = il.chain_id AND o.image_id <> il.image_id),
				COALESCE((SELECT c.size_bytes FROM chains c WHERE c.chain_id = il.chain_id), 0)
			FROM image_layers il WHERE il.image_id = ? ORDER BY il.position`, imageID)
		if err != nil {
			return err
		}
		for _, c := range chains {
			g.Chains = append(g.Chains, c.id)
			if c.shared {
				g.SharedChains[c.id] = true
			} else {
				g.Bytes += c.bytes
			}
		}
		if g.Names, err = queryAll(ctx, tx, "names of image "+imageID, func(s rowScanner) (string, error) {
			var n string
			return n, s.Scan(&n)
		}, `SELECT name FROM image_names WHERE image_id = ? ORDER BY registered_ns, name`, imageID); err != nil {
			return err
		}
		im = &g
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("metadata: image %s for garbage collection: %w", imageID, err)
	}
	return im, nil
}
