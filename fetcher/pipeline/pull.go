package pipeline

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
)

// imageSource normalizes what was asked into the image's source and id:
// a layer key is an image of one layer; a prefix gets "/".
func imageSource(bucket, key string) (source, imageID string) {
	if !s3source.IsLayerKey(key) && !strings.HasSuffix(key, "/") {
		key += "/"
	}
	source = S3URL(bucket, key)
	sum := sha256.Sum256([]byte(source))
	return source, "s3-" + hex.EncodeToString(sum[:12])
}

// ErrImageTooLarge: the sum of an image's layer objects is over
// Options.MaxImageSize.
var ErrImageTooLarge = errors.New("image too large")

// Pull makes the image req names pulled, unpacked, activated and
// registered under its name, and returns it. Unless req.Cached, it first
// asks S3 what the image is now (one LIST for a prefix, one HEAD for a
// key): an image recorded with the same objects (keys, ETags, sizes) and
// still in place is answered from the records; anything else runs the
// Download, Unpack and Activate machines, which reuse what is already
// there. progress, if set, receives the events of the runs of this pull,
// one at a time, on a goroutine of the pull's own: a progress that blocks
// (a client that stops reading) holds up only this call's return, never
// the runs, which other pulls share. Of the events one step raises while
// progress is blocked, the latest is delivered, and all of them before
// Pull returns, unless progress stays blocked past a grace of seconds at
// the end: Pull then returns, and progress gets the rest once it returns.
// A pull under way when Close begins is cut, and its error matches
// fsm.ErrClosed; Close returns once it has ended.
func (p *Pipelines) Pull(ctx context.Context, req api.PullRequest, progress func(api.Event)) (*api.PullResult, error) {
	ctx, end, err := p.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pull: %w", err)
	}
	defer end()
	res, err := p.pull(ctx, req, progress)
	return res, stopped(ctx, err)
}

// pull is Pull once counted as under way.
func (p *Pipelines) pull(ctx context.Context, req api.PullRequest, progress func(api.Event)) (*api.PullResult, error) {
	if p.opts.Snapshots == nil {
		return nil, errors.New("pull: the pipelines have no snapshotter")
	}
	nss, err := api.CheckNamespaces(req.Namespaces)
	if err != nil {
		return nil, fmt.Errorf("pull: %w", err)
	}
	req.Namespaces = nss
	source, imageID := imageSource(req.Bucket, req.Key)
	ref := req.Ref
	if ref == "" {
		var err error
		if ref, err = DefaultRef(req.Bucket, req.Key); err != nil {
			return nil, err
		}
	} else if err := CheckName(ref); err != nil {
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	if err := p.checkName(ctx, imageID, ref, req.Namespaces, req.Replace); err != nil {
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	lg := log.G(ctx).WithField("source", source).WithField("ref", ref)
	defer p.beginPull(imageID)()
	p.files.RLock()
	var release sync.Once
	unlock := func() { release.Do(p.files.RUnlock) }
	defer unlock()
	if req.Cached {
		res, why := p.repull(ctx, p.recordsNow(ctx, imageID), source, imageID, ref, req.Namespaces, req.Replace, nil)
		if res == nil {
			return nil, fmt.Errorf("pull %s --cached: %s: %w", source, why, errdefs.ErrNotFound)
		}
		lg.WithField("snapshot", res.Snapshot.SnapshotName).Info("already pulled (records only)")
		p.used(ctx, imageID, false)
		return res, nil
	}
	var records func() (*pulledState, error)
	if !req.Refresh {
		records = p.readRecords(ctx, imageID)
	}
	layers, err := p.listLayers(ctx, req, source)
	if err != nil {
		if records != nil {
			_, _ = records()
		}
		p.markFailed(ctx, imageID, source, err)
		return nil, err
	}
	if records != nil {
		if res, _ := p.repull(ctx, records, source, imageID, ref, req.Namespaces, req.Replace, layers); res != nil {
			lg.WithField("snapshot", res.Snapshot.SnapshotName).Info("already pulled, unchanged in S3")
			p.used(ctx, imageID, false)
			return res, nil
		}
	}
	releaseRoom, err := p.makeRoom(ctx, req.Bucket, source, layers)
	defer func() { releaseRoom() }()
	if err != nil {
		p.markFailed(ctx, imageID, source, err)
		return nil, err
	}
	res, err := p.runPipelines(ctx, req, source, imageID, ref, layers, progress)
	// An object overwritten in S3 during the pull ends its download (every
	// request carries the listed ETag), and so does one deleted (a
	// republish that removes layers, `aws s3 sync --delete`): pull the
	// image once more as S3 lists it now, never mixing the two versions.
	var oe *objectError
	changed := errors.Is(err, s3source.ErrChanged)
	if gone := !changed && errors.As(err, &oe) && s3source.IsNotFound(err); changed || gone {
		now, lerr := p.listLayers(ctx, req, source)
		switch {
		case gone && s3source.IsNotFound(lerr):
			// The image itself is gone (no layers left under the prefix,
			// the key deleted): that is what the pull failed on.
			err = lerr
		case lerr != nil:
		case !sameObjects(now, layers):
			lg.WithError(err).Warn("the image changed in S3 during the pull; pulling it as it is now")
			layers = now
			releaseRoom()
			if releaseRoom, err = p.makeRoom(ctx, req.Bucket, source, layers); err == nil {
				res, err = p.runPipelines(ctx, req, source, imageID, ref, layers, progress)
			}
		case gone:
			// Listed again unchanged: a store whose GET lags its listing.
			// One more GET; a listed object must be readable.
			lg.WithError(err).WithField("object", oe.url).Warn("an object S3 lists was not found on GET; pulling once more")
			if res, err = p.runPipelines(ctx, req, source, imageID, ref, layers, progress); errors.As(err, &oe) && s3source.IsNotFound(err) {
				err = fmt.Errorf("pull %s: %s is listed in S3 but its GET says it does not exist, twice, the image listed again unchanged in between; every object a listing names must be readable: %w",
					source, oe.url, err)
			}
		default:
			// Changed, yet listed again with the same ETag and size: a
			// replica whose GET lags its listing, or a server whose GETs
			// give other ETags than its listings. One more GET; then the
			// failure says so, not that the object changed, which the
			// listing does not show.
			lg.WithError(err).Warn("an object S3 lists unchanged was refused on GET as another version; pulling once more")
			if res, err = p.runPipelines(ctx, req, source, imageID, ref, layers, progress); errors.As(err, &oe) && errors.Is(err, s3source.ErrChanged) {
				err = fmt.Errorf("pull %s: %s is listed unchanged in S3 but its GET says it is another version, twice, the image listed again unchanged in between; a listing and the GETs of its objects must agree on their ETags: %w",
					source, oe.url, err)
			}
		}
	}
	// The pull's records (or its failure) keep what it built on now: the
	// collection after it judges the other images without these holds.
	releaseRoom()
	releaseRoom = func() {}
	if err != nil {
		p.markFailed(ctx, imageID, source, err)
		return nil, err
	}
	lg.WithField("snapshot", res.Snapshot.SnapshotName).WithField("downloaded", res.Downloaded).WithField("unpacked", res.Unpacked).Info("pulled")
	// The collection after a pull may delete files this pull no longer
	// needs.
	unlock()
	p.used(ctx, imageID, true)
	return res, nil
}

// awaitTransfer waits until the transfer of download dlID ends or its run
// runID (when not empty) ends, whichever comes first, or ctx ends.
func (p *Pipelines) awaitTransfer(ctx context.Context, dlID, runID string) {
	if runID == "" {
		return
	}
	ended, stop := p.transferEnded(dlID)
	defer stop()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		_, _ = fsm.Await[DownloadResponse](runCtx, p.m, runID)
	}()
	select {
	case <-ended:
	case <-runDone:
	case <-ctx.Done():
	}
	cancel()
	<-runDone
}

// markFailed records why a pull of an image failed (`ls images` shows it).
// A pull whose context was canceled did not fail: its client went away
// (Ctrl-C) or the daemon is stopping, and the runs it started go on or
// resume at the next start, so nothing is recorded.
func (p *Pipelines) markFailed(ctx context.Context, imageID, source string, cause error) {
	if errors.Is(ctx.Err(), context.Canceled) {
		log.G(ctx).WithError(cause).WithField("source", source).Info("pull: its client went away or the daemon is stopping; its runs go on")
		return
	}
	if err := RecordsOf(p.db).MarkImageFailed(context.WithoutCancel(ctx), imageID, source, cause.Error()); err != nil {
		log.G(ctx).WithError(err).WithField("source", source).Error("pull: recording the failure")
	}
}

// runPipelines runs Download, Unpack and Activate for layers.
func (p *Pipelines) runPipelines(ctx context.Context, req api.PullRequest, source, imageID, ref string, layers []api.Layer, progress func(api.Event)) (*api.PullResult, error) {
	var (
		mu   sync.Mutex
		runs = map[string]int{} // run id → 1-based layer (0: the image)
	)
	if progress != nil {
		cancel := p.hub.subscribe(func(e api.Event) (api.Event, bool) {
			mu.Lock()
			defer mu.Unlock()
			l, ok := runs[e.Run]
			e.Layer = l
			return e, ok
		}, progress)
		defer cancel()
	}
	watch := func(id string, layer int) {
		mu.Lock()
		runs[id] = layer
		mu.Unlock()
	}
	parent := newPullID()
	res := &api.PullResult{Ref: ref, Source: source, ImageID: imageID}

	// The bottom layers already unpacked as recorded are not downloaded
	// again: their chains stand, and their tarballs may have left the
	// download cache.
	// A chain whose device left the pool is rebuilt from its tarball by
	// its unpack run: from there on, layers are downloaded.
	known, err := p.unpackedPrefix(ctx, req.Bucket, layers)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	// Their unpack runs have no download to rebuild them from: they are
	// held (Guard) before their devices are checked, so that a chain
	// removed from here on is refused, and one removed before is seen
	// gone below and downloaded.
	for _, l := range known {
		defer p.building.hold(l.ChainID)()
	}
	for i, l := range known {
		// The chain's snapshot may be one containerd's unpacker committed
		// (chainKey), which the unpack run uses as it finds it.
		key, err := p.chainKey(ctx, l.ChainID)
		if err != nil {
			return nil, fmt.Errorf("pull %s: layer %d: %w", source, i+1, err)
		}
		alive := false
		if key != "" {
			if alive, _, err = p.deviceAlive(ctx, key); err != nil {
				return nil, fmt.Errorf("pull %s: layer %d: %w", source, i+1, err)
			}
		}
		if !alive {
			known = known[:i]
			break
		}
	}
	p.hook("pull:known-checked")
	copy(layers, known)
	// Downloads start at once, but for the layers read as ranged parts
	// (larger than one part): those fill the link alone, one after another
	// in layer order, so that the lower layers arrive first and the
	// extraction of each, which must wait for the one below it, can follow
	// its transfer instead of starting once every layer is in. The next
	// one starts when the transfer before it ends, not its run: a run
	// followed by an extraction lasts as long as the extraction, and the
	// link would stand idle meanwhile.
	dlRuns := make([]string, len(layers))
	dlIDs := make([]string, len(layers))            // the download runs' idempotency ids
	dlStarted := make([]chan struct{}, len(layers)) // closed once dlRuns[i] or dlErrs[i] is set
	dlErrs := make([]error, len(layers))
	downloadRequest := func(i int) *DownloadRequest {
		l := layers[i]
		return &DownloadRequest{Bucket: req.Bucket, S3Key: l.Key, Size: l.Size, ETag: l.ETag}
	}
	// A trim of the tarball cache under way (LayerFilesInUse) finishes
	// before the objects are held: their downloads then find what it left.
	p.objectGate.RLock()
	for i := len(known); i < len(layers); i++ {
		dlIDs[i] = objectRunID(downloadRequest(i))
		// Held before its run is started or joined: once ended, the run
		// is named as the predecessor of the layer's unpack run, and no
		// retention pass may forget it before then.
		defer p.runHolds.hold(dlIDs[i])()
		defer p.objectHolds.hold(S3URL(req.Bucket, layers[i].Key))()
		// Every layer above the bottom one may have to wait for its
		// parent: its validation keeps its tar stream (spool.go).
		if i > 0 {
			defer p.wantSpool(ctx, dlIDs[i])()
		}
	}
	p.objectGate.RUnlock()
	startDownload := func(i int) {
		defer close(dlStarted[i])
		runID, err := p.startDownload(ctx, dlIDs[i], downloadRequest(i), fsm.WithQueue(QueueDownloads), fsm.WithParent(parent))
		if err != nil {
			dlErrs[i] = fmt.Errorf("pull %s: start download of layer %d: %w", source, i+1, err)
			return
		}
		dlRuns[i] = runID
		watch(runID, i+1)
	}
	src, err := p.opts.Sources(ctx, req.Bucket)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	// Each layer, bottom up: once its parent chain is committed, a layer
	// still downloading is extracted as its bytes arrive (stream.go). The
	// bottom layer has no parent to wait for: its extraction is asked for
	// before its download starts, so that it follows the transfer from
	// the first byte and names the layer, which is then decompressed and
	// parsed once however the runs are scheduled. A layer that looks
	// unpacked already (unpackedElsewhere) gets no extraction.
	var streams []*streamExtraction
	defer func() {
		for _, s := range streams {
			p.dropStream(ctx, s)
		}
	}()
	if len(known) == 0 {
		s, err := p.startStreamUnlessUnpacked(ctx, dlIDs[0], "", req.Bucket, layers[0])
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", source, err)
		}
		if s != nil {
			streams = append(streams, s)
		}
	}
	var ranged []int
	for i := len(known); i < len(layers); i++ {
		dlStarted[i] = make(chan struct{})
		if src.Ranged(s3source.Object{Key: layers[i].Key, Size: layers[i].Size, ETag: layers[i].ETag}) {
			ranged = append(ranged, i)
			continue
		}
		startDownload(i)
	}
	seqCtx, stopSeq := context.WithCancel(ctx)
	defer stopSeq()
	go func() {
		for n, i := range ranged {
			if n > 0 {
				p.awaitTransfer(seqCtx, dlIDs[ranged[n-1]], dlRuns[ranged[n-1]])
				if err := seqCtx.Err(); err != nil {
					for _, j := range ranged[n:] {
						dlErrs[j] = err
						close(dlStarted[j])
					}
					return
				}
			}
			startDownload(i)
		}
	}()
	// Each layer's unpack run, started once its download has recorded
	// it (its chain ID is known then), adopts the layer's stream
	// extraction or extracts the file. The next layer's extraction waits
	// for this unpack run to commit. The layers already unpacked as
	// recorded get unpack runs too, which find their chains in place.
	upRuns := make([]string, len(layers))
	for i, l := range layers {
		parentChain := ""
		if i > 0 {
			parentChain = layers[i-1].ChainID
		}
		if i >= len(known) {
			if i > 0 {
				if _, err := fsm.Await[UnpackResponse](ctx, p.m, upRuns[i-1]); err != nil {
					if up := p.firstFailure(ctx, upRuns[:i]); up != nil {
						err = up
					}
					return nil, fmt.Errorf("pull %s: layer %d (%s): %w", source, i, layers[i-1].Key, err)
				}
			}
			select {
			case <-dlStarted[i]:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if dlErrs[i] != nil {
				return nil, dlErrs[i]
			}
			if i > 0 {
				s, err := p.startStreamUnlessUnpacked(ctx, dlIDs[i], parentChain, req.Bucket, l)
				if err != nil {
					return nil, fmt.Errorf("pull %s: %w", source, err)
				}
				if s != nil {
					streams = append(streams, s)
				}
			}
			d, err := fsm.Await[DownloadResponse](ctx, p.m, dlRuns[i])
			if err != nil {
				return nil, fmt.Errorf("pull %s: layer %d (%s): %w", source, i+1, l.Key, &objectError{url: S3URL(req.Bucket, l.Key), err: err})
			}
			if d.Downloaded {
				res.Downloaded++
			}
			layers[i].DiffID = d.diffID()
			layers[i].ChainID = ChainID(parentChain, layers[i].DiffID)
			p.hook("download:awaited")
		}
		var after []string
		if dlRuns[i] != "" {
			after = append(after, dlRuns[i])
		}
		if i > 0 {
			after = append(after, upRuns[i-1])
		}
		chain := layers[i].ChainID
		defer p.building.hold(chain)()
		runID, err := p.startUnpack(ctx, chain, &UnpackRequest{ChainID: chain, ParentChainID: parentChain, DiffID: layers[i].DiffID,
			S3URL: S3URL(req.Bucket, l.Key)},
			fsm.WithQueue(QueueUnpacking), fsm.WithRunAfter(after...), fsm.WithParent(parent))
		if err != nil {
			return nil, fmt.Errorf("pull %s: start unpack of layer %d: %w", source, i+1, err)
		}
		upRuns[i] = runID
		watch(runID, i+1)
	}
	top := layers[len(layers)-1].ChainID
	res.Layers, res.TopChainID = layers, top
	// The activate run's response is read once the run has ended.
	defer p.runHolds.hold(imageID)()
	var acRun string
	for ours := false; !ours; {
		acRun, ours, err = p.startOwnActivate(ctx, &ActivateRequest{ImageID: imageID, Source: source, Ref: ref, Layers: layers, Namespaces: req.Namespaces, Replace: req.Replace},
			fsm.WithRunAfter(upRuns[len(upRuns)-1]), fsm.WithParent(parent))
		if err != nil {
			return nil, fmt.Errorf("pull %s: start activate: %w", source, err)
		}
	}
	watch(acRun, 0)
	p.hook("activate:started")
	ac, err := fsm.Await[api.ActivateResponse](ctx, p.m, acRun)
	for _, runID := range upRuns {
		u, uerr := fsm.ResponseOf[UnpackResponse](ctx, p.m, runID)
		if rec, rerr := p.m.Run(ctx, runID); uerr == nil && u.Unpacked && rerr == nil && rec.State == fsm.StateComplete {
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
	// A concurrent pull of the same image under another name or in other
	// namespaces shares the activation run, which registered that name
	// there: name it this way too, with the layers this pull made
	// (naming is idempotent).
	if ac.Ref != ref || !slices.Equal(ac.Namespaces, req.Namespaces) {
		if err := p.nameImage(ctx, imageID, ref, req.Namespaces, layers, req.Replace); err != nil {
			return nil, fmt.Errorf("pull %s: %w", source, err)
		}
	}
	res.Snapshot.Registered, res.Snapshot.RegisterPending = p.registration(ctx, ref)
	return res, nil
}

// startOwnActivate starts the activate run of r.ImageID (one live run per
// image) and returns its id, ours true, when that run activates r's
// layers: a new one, or a live one of the same layers, joined. A live run
// of other layers (a pull of another version of the image, an activate of
// the image as recorded before) is not this caller's: its result would
// report one version while the image is left on the other. It is waited
// for to end, whatever its end, and its id returned with ours false; the
// caller starts again (from what is true once it ended).
func (p *Pipelines) startOwnActivate(ctx context.Context, r *ActivateRequest, opts ...fsm.StartOption) (runID string, ours bool, err error) {
	runID, err = p.startActivate(ctx, r.ImageID, r, opts...)
	if err != nil {
		return "", false, err
	}
	rec, err := p.m.Run(ctx, runID)
	if err != nil {
		return "", false, err
	}
	var live ActivateRequest
	if err := json.Unmarshal(rec.Request, &live); err != nil {
		return "", false, fmt.Errorf("activate %s: request of run %s: %w", r.Source, runID, err)
	}
	if sameActivation(live.Layers, r.Layers) {
		return runID, true, nil
	}
	log.G(ctx).WithField("source", r.Source).WithField("run", runID).WithField("top", r.topChain()).
		Info("activate: another version's activate run of the image is live; waiting for it to end to activate this one")
	if _, _, err := p.m.Wait(ctx, runID); err != nil && !errors.Is(err, fsm.ErrAborted) && !errors.Is(err, fsm.ErrFailed) {
		// Not the run's end (ctx ended, or its checkpoints could not be
		// written and it stays live): starting again would join it again.
		return "", false, fmt.Errorf("activate %s: waiting for the activate run %s of other layers: %w", r.Source, runID, err)
	}
	return runID, false, nil
}

// objectError is a pull's failure to download one object of the image
// (url, its s3:// URL): what Pull lists the image again for when S3 says
// the object changed or is gone.
type objectError struct {
	url string
	err error
}

func (e *objectError) Error() string { return e.err.Error() }
func (e *objectError) Unwrap() error { return e.err }

// sameActivation reports whether two activate requests' layers are the
// same: the same objects (keys, ETags, sizes) unpacked into the same
// chains, in order.
func sameActivation(a, b []api.Layer) bool {
	return slices.EqualFunc(a, b, func(x, y api.Layer) bool {
		return x.ChainID == y.ChainID && x.Key == y.Key && x.ETag == y.ETag && x.Size == y.Size
	})
}

// sameObjects reports whether two listings of an image name the same
// objects (keys, ETags, sizes, in order).
func sameObjects(a, b []api.Layer) bool {
	return slices.EqualFunc(a, b, func(x, y api.Layer) bool { return x.Key == y.Key && x.ETag == y.ETag && x.Size == y.Size })
}

// listLayers asks S3 what the image is now: its objects in key order.
func (p *Pipelines) listLayers(ctx context.Context, req api.PullRequest, source string) ([]api.Layer, error) {
	src, err := p.opts.Sources(ctx, req.Bucket)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	objs, err := src.ResolveImage(ctx, req.Key)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", source, err)
	}
	ls := make([]api.Layer, len(objs))
	var total int64
	over := false
	for i, o := range objs {
		ls[i] = api.Layer{Key: o.Key, Size: o.Size, ETag: o.ETag}
		// Sizes are what the server says: a sum past what an int64
		// holds is over any limit, not a negative total under it.
		if o.Size > math.MaxInt64-total {
			over, total = true, math.MaxInt64
			continue
		}
		total += o.Size
	}
	if limit := p.opts.MaxImageSize; limit > 0 && (over || total > limit) {
		sum := fmt.Sprintf("%d bytes", total)
		if over {
			sum = "more than 9223372036854775807 bytes"
		}
		return nil, fmt.Errorf("pull %s: %w: %d layer objects of %s together, limit %d", source, ErrImageTooLarge, len(objs), sum, limit)
	}
	return ls, nil
}

// firstFailure is the error of the first unpack run that did not
// complete, if any (more telling than the activate run's "predecessor
// aborted").
func (p *Pipelines) firstFailure(ctx context.Context, runIDs []string) error {
	for _, id := range runIDs {
		rec, err := p.m.Run(ctx, id)
		if err == nil && rec.State.Terminal() && rec.State != fsm.StateComplete {
			_, _, werr := p.m.Wait(ctx, id) // the run's error, with its cause
			return werr
		}
	}
	return nil
}

// Activate runs the Activate machine again for the image ref names (one of
// its names or its s3:// source; its activation re-created if it is gone)
// and returns its snapshot. Like a pull, an activate under way when Close
// begins is cut (fsm.ErrClosed), and Close waits for it to end.
func (p *Pipelines) Activate(ctx context.Context, ref string) (*api.ActivateResponse, error) {
	ctx, end, err := p.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("activate %q: %w", ref, err)
	}
	defer end()
	res, err := p.activate(ctx, ref)
	return res, stopped(ctx, err)
}

// activate is Activate once counted as under way.
func (p *Pipelines) activate(ctx context.Context, ref string) (*api.ActivateResponse, error) {
	imageID, err := RecordsOf(p.db).ImageIDByRef(ctx, ref)
	if err != nil {
		return nil, err
	}
	if imageID == "" {
		return nil, fmt.Errorf("activate %q: no image pulled under that name: %w", ref, errdefs.ErrNotFound)
	}
	// Held like a pull's image: a removal of it under way ends first (its
	// records then say what is left), and none starts under the
	// activation, which builds on the image's chains.
	end := p.beginPull(imageID)
	defer end()
	img, err := RecordsOf(p.db).GetImage(ctx, imageID)
	if err != nil {
		return nil, err
	}
	recorded, err := RecordsOf(p.db).imageLayers(ctx, imageID)
	if err != nil {
		return nil, err
	}
	if img == nil || len(recorded) == 0 {
		return nil, fmt.Errorf("activate %q: image %s has no layers recorded: pull it again: %w", ref, imageID, errdefs.ErrNotFound)
	}
	layers := make([]api.Layer, len(recorded))
	for i, l := range recorded {
		c, err := RecordsOf(p.db).GetChain(ctx, l.ChainID)
		if err != nil {
			return nil, err
		}
		if c == nil {
			return nil, fmt.Errorf("activate %q: layer %d (chain %s) is no longer unpacked: pull it again: %w", ref, i+1, l.ChainID, errdefs.ErrNotFound)
		}
		layers[i] = api.Layer{Key: l.Key, Size: l.SizeBytes, ETag: l.ETag, DiffID: c.DiffID, ChainID: l.ChainID}
	}
	// Registering goes by name: a source given instead registers the
	// image's first name again, if it has one.
	names, err := RecordsOf(p.db).imageNames(ctx, imageID)
	if err != nil {
		return nil, err
	}
	name := ""
	if slices.Contains(names, ref) {
		name = ref
	} else if len(names) > 0 {
		name = names[0]
	}
	nss := p.namedIn(ctx, name)
	// The run's response is read once the run has ended.
	defer p.runHolds.hold(imageID)()
	runID, err := p.startActivate(ctx, imageID, &ActivateRequest{ImageID: imageID, Source: img.Source, Ref: name, Layers: layers, Namespaces: nss})
	if err != nil {
		return nil, err
	}
	p.hook("activate:started")
	resp, err := fsm.Await[api.ActivateResponse](ctx, p.m, runID)
	if err == nil {
		p.used(ctx, imageID, false)
	}
	return resp, err
}

// namedIn is where an activate registers name again: the containerd
// namespaces that have it as an image of ours, and those where its
// registration waits for containerd (pending). A pull registered it in the
// namespaces it was asked for, and registering it in the registrar's own
// (none: the answer) would add it where no pull asked; only a name
// nowhere, or a containerd that does not say, gets the registrar's own.
func (p *Pipelines) namedIn(ctx context.Context, name string) []string {
	if name == "" || p.opts.Registrar == nil {
		return nil
	}
	lg := log.G(ctx).WithField("name", name)
	nss, err := p.opts.Registrar.Namespaces(ctx, name)
	if err != nil {
		lg.WithError(err).Warn("activate: containerd did not say where the name is registered; registering it in the default namespace")
		return nil
	}
	pending, err := RecordsOf(p.db).pendingNamespaces(ctx, name)
	if err != nil {
		lg.WithError(err).Warn("activate: reading where the name waits for containerd")
	}
	for _, ns := range pending {
		// "" is the registrar's own namespace, which the pending
		// registration itself takes care of.
		if ns != "" && !slices.Contains(nss, ns) {
			nss = append(nss, ns)
		}
	}
	return nss
}

func newPullID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "pull-" + hex.EncodeToString(b[:])
}
