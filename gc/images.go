package gc

// Queries of image garbage collection on the S3 pipelines' records: when
// each image was last used (s3_images.used_ns, which the pipeline writes)
// and what a removal needs to know.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// Image is a pulled image as garbage collection sees it.
type Image struct {
	ImageID string
	Source  string
	// UsedAt is the last pull or activation.
	UsedAt time.Time
	// Names are the image's names, oldest first.
	Names []string
	// Pending are those of Names whose registration in containerd waits
	// for its socket (absent when the image was pulled): containerd has
	// no record of them yet, so no container or pin of its uses them.
	Pending map[string]bool
	// Chains are the chains of its layers, bottom first.
	Chains []string
	// SharedChains are those of Chains that another image's layers also
	// use: removing this image keeps them.
	SharedChains map[string]bool
	// Bytes is what extraction wrote into the chains only this image uses.
	Bytes int64
}

// lastUseSQL is an image's last use: the later of its last pull (pulled_ns,
// which the activate run records, also when the pull's client went away
// and nothing touched used_ns after) and its last touch (used_ns).
const lastUseSQL = `MAX(COALESCE(used_ns, 0), COALESCE(pulled_ns, created_ns))`

// Images lists every image of db pulled at least once, least recently used
// first (last pull or activation; the older image first on a tie).
func Images(ctx context.Context, db *metadata.DB) ([]*Image, error) {
	type row struct {
		id, source string
		used       int64
	}
	rows, err := metadata.QueryAll(ctx, db.Statements(), func(s *sql.Rows) (row, error) {
		var r row
		return r, s.Scan(&r.id, &r.source, &r.used)
	}, `SELECT image_id, source, `+lastUseSQL+` FROM s3_images
		WHERE pulled_ns IS NOT NULL ORDER BY `+lastUseSQL+`, id`)
	if err != nil {
		return nil, fmt.Errorf("gc: images by last use: %w", err)
	}
	out := make([]*Image, 0, len(rows))
	for _, r := range rows {
		im, err := ImageByID(ctx, db, r.id)
		if err != nil {
			return nil, err
		}
		if im != nil {
			out = append(out, im)
		}
	}
	return out, nil
}

// ImageByID returns image imageID of db as garbage collection sees it, read
// in one read transaction, or nil (and no error) when it is not recorded.
func ImageByID(ctx context.Context, db *metadata.DB, imageID string) (*Image, error) {
	var (
		im     *Image
		usedNs int64
	)
	err := db.ReadSnapshot(ctx, func(tx metadata.Querier) error {
		g := Image{ImageID: imageID, SharedChains: map[string]bool{}}
		err := tx.QueryRowContext(ctx, `SELECT source, `+lastUseSQL+` FROM s3_images WHERE image_id = ?`, imageID).
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
		chains, err := metadata.QueryAll(ctx, tx, func(s *sql.Rows) (chainRow, error) {
			var c chainRow
			return c, s.Scan(&c.id, &c.shared, &c.bytes)
		}, `SELECT il.chain_id,
				EXISTS (SELECT 1 FROM image_layers o WHERE o.chain_id = il.chain_id AND o.image_id <> il.image_id),
				COALESCE((SELECT c.size_bytes FROM chains c WHERE c.chain_id = il.chain_id), 0)
			FROM image_layers il WHERE il.image_id = ? ORDER BY il.position`, imageID)
		if err != nil {
			return fmt.Errorf("chains: %w", err)
		}
		for _, c := range chains {
			g.Chains = append(g.Chains, c.id)
			if c.shared {
				g.SharedChains[c.id] = true
			} else {
				g.Bytes += c.bytes
			}
		}
		type nameRow struct {
			name    string
			pending bool
		}
		names, err := metadata.QueryAll(ctx, tx, func(s *sql.Rows) (nameRow, error) {
			var n nameRow
			return n, s.Scan(&n.name, &n.pending)
		}, `SELECT n.name, EXISTS (SELECT 1 FROM containerd_pending p WHERE p.name = n.name)
			FROM image_names n WHERE n.image_id = ? ORDER BY n.registered_ns, n.name`, imageID)
		if err != nil {
			return fmt.Errorf("names: %w", err)
		}
		g.Pending = map[string]bool{}
		for _, n := range names {
			g.Names = append(g.Names, n.name)
			if n.pending {
				g.Pending[n.name] = true
			}
		}
		im = &g
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gc: image %s: %w", imageID, err)
	}
	return im, nil
}

// layerRow is one image_layers row as dropLayer read it.
type layerRow struct {
	position           int
	key, etag, version string
	size               int64
	chain              string
}

// dropLayer forgets that image imageID has chain among its layers, before
// the chain's snapshot is removed. A removal killed after that snapshot is
// gone then leaves an image whose recorded layers all still stand, which
// the next start's prune keeps, named as before, so the same rm finishes
// it; had the row stayed, the prune would forget the image and the chains
// below would belong to no image, out of any rm's reach. The restore it
// returns records the layer again, for a removal of the chain refused.
func dropLayer(ctx context.Context, db *metadata.DB, imageID, chain string) (restore func(context.Context) error, err error) {
	var rows []layerRow
	err = db.WithTx(ctx, func(tx *sql.Tx) error {
		rs, err := metadata.QueryAll(ctx, tx, func(s *sql.Rows) (layerRow, error) {
			var r layerRow
			return r, s.Scan(&r.position, &r.key, &r.etag, &r.version, &r.size, &r.chain)
		}, `SELECT position, key, etag, version_id, size_bytes, chain_id FROM image_layers WHERE image_id = ? AND chain_id = ?`, imageID, chain)
		if err != nil {
			return err
		}
		rows = rs
		_, err = tx.ExecContext(ctx, `DELETE FROM image_layers WHERE image_id = ? AND chain_id = ?`, imageID, chain)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("gc: forget layer %s of image %s: %w", chain, imageID, err)
	}
	return func(ctx context.Context) error {
		err := db.WithTx(ctx, func(tx *sql.Tx) error {
			for _, r := range rows {
				if _, err := tx.ExecContext(ctx, `INSERT INTO image_layers (image_id, position, key, etag, version_id, size_bytes, chain_id)
					VALUES (?, ?, ?, ?, ?, ?, ?)`, imageID, r.position, r.key, r.etag, r.version, r.size, r.chain); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("gc: record layer %s of image %s again: %w", chain, imageID, err)
		}
		return nil
	}, nil
}
