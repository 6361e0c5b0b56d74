package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
)

// sweep removes, at start-up after Resume, what runs that are no longer
// live left behind: a run's own cleanup removes what it made when it ends,
// but a process killed at the wrong moment (or a cleanup that failed) can
// leave an extraction snapshot, its mount point, an activate run's
// verification view, a download's temp file, a spool, or a layer file
// renamed into place that no layer row names.
// Those of live runs are theirs to use and are kept: layer files are
// looked at only when no run is live and no pull under way.
func (p *Pipelines) sweep(ctx context.Context) error {
	live := map[string]bool{} // FSM + " " + idempotency id
	// adopted are the stream extractions live unpack runs took as theirs
	// (stream.go); any other is its process's, and that process is gone.
	adopted := map[string]bool{}
	runs, err := fsm.NewSQLiteStore(p.db).UnfinishedRuns(ctx)
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	for _, r := range runs {
		live[r.FSM+" "+r.IdempotencyID] = true
		var resp UnpackResponse
		if r.FSM == api.FSMUnpack && json.Unmarshal(r.Response, &resp) == nil && strings.HasPrefix(resp.ExtractKey, streamPrefix) {
			adopted[resp.ExtractKey] = true
		}
	}
	var errs []error
	if p.opts.Snapshots != nil {
		var stale []string
		err := p.opts.Snapshots.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if info.Labels[LabelPrivate] != privateExtract || !strings.HasPrefix(info.Name, extractPrefix) {
				return nil
			}
			if strings.HasPrefix(info.Name, streamPrefix) {
				if !adopted[info.Name] {
					stale = append(stale, info.Name)
				}
			} else if !live[api.FSMUnpack+" sha256:"+strings.TrimPrefix(info.Name, extractPrefix)] {
				stale = append(stale, info.Name)
			}
			return nil
		}, fmt.Sprintf(`labels.%q==%s`, LabelPrivate, privateExtract))
		if err != nil {
			errs = append(errs, fmt.Errorf("sweep: extraction snapshots: %w", err))
		}
		for _, key := range stale {
			log.G(ctx).WithField("snapshot", key).Warn("sweep: removing the extraction snapshot of a run that is no longer live")
			if err := p.discardKey(ctx, key); err != nil {
				errs = append(errs, fmt.Errorf("sweep: %w", err))
			}
		}
		// A verification view belongs to its image's live activate run
		// (replacePrevious), which removes it when it ends.
		var views []string
		err = p.opts.Snapshots.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if id, ok := strings.CutPrefix(info.Name, verifyPrefix); ok && info.Labels[LabelPrivate] == privateVerify && !live[api.FSMActivate+" "+id] {
				views = append(views, id)
			}
			return nil
		}, fmt.Sprintf(`labels.%q==%s`, LabelPrivate, privateVerify))
		if err != nil {
			errs = append(errs, fmt.Errorf("sweep: verification views: %w", err))
		}
		for _, id := range views {
			log.G(ctx).WithField("snapshot", verifyKey(id)).Warn("sweep: removing the verification view of an activate run that is no longer live")
			if err := p.discardVerifyView(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("sweep: %w", err))
			}
		}
	}
	tmps, err := os.ReadDir(p.opts.tmpDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("sweep: %w", err))
	}
	for _, e := range tmps {
		path := filepath.Join(p.opts.tmpDir(), e.Name())
		if strings.HasSuffix(e.Name(), spoolSuffix) {
			// Only a pull asks for a spool, and none has been served yet:
			// every spool here is an earlier process's (spool.go).
			log.G(ctx).WithField("file", path).Info("sweep: removing the spool of an earlier process")
		} else if id, ok := strings.CutSuffix(e.Name(), ".partial"); ok && !live[api.FSMDownload+" "+id] {
			log.G(ctx).WithField("file", path).Warn("sweep: removing the temp file of a download that is no longer live")
		} else {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("sweep: %w", err))
		}
	}
	if err := p.sweepStrayLayerFiles(ctx); err != nil {
		errs = append(errs, fmt.Errorf("sweep: %w", err))
	}
	return errors.Join(errs...)
}

// sweepStrayLayerFiles removes the layer files no layer row names when no
// pull holds p.files and no run is live (Pipelines.removeStrayLayerFiles);
// otherwise it leaves them to the next Prune.
func (p *Pipelines) sweepStrayLayerFiles(ctx context.Context) error {
	if !p.files.TryLock() {
		return nil
	}
	defer p.files.Unlock()
	live, err := RecordsOf(p.db).LiveRuns(ctx)
	if err != nil || live > 0 {
		return err
	}
	_, err = p.removeStrayLayerFiles(ctx)
	return err
}
