package pipeline

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// PruneResult counts what Records.PruneOrphans removed.
type PruneResult struct {
	Chains  int // chains whose committed snapshot is gone
	Images  int // images one of whose chains is gone (with their layers and names)
	Objects int // object records no image layer names any more
	// LayerPaths are the files of the layer rows removed; the caller
	// deletes them once PruneOrphans has returned (the rows go first, so a
	// crash leaves a stray file, never a row without its file).
	LayerPaths []string
	// Deferred is true when the objects and layers part did not run (files
	// false), or, from Pipelines.Prune, when a pull under way or a live run
	// kept it from looking for layer files no layer row names.
	Deferred bool
	// StrayFiles counts the files of the download directory's blobs that
	// no layer row named, removed by Pipelines.Prune (PruneOrphans leaves
	// it zero).
	StrayFiles int
}

// liveRunOn is true when a pending or running run has idempotency id ?.
const liveRunOn = `EXISTS (SELECT 1 FROM fsm_runs r WHERE r.idempotency_id = %s AND r.state IN ('pending', 'running'))`

// pruneBatch is the most rows one of PruneOrphans' transactions deletes:
// each holds the write lock only that long, so the snapshotter's calls
// queue behind a batch, never behind a whole pruning.
const pruneBatch = 500

// PruneOrphans forgets the records whose snapshots the snapshotter no
// longer has, the way containerd's garbage collector leaves them after it
// removed an image's snapshots through the proxy plugin:
//   - chains whose committed snapshot is gone, unless a live run is making
//     them again;
//   - images one of whose layers' chains is gone (their layers and names
//     with them): the image cannot be activated again without a pull;
//
// then, only when files is true (otherwise the result is Deferred), the
// object records that no image's layer names and nothing under way may
// still read (objectInUse), and the layer files no object record names.
// Some run is live at almost any time on a busy host, so a live run keeps
// only what it names, not everything.
//
// It works in transactions of at most pruneBatch rows, each step after the
// one before it is done; an error or a crash half-way leaves records the
// next call prunes (every step's rule reads the state, not a list made
// earlier). The result counts what the committed batches removed.
func (r Records) PruneOrphans(ctx context.Context, files bool) (PruneResult, error) {
	res, _, err := r.pruneOrphans(ctx, pruneBatch, files, nil, nil)
	return res, err
}

// objectInUse is true for the object record o that a live run names, or
// whose s3:// URL is among the JSON array ?1 (the objects the pulls under
// way in this process will read, Pipelines.objectHolds): a download of it
// (which records it, or hands its recorded file on), an unpack of the layer
// downloaded from it (which reads that file), an activate of an image
// listing it (which records the image's layers). ?2, ?3 and ?4 are the
// download, unpack and activate machines' names.
const objectInUse = `('s3://' || o.bucket || '/' || o.key IN (SELECT value FROM json_each(?1))
	OR EXISTS (SELECT 1 FROM fsm_runs r WHERE r.state IN ('pending', 'running') AND (
		(r.fsm = ?2 AND json_extract(r.request, '$.Bucket') = o.bucket AND json_extract(r.request, '$.S3Key') = o.key)
		OR (r.fsm = ?3 AND json_extract(r.request, '$.s3_url') = 's3://' || o.bucket || '/' || o.key)
		OR (r.fsm = ?4 AND substr(json_extract(r.request, '$.source'), 1, length(o.bucket) + 6) = 's3://' || o.bucket || '/'
			AND EXISTS (SELECT 1 FROM json_each(r.request, '$.layers') j WHERE json_extract(j.value, '$.key') = o.key)))))`

// objectsInUse is a WITH clause naming in_use(bucket, key) the objects
// objectInUse is true for, with the same arguments, found from the live
// runs and the URLs held rather than by reading every object: an
// s3://bucket/key URL's bucket is its first path segment, as is an
// image source's.
const objectsInUse = `WITH urls(rest) AS (
		SELECT substr(value, 6) FROM json_each(?1) WHERE value LIKE 's3://%/%'
		UNION ALL SELECT substr(json_extract(r.request, '$.s3_url'), 6) FROM fsm_runs r
		 WHERE r.fsm = ?3 AND r.state IN ('pending', 'running') AND json_extract(r.request, '$.s3_url') LIKE 's3://%/%'),
	sources(request, rest) AS (
		SELECT r.request, substr(json_extract(r.request, '$.source'), 6) FROM fsm_runs r
		 WHERE r.fsm = ?4 AND r.state IN ('pending', 'running') AND json_extract(r.request, '$.source') LIKE 's3://%/%'),
	in_use(bucket, key) AS MATERIALIZED (
		SELECT substr(rest, 1, instr(rest, '/') - 1), substr(rest, instr(rest, '/') + 1) FROM urls
		UNION ALL SELECT json_extract(r.request, '$.Bucket'), json_extract(r.request, '$.S3Key') FROM fsm_runs r
		 WHERE r.fsm = ?2 AND r.state IN ('pending', 'running')
		UNION ALL SELECT substr(s.rest, 1, instr(s.rest, '/') - 1), json_extract(j.value, '$.key') FROM sources s CROSS JOIN json_each(s.request, '$.layers') j)`

// handedOnFiles selects the digests of the layer files download runs
// handed on that something may still read by name from their responses:
// the run's own, while live; the unpack run that waits for it; the pull
// that holds it (its idempotency id among the JSON array %s). Such a file
// is kept even once its object was recorded with other content (the
// object was overwritten, and pulled again). ?2 is the download machine's
// name. Each part is looked up from the few live runs or ids held (run
// ids are hex, so a run_after list is a JSON array once quoted).
const handedOnFiles = `SELECT checksum FROM (
	SELECT json_extract(d.response, '$.checksum') AS checksum FROM fsm_runs d
	 WHERE d.fsm = ?2 AND d.state IN ('pending', 'running')
	UNION ALL SELECT json_extract(d.response, '$.checksum') FROM fsm_runs d
	 WHERE d.idempotency_id IN (SELECT value FROM json_each(%s)) AND d.fsm = ?2
	UNION ALL SELECT json_extract(d.response, '$.checksum') FROM fsm_runs l
	 CROSS JOIN json_each('["' || replace(l.run_after, ' ', '","') || '"]') a CROSS JOIN fsm_runs d
	 WHERE l.state IN ('pending', 'running') AND l.run_after != '' AND d.run_id = a.value AND d.fsm = ?2)
	WHERE checksum IS NOT NULL`

// pruneOrphans is PruneOrphans in transactions of at most batch rows,
// returning besides the stat stamps the rows of res.LayerPaths recorded,
// in the same order: a file found with another stamp was put there since
// (a download of the same content) and is not the caller's to delete.
// held, when set, lists the s3:// URLs of the objects the pulls under way
// will read, and heldRuns the idempotency ids of the runs they will read
// (Pipelines.heldRunIDs), read in each transaction (under its write lock,
// so that a pull's hold taken before it starts or joins a download is seen
// by every later batch).
func (r Records) pruneOrphans(ctx context.Context, batch int, files bool, held, heldRuns func() []string) (PruneResult, []fileID, error) {
	var (
		res    PruneResult
		stamps []fileID
	)
	// A chain row is written after its snapshot is committed, so a row
	// without a committed snapshot was removed behind it. That snapshot is
	// keyed by the chain ID, or is one containerd's unpacker committed
	// ("<namespace>/<n>/<chain ID>", labelled containerd.io/snapshot.ref =
	// the chain ID), which the pipelines use as they found it.
	chains := `DELETE FROM chains WHERE chain_id IN (SELECT chain_id FROM chains WHERE NOT EXISTS
		(SELECT 1 FROM cd_snapshots c WHERE c.key = chains.chain_id AND c.kind = 'committed')
		AND NOT EXISTS (SELECT 1 FROM cd_snapshots c WHERE json_extract(c.labels, '$."containerd.io/snapshot.ref"') = chains.chain_id
			AND c.kind = 'committed' AND substr(c.key, -length(chains.chain_id) - 1) = '/' || chains.chain_id)
		AND NOT ` + fmt.Sprintf(liveRunOn, "chains.chain_id") + ` LIMIT ?)`
	if err := r.pruneBatches(ctx, batch, &res.Chains, &res, func(tx *sql.Tx) (int, error) {
		return execCount(ctx, tx, chains, batch)
	}); err != nil {
		return res, nil, fmt.Errorf("pipeline: prune chains: %w", err)
	}
	images := `DELETE FROM s3_images WHERE image_id IN (SELECT DISTINCT il.image_id FROM image_layers il
		WHERE NOT EXISTS (SELECT 1 FROM chains c WHERE c.chain_id = il.chain_id)
		AND NOT ` + fmt.Sprintf(liveRunOn, "il.image_id") + ` LIMIT ?)`
	if err := r.pruneBatches(ctx, batch, &res.Images, &res, func(tx *sql.Tx) (int, error) {
		return execCount(ctx, tx, images, batch)
	}); err != nil {
		return res, nil, fmt.Errorf("pipeline: prune images: %w", err)
	}
	if !files {
		res.Deferred = true
		return res, nil, nil
	}
	objects := `DELETE FROM s3_objects WHERE rowid IN (SELECT o.rowid FROM s3_objects o WHERE NOT EXISTS
		(SELECT 1 FROM image_layers il JOIN s3_images i ON i.image_id = il.image_id
		  WHERE il.key = o.key
		    AND substr(i.source, 1, length(o.bucket) + 6) = 's3://' || o.bucket || '/')
		AND NOT ` + objectInUse + ` LIMIT ?5)`
	if err := r.pruneBatches(ctx, batch, &res.Objects, &res, func(tx *sql.Tx) (int, error) {
		ids := []string{}
		if held != nil {
			ids = append(ids, held()...)
		}
		h, err := json.Marshal(ids)
		if err != nil {
			return 0, fmt.Errorf("objects held by pulls: %w", err)
		}
		return execCount(ctx, tx, objects, string(h), api.FSMDownload, api.FSMUnpack, api.FSMActivate, batch)
	}); err != nil {
		return res, nil, fmt.Errorf("pipeline: prune objects: %w", err)
	}
	// A layer file is found only through an object record (check-exists
	// reads the object, then the file by its digest; a rebuild downloads
	// again), so a file no object names is of no use, whichever chains
	// stand on its layer.
	unused := `SELECT digest, path, stat_size, stat_mtime_ns, stat_ino FROM layers
		WHERE NOT EXISTS (SELECT 1 FROM s3_objects o WHERE o.digest = layers.digest)
		AND digest NOT IN (` + fmt.Sprintf(handedOnFiles, "?1") + `) LIMIT ?3`
	var layers int
	if err := r.pruneBatches(ctx, batch, &layers, &res, func(tx *sql.Tx) (int, error) {
		ids := []string{}
		if heldRuns != nil {
			ids = append(ids, heldRuns()...)
		}
		h, err := json.Marshal(ids)
		if err != nil {
			return 0, fmt.Errorf("runs held by pulls: %w", err)
		}
		rows, err := tx.QueryContext(ctx, unused, string(h), api.FSMDownload, batch)
		if err != nil {
			return 0, err
		}
		var (
			digests, paths []string
			found          []fileID
		)
		for rows.Next() {
			var (
				digest, path string
				st           fileID
			)
			if err := rows.Scan(&digest, &path, &st.size, &st.mtimeNs, &st.ino); err != nil {
				rows.Close()
				return 0, err
			}
			digests, paths, found = append(digests, digest), append(paths, path), append(found, st)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		for _, dg := range digests {
			if _, err := tx.ExecContext(ctx, `DELETE FROM layers WHERE digest = ?`, dg); err != nil {
				return 0, err
			}
		}
		// Kept only once the batch commits (see pruneBatches).
		res.LayerPaths = append(res.LayerPaths, paths...)
		stamps = append(stamps, found...)
		return len(digests), nil
	}); err != nil {
		// A batch that did not commit took its paths back, not its stamps.
		return res, stamps[:len(res.LayerPaths)], fmt.Errorf("pipeline: prune layers: %w", err)
	}
	return res, stamps, nil
}

// pruneBatches runs step, one write transaction each, until it removes
// fewer than batch rows, adding what committed batches removed to *count.
func (r Records) pruneBatches(ctx context.Context, batch int, count *int, res *PruneResult, step func(tx *sql.Tx) (int, error)) error {
	for {
		paths := len(res.LayerPaths)
		n := 0
		err := r.db.WithTx(ctx, func(tx *sql.Tx) error {
			var err error
			n, err = step(tx)
			return err
		})
		if err != nil {
			res.LayerPaths = res.LayerPaths[:paths]
			return err
		}
		*count += n
		if n < batch {
			return nil
		}
	}
}

// strayLayerFiles lists the files in dir (the download directory's
// blobs/sha256) that no layer row names, by path or by digest: what a
// download left when it renamed its file into place and then failed to
// record it. Only a download run puts files there, so when no run is live
// none of them is on its way to being recorded.
func (r Records) strayLayerFiles(ctx context.Context, dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: list layer files in %s: %w", dir, err)
	}
	if len(entries) == 0 {
		return nil, nil
	}
	files, err := r.ListLayerFiles(ctx)
	if err != nil {
		return nil, err
	}
	byDigest, byPath := map[string]bool{}, map[string]bool{}
	for _, f := range files {
		byDigest[strings.TrimPrefix(f.Digest, "sha256:")] = true
		byPath[filepath.Clean(f.Path)] = true
	}
	var stray []string
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if e.IsDir() || byDigest[e.Name()] || byPath[path] {
			continue
		}
		stray = append(stray, path)
	}
	return stray, nil
}

// LayerFilesInUse returns the digests of the layer files a pull under way
// or a live run may still read: those of the objects they name
// (objectInUse), and the files download runs handed on to them
// (handedOnFiles). Until release is called, pulls wait before holding
// their objects, so a file missing from the answer is none a pull found
// downloaded; its download will find it gone and download again. The
// caller removes files meanwhile, and releases promptly.
func (p *Pipelines) LayerFilesInUse(ctx context.Context) (inUse map[string]bool, release func(), err error) {
	p.objectGate.Lock()
	var once sync.Once
	release = func() { once.Do(p.objectGate.Unlock) }
	objects, err := json.Marshal(append([]string{}, p.objectHolds.ids()...))
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("pipeline: objects held by pulls: %w", err)
	}
	runs, err := json.Marshal(append([]string{}, p.heldRunIDs()...))
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("pipeline: runs held by pulls: %w", err)
	}
	digests, err := queryAll(ctx, p.db.Statements(), "layer files in use", func(s rowScanner) (string, error) {
		var d string
		return d, s.Scan(&d)
	}, objectsInUse+` SELECT o.digest FROM in_use k CROSS JOIN s3_objects o ON o.bucket = k.bucket AND o.key = k.key
		UNION `+fmt.Sprintf(handedOnFiles, "?5"),
		string(objects), api.FSMDownload, api.FSMUnpack, api.FSMActivate, string(runs))
	if err != nil {
		release()
		return nil, nil, err
	}
	inUse = make(map[string]bool, len(digests))
	for _, d := range digests {
		inUse[d] = true
	}
	return inUse, release, nil
}

// LiveRuns counts the FSM runs pending or running.
func (r Records) LiveRuns(ctx context.Context) (int, error) {
	var n int
	if err := r.db.Statements().QueryRowContext(ctx, `SELECT COUNT(*) FROM fsm_runs WHERE state IN ('pending', 'running')`).Scan(&n); err != nil {
		return 0, fmt.Errorf("pipeline: live runs: %w", err)
	}
	return n, nil
}

// ActivationLive reports whether an activate run of imageID is pending or
// running. A pull whose client went away leaves the runs it started going
// on in the daemon, and the activate run then records and registers the
// image: until it ends, the image is a pull's work in progress.
func (r Records) ActivationLive(ctx context.Context, imageID string) (bool, error) {
	var n int
	if err := r.db.Statements().QueryRowContext(ctx, `SELECT COUNT(*) FROM fsm_runs WHERE fsm = ? AND idempotency_id = ? AND state IN ('pending', 'running')`,
		api.FSMActivate, imageID).Scan(&n); err != nil {
		return false, fmt.Errorf("pipeline: live activation of image %s: %w", imageID, err)
	}
	return n > 0, nil
}

// ActivationLiveOfRef reports whether an activate run is pending or
// running for an image ref names (its name, or its source with or without
// a prefix's final '/'): the runs of a first pull whose client went away
// record the image only when they end, so no image record names it yet.
func (r Records) ActivationLiveOfRef(ctx context.Context, ref string) (bool, error) {
	var n int
	if err := r.db.Statements().QueryRowContext(ctx, `SELECT COUNT(*) FROM fsm_runs WHERE fsm = ?1 AND state IN ('pending', 'running')
		AND (json_extract(request, '$.ref') = ?2 OR json_extract(request, '$.source') IN (?2, ?2 || '/'))`,
		api.FSMActivate, ref).Scan(&n); err != nil {
		return false, fmt.Errorf("pipeline: live activation of %s: %w", ref, err)
	}
	return n > 0, nil
}

// liveRunsUsing counts, through tx (so that the answer holds until tx
// commits), the pending or running runs whose request names chainID. fields
// maps an FSM name to the JSON paths of its request that hold a chain ID
// (chainFields); a path ending in "[]" names an array of objects whose
// "chain_id" member is compared.
func liveRunsUsing(ctx context.Context, tx *sql.Tx, chainID string, fields map[string][]string) (int, error) {
	total := 0
	for fsm, paths := range fields {
		for _, p := range paths {
			var (
				n   int
				err error
			)
			if arr, ok := cutArray(p); ok {
				err = tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM fsm_runs r, json_each(r.request, ?) j
					WHERE r.fsm = ? AND r.state IN ('pending', 'running') AND json_extract(j.value, '$.chain_id') = ?`,
					arr, fsm, chainID).Scan(&n)
			} else {
				err = tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM fsm_runs r
					WHERE r.fsm = ? AND r.state IN ('pending', 'running') AND json_extract(r.request, ?) = ?`,
					fsm, p, chainID).Scan(&n)
			}
			if err != nil {
				return 0, fmt.Errorf("pipeline: live runs of %s using chain %s: %w", fsm, chainID, err)
			}
			total += n
		}
	}
	return total, nil
}

func cutArray(p string) (string, bool) {
	if len(p) > 2 && p[len(p)-2:] == "[]" {
		return p[:len(p)-2], true
	}
	return p, false
}

func execCount(ctx context.Context, tx *sql.Tx, q string, args ...any) (int, error) {
	r, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	n, err := r.RowsAffected()
	return int(n), err
}
