package metadata

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// PulledLayerState is what the database says of one layer of a pulled
// image.
type PulledLayerState struct {
	ChainID  string
	DeviceID uint32 // thin id of the committed chain snapshot
	Blob     *Blob  // the downloaded tarball; nil when it has no blob row
}

// PulledState is what an idempotent re-pull needs to know of a pulled
// image, read in one transaction by PulledState.
type PulledState struct {
	Layers []PulledLayerState
	// Activation is the image's active snapshot row (seed 001's snapshots
	// table) and ActivationDeviceID its device's thin id.
	Activation         *Snapshot
	ActivationDeviceID uint32
}

// PulledState reads, in one read transaction, whether every layer of a
// pulled image is unpacked (chain row, unpacked row with its layout
// verified, committed chain snapshot) and downloaded (blob row), and whether
// its activation is recorded active on a live active snapshot whose parent
// is the top chain. It returns (nil, nil) when anything is missing or does
// not agree: the caller then runs the pipelines, which heal what is wrong.
// chains and diffIDs are the layers' chain and diff IDs, bottom first.
func (d *DB) PulledState(ctx context.Context, imageID, activationKey string, chains, diffIDs []string) (*PulledState, error) {
	if len(chains) == 0 || len(chains) != len(diffIDs) {
		return nil, fmt.Errorf("metadata: pulled state of %s: %d chains, %d diff ids: %w", imageID, len(chains), len(diffIDs), ErrInvalidArgument)
	}
	var st *PulledState
	err := d.readSnapshot(ctx, func(tx queryer) (err error) {
		st, err = pulledState(ctx, tx, imageID, activationKey, chains, diffIDs)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("metadata: pulled state of %s: %w", imageID, err)
	}
	return st, nil
}

// PulledImageState reads, in one read transaction, the pulled-image record
// ref and what PulledState reads of it: chainsOf turns the record's layers
// (JSON owned by the pipeline package) into their chain and diff IDs,
// bottom first. It returns (nil, nil, nil) when there is no such record,
// and (rec, nil, nil) when the record's chains, blobs or activation are
// missing or disagree; chainsOf's error is returned wrapped.
func (d *DB) PulledImageState(ctx context.Context, ref string, chainsOf func(*PulledImage) (chains, diffIDs []string, err error)) (*PulledImage, *PulledState, error) {
	var (
		rec *PulledImage
		st  *PulledState
	)
	err := d.readSnapshot(ctx, func(tx queryer) error {
		var err error
		rec, err = scanPulled(tx.QueryRowContext(ctx, `SELECT `+pulledColumns+` FROM pipeline_images WHERE ref = ?`, ref))
		if errors.Is(err, sql.ErrNoRows) {
			rec = nil
			return nil
		}
		if err != nil {
			return fmt.Errorf("pulled image: %w", err)
		}
		chains, diffIDs, err := chainsOf(rec)
		if err != nil {
			return fmt.Errorf("layers of the record: %w", err)
		}
		if len(chains) == 0 || len(chains) != len(diffIDs) || chains[len(chains)-1] != rec.TopChainID {
			return nil // the record disagrees with itself: nothing to report
		}
		st, err = pulledState(ctx, tx, rec.ImageID, rec.SnapshotKey, chains, diffIDs)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("metadata: pulled state of %q: %w", ref, err)
	}
	return rec, st, nil
}

func pulledState(ctx context.Context, tx queryer, imageID, activationKey string, chains, diffIDs []string) (*PulledState, error) {
	st := &PulledState{}
	for i, chain := range chains {
		l := PulledLayerState{ChainID: chain}
		var verified bool
		err := tx.QueryRowContext(ctx, `SELECT u.layout_verified, s.device_id FROM pipeline_chains c
			JOIN unpacked_images u ON u.image_id = c.image_id
			JOIN cd_snapshots s ON s.key = c.chain_id AND s.kind = 'committed'
			WHERE c.chain_id = ? AND c.diff_id = ?`, chain, diffIDs[i]).Scan(&verified, &l.DeviceID)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("chain %s: %w", chain, err)
		}
		if !verified {
			return nil, nil
		}
		b, err := scanBlob(tx.QueryRowContext(ctx, `SELECT `+blobColumns+` FROM pipeline_blobs WHERE digest = ?`, diffIDs[i]))
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, fmt.Errorf("blob %s: %w", diffIDs[i], err)
		default:
			l.Blob = b
		}
		st.Layers = append(st.Layers, l)
	}
	var parent, kind string
	err := tx.QueryRowContext(ctx, `SELECT s.device_id, s.kind, IFNULL(p.key, '') FROM cd_snapshots s
		LEFT JOIN cd_snapshots p ON p.id = s.parent_id WHERE s.key = ?`, activationKey).Scan(&st.ActivationDeviceID, &kind, &parent)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("activation %s: %w", activationKey, err)
	}
	if kind != SnapKindActive || parent != chains[len(chains)-1] {
		return nil, nil
	}
	sn, err := scanSnapshot(tx.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots
		WHERE snapshot_name = ? AND image_id = ?`, activationKey, imageID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot row %s: %w", activationKey, err)
	}
	if !sn.Active {
		return nil, nil
	}
	st.Activation = sn
	return st, nil
}
