package pipeline

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// PullRequest names an S3 image: one ".tar" key, or a prefix whose ".tar"
// objects are its layers.
type PullRequest struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	// Ref names the image (the containerd image name); empty means the
	// s3:// source.
	Ref string `json:"ref,omitempty"`
	// Refresh lists the image in S3 again and runs the pipelines even if
	// it was pulled before, so that every layer's device is checked
	// (otherwise a pulled, unchanged image is answered from the records
	// and S3 is not asked at all).
	Refresh bool `json:"refresh,omitempty"`
}

// PullResult describes a pulled, unpacked and activated image.
type PullResult struct {
	Ref        string           `json:"ref"`
	Source     string           `json:"source"`
	ImageID    string           `json:"image_id"`
	Layers     []Layer          `json:"layers"`
	TopChainID string           `json:"top_chain_id"`
	Snapshot   ActivateResponse `json:"snapshot"`
	// Downloaded counts the layers whose download run fetched bytes from S3
	// and Unpacked the chain positions whose unpack run extracted them; a
	// run shared with a concurrent pull of the same image counts in both.
	Downloaded int `json:"downloaded"`
	Unpacked   int `json:"unpacked"`
}

// ParseS3URL splits s3://BUCKET/KEY-or-PREFIX.
func ParseS3URL(u string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(u, "s3://")
	if !ok {
		return "", "", fmt.Errorf("image %q: must be s3://BUCKET/KEY-or-PREFIX", u)
	}
	bucket, key, _ = strings.Cut(rest, "/")
	if bucket == "" || key == "" {
		return "", "", fmt.Errorf("image %q: must name a bucket and a key or prefix (s3://BUCKET/KEY-or-PREFIX)", u)
	}
	return bucket, key, nil
}

// imageSource normalizes what was asked into the image's source and id:
// a ".tar" key is its own image (the layer's row); a prefix gets "/".
func imageSource(bucket, key string) (source, imageID string) {
	if strings.HasSuffix(key, ".tar") {
		return S3URL(bucket, key), LayerImageID(bucket, key)
	}
	if !strings.HasSuffix(key, "/") {
		key += "/"
	}
	source = S3URL(bucket, key)
	sum := sha256.Sum256([]byte(source))
	return source, "s3-" + hex.EncodeToString(sum[:12])
}

// ErrImageTooLarge: the sum of an image's layer objects is over
// Options.MaxImageSize.
var ErrImageTooLarge = errors.New("image too large")

// Pull runs Download, Unpack and Activate for the image req names and
// returns once the image is active (or a machine ended it). progress, if
// set, receives the events of the runs of this pull, from several
// goroutines, one at a time.
func (p *Pipelines) Pull(ctx context.Context, req PullRequest, progress func(Event)) (*PullResult, error) {
	if p.opts.Snapshots == nil {
		return nil, errors.New("pull: the pipelines have no snapshotter")
	}
	source, imageID := imageSource(req.Bucket, req.Key)
	ref := req.Ref
	if ref == "" {
		ref = source
	}
	lg := log.G(ctx).WithField("source", source).WithField("ref", ref)
	if !req.Refresh {
		if res := p.repull(ctx, source, imageID, ref); res != nil {
			lg.WithField("snapshot", res.Snapshot.SnapshotName).Info("already pulled")
			return res, nil
		}
	}
	layers, err := p.layersOf(ctx, req, source)
	if err != nil {
		return nil, err
	}

	var (
		mu   sync.Mutex
		runs = map[string]int{} // run id → 1-based layer (0: the image)
	)
	if progress != nil {
		cancel := p.hub.subscribe(func(e Event) {
			mu.Lock()
			defer mu.Unlock()
			if l, ok := runs[e.Run]; ok {
				e.Layer = l
				progress(e)
			}
		})
		defer cancel()
	}
	watch := func(id string, layer int) {
		mu.Lock()
		runs[id] = layer
		mu.Unlock()
	}
	parent := newPullID()
	res := &PullResult{Ref: ref, Source: source, ImageID: imageID}

	dlRuns := make([]string, len(layers))
	for i, l := range layers {
		id := LayerImageID(req.Bucket, l.Key)
		runID, err := p.startDownload(ctx, id, &DownloadRequest{S3Key: l.Key, ImageID: id, Bucket: req.Bucket, Size: l.Size, ETag: l.ETag},
			fsm.WithQueue(QueueDownloads), fsm.WithParent(parent))
		if err != nil {
			return nil, fmt.Errorf("pull %s: start download of layer %d: %w", source, i+1, err)
		}
		dlRuns[i] = runID
		watch(runID, i+1)
	}
	prev := ""
	for i, runID := range dlRuns {
		d, err := fsm.Await[DownloadResponse](ctx, p.m, runID)
		if err != nil {
			p.markDownloadFailed(ctx, req.Bucket, layers[i], err)
			return nil, fmt.Errorf("pull %s: layer %d (%s): %w", source, i+1, layers[i].Key, err)
		}
		if d.Downloaded {
			res.Downloaded++
		}
		layers[i].DiffID = d.Checksum
		prev = ChainID(prev, d.Checksum)
		layers[i].ChainID = prev
	}

	upRuns := make([]string, len(layers))
	for i, l := range layers {
		parentChain := ""
		if i > 0 {
			parentChain = layers[i-1].ChainID
		}
		after := []string{dlRuns[i]}
		if i > 0 {
			after = append(after, upRuns[i-1])
		}
		runID, err := p.startUnpack(ctx, l.ChainID, &UnpackRequest{ChainID: l.ChainID, ParentChainID: parentChain, DiffID: l.DiffID,
			ImageID: LayerImageID(req.Bucket, l.Key), S3URL: S3URL(req.Bucket, l.Key), Top: i == len(layers)-1},
			fsm.WithQueue(QueueUnpacking), fsm.WithRunAfter(after...), fsm.WithParent(parent))
		if err != nil {
			return nil, fmt.Errorf("pull %s: start unpack of layer %d: %w", source, i+1, err)
		}
		upRuns[i] = runID
		watch(runID, i+1)
	}
	top := layers[len(layers)-1].ChainID
	res.Layers, res.TopChainID = layers, top
	acRun, err := p.startActivate(ctx, imageID, &ActivateRequest{ImageID: imageID, Source: source, Ref: ref, TopChainID: top, Layers: layers},
		fsm.WithRunAfter(upRuns[len(upRuns)-1]), fsm.WithParent(parent))
	if err != nil {
		return nil, fmt.Errorf("pull %s: start activate: %w", source, err)
	}
	watch(acRun, 0)
	ac, err := fsm.Await[ActivateResponse](ctx, p.m, acRun)
	for i, runID := range upRuns {
		u, uerr := fsm.ResponseOf[UnpackResponse](ctx, p.m, runID)
		if rec, rerr := p.m.Run(ctx, runID); rerr == nil && rec.State.Terminal() && rec.State != fsm.StateComplete {
			p.cleanupUnpack(ctx, layers[i].ChainID, runID)
		} else if uerr == nil && u.Unpacked && rerr == nil && rec.State == fsm.StateComplete {
			res.Unpacked++
		}
	}
	if err != nil {
		if up := p.firstFailure(ctx, upRuns); up != nil {
			err = up
		}
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	res.Snapshot = *ac
	raw, _ := json.Marshal(layers)
	if err := p.db.StorePulledImage(ctx, metadata.PulledImage{Ref: ref, Source: source, ImageID: imageID, Layers: string(raw),
		TopChainID: top, SnapshotKey: ac.SnapshotName}); err != nil {
		return nil, err
	}
	lg.WithField("snapshot", ac.SnapshotName).WithField("downloaded", res.Downloaded).WithField("unpacked", res.Unpacked).Info("pulled")
	return res, nil
}

// layersOf lists the image's layers: from the pulled-image record when
// there is one (no S3 request), from S3 otherwise.
func (p *Pipelines) layersOf(ctx context.Context, req PullRequest, source string) ([]Layer, error) {
	if !req.Refresh {
		rec, err := p.db.PulledImageBySource(ctx, source)
		if err != nil {
			return nil, err
		}
		if rec != nil {
			var ls []Layer
			if err := json.Unmarshal([]byte(rec.Layers), &ls); err == nil && len(ls) > 0 {
				for i := range ls {
					ls[i].DiffID, ls[i].ChainID = "", ""
				}
				return ls, nil
			}
		}
	}
	src, err := p.opts.Sources(ctx, req.Bucket)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	objs, err := src.ResolveImage(ctx, req.Key)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	ls := make([]Layer, len(objs))
	var total int64
	for i, o := range objs {
		ls[i] = Layer{Key: o.Key, Size: o.Size, ETag: o.ETag}
		total += o.Size
	}
	if limit := p.opts.MaxImageSize; limit > 0 && total > limit {
		return nil, fmt.Errorf("pull %s: %w: %d layer objects of %d bytes together, limit %d", source, ErrImageTooLarge, len(objs), total, limit)
	}
	return ls, nil
}

// markDownloadFailed records a download run that failed out of attempts
// (validation rejections mark the image themselves) as a failed image.
func (p *Pipelines) markDownloadFailed(ctx context.Context, bucket string, l Layer, err error) {
	var re *fsm.RunError
	if !errors.As(err, &re) || re.State != fsm.StateFailed {
		return
	}
	if merr := p.db.MarkImageFailed(context.WithoutCancel(ctx), metadata.ImageFailure{ImageID: LayerImageID(bucket, l.Key),
		S3Key: S3URL(bucket, l.Key), LocalPath: p.tmpPath(LayerImageID(bucket, l.Key)), SizeBytes: l.Size, Reason: re.Error()}); merr != nil {
		log.G(ctx).WithError(merr).Error("pull: marking the image failed")
	}
}

// cleanupUnpack removes what an unpack run that ended without completing
// may have left: its extraction snapshot and its lock.
func (p *Pipelines) cleanupUnpack(ctx context.Context, chain, runID string) {
	if err := p.discardExtract(ctx, chain); err != nil {
		log.G(ctx).WithError(err).WithField("chain", chain).Error("pull: removing a failed unpack's device")
	}
	p.releaseLock(ctx, chain, runID)
}

// firstFailure is the error of the first unpack run that did not
// complete, if any (more telling than the activate run's "predecessor
// aborted").
func (p *Pipelines) firstFailure(ctx context.Context, runIDs []string) error {
	for _, id := range runIDs {
		rec, err := p.m.Run(ctx, id)
		if err == nil && rec.State.Terminal() && rec.State != fsm.StateComplete {
			return &fsm.RunError{RunID: rec.ID, FSM: rec.FSM, State: rec.State, Transition: rec.Transition, Reason: rec.LastError}
		}
	}
	return nil
}

// Activate runs the Activate machine again for the pulled image ref (its
// active snapshot re-created if it is gone) and returns its snapshot.
func (p *Pipelines) Activate(ctx context.Context, ref string) (*ActivateResponse, error) {
	rec, err := p.db.GetPulledImage(ctx, ref)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, fmt.Errorf("activate %q: no image pulled under that name: %w", ref, metadata.ErrNotFound)
	}
	var layers []Layer
	if err := json.Unmarshal([]byte(rec.Layers), &layers); err != nil {
		return nil, fmt.Errorf("activate %q: recorded layers: %w", ref, err)
	}
	runID, err := p.startActivate(ctx, rec.ImageID, &ActivateRequest{ImageID: rec.ImageID, Source: rec.Source, Ref: rec.Ref,
		TopChainID: rec.TopChainID, Layers: layers})
	if err != nil {
		return nil, err
	}
	return fsm.Await[ActivateResponse](ctx, p.m, runID)
}

func newPullID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "pull-" + hex.EncodeToString(b[:])
}
