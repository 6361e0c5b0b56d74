package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// ChainID is the OCI chain ID of a layer whose parent chain is parent (""
// for the first layer) and whose diff ID is diffID: image-spec's ChainID of
// the pair, since a chain ID folds every layer below into its parent's.
func ChainID(parent, diffID string) string {
	ds := []digest.Digest{digest.Digest(diffID)}
	if parent != "" {
		ds = []digest.Digest{digest.Digest(parent), digest.Digest(diffID)}
	}
	return identity.ChainID(ds).String()
}

// LabelSource is the label naming the S3 object a committed chain
// snapshot's layer came from.
const LabelSource = "flyio.io/s3-source"

// UnpackRequest is one "unpack-image" run: the layer at one chain
// position, keyed by chain ID. The layer's file comes from the run-after
// Download run.
type UnpackRequest struct {
	ChainID       string `json:"chain_id"`
	ParentChainID string `json:"parent_chain_id"`
	DiffID        string `json:"diff_id"`
	S3URL         string `json:"s3_url"` // the object the layer was downloaded from (a label)
}

// UnpackResponse is what the run produced.
type UnpackResponse struct {
	ChainID         string `json:"chain_id"`
	ExtractKey      string `json:"extract_key,omitempty"`
	DeviceID        uint32 `json:"device_id"`
	DeviceName      string `json:"device_name"`
	SizeBytes       int64  `json:"size_bytes"`
	FileCount       int    `json:"file_count"`
	Unpacked        bool   `json:"unpacked"`
	AlreadyUnpacked bool   `json:"already_unpacked"`
	// Streamed says the layer was extracted while it downloaded, into
	// ExtractKey, and adopted by extract-layers (see stream.go).
	Streamed bool `json:"streamed,omitempty"`
}

type upReq = fsm.Request[UnpackRequest, UnpackResponse]
type upResp = fsm.Response[UnpackResponse]

// At most one run per chain is live at a time (the runner's live-run index
// on the chain ID): that is what keeps two pulls from extracting the same
// chain at once; there is no other lock.
func (p *Pipelines) buildUnpack(ctx context.Context) (fsm.StartFunc[UnpackRequest], error) {
	start, _, err := fsm.Register[UnpackRequest, UnpackResponse](p.m, api.FSMUnpack).
		Start("check-unpacked", p.checkUnpacked, p.retry(fsm.ExponentialBackoff(3))).
		To("create-device", p.createDevice, p.retry(fsm.FixedRetry(3, fixedDelay))).
		To("extract-layers", p.extractLayers, fsm.WithTimeout(p.opts.ExtractTimeout), p.retry(fsm.FixedRetry(2, fixedDelay))).
		To("verify-layout", p.verifyLayout, p.retry(fsm.FixedRetry(2, fixedDelay))).
		To("update-db", p.updateDB, p.retry(fsm.ExponentialBackoff(5))).
		End("complete").
		OnFail(p.discardUnpack).
		Build(ctx)
	return start, err
}

// extractKey is the active snapshot a chain is extracted into.
func extractKey(chainID string) string {
	return extractPrefix + strings.TrimPrefix(chainID, "sha256:")
}

const extractPrefix = "flyio-extract-"

// deviceAlive reports whether key's snapshot record exists and its thin
// device is in the pool.
func (p *Pipelines) deviceAlive(ctx context.Context, key string) (bool, uint32, error) {
	ok, err := p.opts.Snapshots.Exists(ctx, key)
	if err != nil || !ok {
		return false, 0, err
	}
	_, _, id, err := p.opts.Snapshots.DeviceOf(ctx, key)
	if err != nil {
		return false, 0, err
	}
	alive, err := p.opts.ThinExists(ctx, id)
	return alive, id, err
}

// chainKey is the key of chain chainID's committed snapshot in our pool,
// "" when there is none. It is chainID itself when the pipeline committed
// the chain. Otherwise it is a snapshot containerd's unpacker committed
// (a registry image pulled with our snapshotter): containerd's metadata
// store hands its proxy snapshotters keys of the form
// "<namespace>/<n>/<key>", so a chain it commits reaches us as
// "<namespace>/<n>/<chainID>", labelled containerd.io/snapshot.ref =
// chainID (the label its unpacker prepares and commits with, which the
// metadata store passes on). Such a snapshot holds the chain's content:
// a chain ID names the whole stack of diffs under it. Of several, the
// oldest is taken, the one containerd's metadata store also finds first
// through our snapshotter's ref lookup, so that what the pipeline builds
// on it is what containerd adopts.
func (p *Pipelines) chainKey(ctx context.Context, chainID string) (string, error) {
	if chainID == "" {
		return "", nil
	}
	info, err := p.opts.Snapshots.Stat(ctx, chainID)
	switch {
	case err == nil && info.Kind == snapshots.KindCommitted:
		return chainID, nil
	case err == nil:
		return "", nil // our key, not committed: nothing to build on
	case !errdefs.IsNotFound(err):
		return "", fmt.Errorf("chain %s: %w", chainID, err)
	}
	key := ""
	filter := fmt.Sprintf(`kind==committed,labels.%q==%q`, snapshots.LabelSnapshotRef, chainID)
	err = p.opts.Snapshots.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if key == "" && registryChain(i) == chainID {
			key = i.Name
		}
		return nil
	}, filter)
	if err != nil {
		return "", fmt.Errorf("chain %s: look for the snapshot containerd committed: %w", chainID, err)
	}
	return key, nil
}

// parentKey is chainKey of parent, a chain that must be committed; "" for
// no parent. A parent committed nowhere is returned as it is, for the
// Prepare on it to fail with NotFound naming it.
func (p *Pipelines) parentKey(ctx context.Context, parent string) (string, error) {
	key, err := p.chainKey(ctx, parent)
	if err != nil || key == "" {
		return parent, err
	}
	return key, nil
}

// checkUnpacked: a chain whose committed snapshot and device exist hands
// off (recorded first if a crash came between its commit and its record).
// That snapshot may be one containerd's unpacker committed (chainKey): it
// is used as it is, never extracted a second time, since containerd's
// metadata store adopts the chains built on it. A chain whose device
// vanished from the pool is rebuilt: extracted again and put in place of
// the lost device (Recommit), so that nothing above it (later layers,
// containers) is touched.
func (p *Pipelines) checkUnpacked(ctx context.Context, req *upReq) (*upResp, error) {
	p.hook("check-unpacked:started")
	r := req.Msg
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMUnpack, State: "check-unpacked"})
	ch, err := RecordsOf(p.db).GetChain(ctx, r.ChainID)
	if err != nil {
		return nil, err
	}
	exists, err := p.opts.Snapshots.Exists(ctx, r.ChainID)
	if err != nil {
		return nil, err
	}
	key := r.ChainID
	if !exists {
		if key, err = p.chainKey(ctx, r.ChainID); err != nil {
			return nil, err
		}
	}
	alive := false
	var id uint32
	if key != "" {
		if alive, id, err = p.deviceAlive(ctx, key); err != nil {
			return nil, err
		}
	}
	if key != "" && alive {
		name, _, _, err := p.opts.Snapshots.DeviceOf(ctx, key)
		if err != nil {
			return nil, err
		}
		if ch == nil {
			// Committed but not recorded (a crash inside update-db, or a
			// chain containerd unpacked).
			if err := RecordsOf(p.db).StoreChain(ctx, Chain{ChainID: r.ChainID, ParentChainID: r.ParentChainID, DiffID: r.DiffID}); err != nil {
				return nil, err
			}
			ch = &Chain{}
		}
		if key != r.ChainID {
			log.G(ctx).WithField("chain", r.ChainID).WithField("snapshot", key).Info("unpack: the chain is in the pool already, unpacked by containerd; using it")
		}
		return nil, fsm.Handoff(&UnpackResponse{ChainID: r.ChainID, DeviceID: id, DeviceName: name,
			SizeBytes: ch.SizeBytes, FileCount: int(ch.FileCount), AlreadyUnpacked: true})
	}
	if exists {
		log.G(ctx).WithField("chain", r.ChainID).Warn("unpack: the chain's thin device is gone from the pool; extracting it again to put in its place")
	} else if ch != nil && key == "" {
		// The record outlived its snapshot (removed behind it): forget it.
		if err := RecordsOf(p.db).deleteChain(ctx, r.ChainID); err != nil {
			return nil, err
		}
	}
	return fsm.NewResponse(&UnpackResponse{ChainID: r.ChainID, ExtractKey: extractKey(r.ChainID)}), nil
}

// discardExtract removes the extraction snapshot of chain, if any (a
// failed or interrupted attempt's half-made device).
func (p *Pipelines) discardExtract(ctx context.Context, chain string) error {
	return p.discardKey(ctx, extractKey(chain))
}

// discardKey removes extraction snapshot key (a chain's or a stream
// extraction's) and its mount point, if any.
func (p *Pipelines) discardKey(ctx context.Context, key string) error {
	ctx = context.WithoutCancel(ctx)
	p.madeHere.Delete(key)
	_ = unmountDir(p.mountDirOf(key))
	if err := p.opts.Snapshots.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove extraction snapshot %s: %w", key, err)
	}
	if err := p.opts.Snapshots.Cleanup(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("unpack: cleanup of the extraction snapshot")
	}
	return nil
}

// discardUnpack removes what an unpack run may have made: its chain's
// extraction snapshot and the stream extraction it adopted, if any.
func (p *Pipelines) discardUnpack(ctx context.Context, req *upReq) error {
	var errs []error
	if k := req.Resp.ExtractKey; strings.HasPrefix(k, streamPrefix) {
		errs = append(errs, p.discardKey(ctx, k))
	}
	errs = append(errs, p.discardExtract(ctx, req.Msg.ChainID))
	return errors.Join(errs...)
}

// mountDir is where chain's extraction snapshot is mounted.
func (p *Pipelines) mountDir(chain string) string { return p.mountDirOf(extractKey(chain)) }

// mountDirOf is where extraction snapshot key is mounted.
func (p *Pipelines) mountDirOf(key string) string {
	return filepath.Join(p.opts.MountDir, strings.TrimPrefix(key, extractPrefix)[:24])
}

// failUnpack is every non-success exit of the unpack transitions after
// create-device: remove what was made.
func (p *Pipelines) failUnpack(ctx context.Context, req *upReq, cause error) error {
	if derr := p.discardUnpack(ctx, req); derr != nil {
		log.G(ctx).WithError(derr).Error("unpack: removing the half-made device")
		if !fsm.IsAbort(cause) {
			return errors.Join(cause, derr)
		}
	}
	return cause
}

// createDevice: Prepare the extraction snapshot on the parent
// chain; one an interrupted attempt left is removed first.
func (p *Pipelines) createDevice(ctx context.Context, req *upReq) (*upResp, error) {
	p.hook("create-device:started")
	r, resp := req.Msg, req.Resp
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMUnpack, State: "create-device"})
	if err := p.discardExtract(ctx, r.ChainID); err != nil {
		return nil, err
	}
	// The layer may have been extracted while it downloaded (in this
	// process): that extraction's snapshot, on the same parent, is the
	// device.
	if dlRec, err := fsm.PredecessorRun(req.Run, api.FSMDownload); err == nil {
		dl, err := fsm.PredecessorResponse[DownloadResponse](req.Run, api.FSMDownload)
		if err != nil {
			return nil, p.failUnpack(ctx, req, fsm.Abort(err))
		}
		s, err := p.adoptStream(ctx, dlRec.IdempotencyID, r.ParentChainID, dl)
		if err != nil {
			return nil, err
		}
		if s != nil {
			return p.adoptExtraction(ctx, req, s)
		}
	}
	if err := p.prepareExtract(ctx, r, resp); err != nil {
		if errors.Is(err, thinpool.ErrPoolFull) || errdefs.IsNotFound(err) {
			return nil, p.failUnpack(ctx, req, fsm.Abort(err))
		}
		return nil, err
	}
	p.madeHere.Store(resp.ExtractKey, struct{}{})
	return fsm.NewResponse(resp), nil
}

func (p *Pipelines) prepareExtract(ctx context.Context, r *UnpackRequest, resp *UnpackResponse) error {
	key := extractKey(r.ChainID)
	parent, err := p.parentKey(ctx, r.ParentChainID)
	if err != nil {
		return err
	}
	if _, err := p.opts.Snapshots.Prepare(ctx, key, parent,
		snapshots.WithLabels(map[string]string{LabelPrivate: privateExtract, LabelSource: r.S3URL})); err != nil {
		return fmt.Errorf("unpack %s: prepare %s on %q: %w", r.ChainID, key, parent, err)
	}
	name, _, id, err := p.opts.Snapshots.DeviceOf(ctx, key)
	if err != nil {
		return err
	}
	resp.ExtractKey, resp.DeviceName, resp.DeviceID = key, name, id
	return nil
}

// extractLayers: mount the extraction snapshot, extract the
// layer confined with os.Root (whiteouts, rootfs/ stripping, limits,
// progress), sync, unmount. Extraction cannot resume: an attempt after a
// failure, a crash or a stop starts again on a fresh device.
func (p *Pipelines) extractLayers(ctx context.Context, req *upReq) (_ *upResp, err error) {
	r, resp := req.Msg, req.Resp
	dl, err := fsm.PredecessorResponse[DownloadResponse](req.Run, api.FSMDownload)
	if err != nil {
		return nil, p.failUnpack(ctx, req, fsm.Abort(err))
	}
	if dl.diffID() != r.DiffID {
		return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s: download produced diff %s, the chain wants diff %s", r.ChainID, dl.diffID(), r.DiffID)))
	}
	p.hook("extract:started")
	_, fresh := p.madeHere.LoadAndDelete(resp.ExtractKey)
	if resp.Streamed && fresh {
		// create-device adopted the extraction made while the layer
		// downloaded, in this attempt.
		p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMUnpack, State: "extract-layers", Bytes: resp.SizeBytes, Files: resp.FileCount})
		return fsm.NewResponse(resp), nil
	}
	// The file data written from a plain tar is at most its size (runs of
	// zeros stay holes), so a tar within the budget cannot overrun it. A
	// compressed layer's size says nothing of what it holds: extraction
	// stops at the budget (tarball.ErrOverBudget), and its files are bound
	// by the tarball limits, not by the download's size cap.
	plain := dl.diffID() == dl.Checksum // a compressed file never hashes to its own content's digest
	limit := p.opts.MaxLayerSize
	if !plain {
		limit = 0
	}
	budget, err := p.extractBudget(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: %w", r.ChainID, err)
	}
	if plain && dl.SizeBytes > budget {
		return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s from %s: layer of %d bytes, more than the %d bytes the pool has free or pipeline.max_image_size allows", r.ChainID, r.S3URL, dl.SizeBytes, budget)))
	}
	if !fresh || resp.ExtractKey != extractKey(r.ChainID) {
		log.G(ctx).WithField("chain", r.ChainID).WithField("attempt", req.Run.Attempt).Info("unpack: discarding the extraction device of an earlier attempt or process")
		if err := p.discardUnpack(ctx, req); err != nil {
			return nil, err
		}
		resp.Streamed = false
		if err := p.prepareExtract(ctx, r, resp); err != nil {
			return nil, err
		}
	}
	ms, err := p.opts.Snapshots.Mounts(ctx, resp.ExtractKey)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: mounts of %s: %w", r.ChainID, resp.ExtractKey, err)
	}
	dir := p.mountDir(r.ChainID)
	umount, err := p.mountAt(ms, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if uerr := umount(); uerr != nil && err == nil {
			err = fmt.Errorf("unpack %s: unmount %s: %w", r.ChainID, dir, uerr)
		}
	}()
	var src io.Reader
	if spooled, done := p.takeSpool(ctx, dl.LocalPath); spooled != nil {
		// The download kept the layer's tar stream as it validated it:
		// extracting that spares decompressing the layer again.
		defer done()
		src = spooled
		p.hook("extract:spooled")
		log.G(ctx).WithField("chain", r.ChainID).WithField("spool", spooled.Name()).Debug("unpack: extracting the tar stream spooled by the download")
	} else {
		f, err := p.openLayerFile(ctx, req, dl)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		src = f
	}
	// The events count the file content written, whose total the tar
	// does not say up front (the layer file's size is of its compressed
	// bytes), so they carry none.
	th := throttle{every: progressInterval}
	st, err := tarball.ExtractDir(ctx, src, dir, tarball.ExtractOptions{
		Limits: p.opts.Limits, StripRootfs: dl.HasRootfs, NoChown: p.opts.NoChown, MaxDataBytes: budget,
		GzipCommand: p.opts.GzipCommand,
		Progress: func(pr tarball.Progress) {
			if th.ok(false) {
				p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMUnpack, State: "extract-layers", Bytes: pr.Bytes, Files: pr.Files})
			}
			p.hook("extract:progress")
		},
	})
	if err != nil {
		if tarball.IsPermanent(err) {
			_ = umount()
			return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s from %s: %w", r.ChainID, r.S3URL, err)))
		}
		return nil, fmt.Errorf("unpack %s: extract: %w", r.ChainID, err)
	}
	if err := tarball.SyncFS(dir); err != nil {
		return nil, err
	}
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMUnpack, State: "extract-layers", Bytes: st.Bytes, Files: st.Files})
	resp.SizeBytes, resp.FileCount = st.Bytes, st.Files
	return fsm.NewResponse(resp), nil
}

// openLayerFile opens the layer file the download recorded for dl, checked
// to be the file that download verified: the open file, not the path, is
// checked and then read, so a file renamed over it later is not extracted.
// A file that no longer has its recorded size and digest (changed on disk,
// by an operator or by corruption) fails the run, and its records are
// forgotten so that the next pull downloads the object again.
func (p *Pipelines) openLayerFile(ctx context.Context, req *upReq, dl *DownloadResponse) (*os.File, error) {
	r := req.Msg
	b, err := RecordsOf(p.db).LayerFile(ctx, dl.Checksum)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: %w", r.ChainID, err)
	}
	if b == nil {
		return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s from %s: layer file %s has no record any more: it was forgotten after its download; pull again to download it",
			r.ChainID, r.S3URL, dl.LocalPath)))
	}
	f, err := os.Open(b.Path)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: open layer file: %w", r.ChainID, err)
	}
	ok, err := p.verifyOpenLayerFile(ctx, f, b)
	if err == nil && ok {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err == nil && !ok {
		f.Close()
		if err := RecordsOf(p.db).forgetLayer(ctx, b.Digest); err != nil {
			return nil, fmt.Errorf("unpack %s: %w", r.ChainID, err)
		}
		return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s from %s: layer file %s no longer has the size %d and digest %s its download verified: it changed on disk; pull again to download it",
			r.ChainID, r.S3URL, b.Path, b.SizeBytes, b.Digest)))
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("unpack %s: %w", r.ChainID, err)
	}
	return f, nil
}

// extractBudget is the most file content one extraction may write: the
// pool's free data space, and limit when it is positive. A pool with no
// free space (PoolFree leaves out the reserve: a pool at it has none) is
// a budget of one byte, which refuses any file data: the extractor reads
// a budget of 0 as no limit.
func (p *Pipelines) extractBudget(ctx context.Context, limit int64) (int64, error) {
	budget := limit
	if p.opts.PoolFree != nil {
		free, err := p.opts.PoolFree(ctx)
		if err != nil {
			return 0, fmt.Errorf("free space of the pool: %w", err)
		}
		if budget <= 0 || free < budget {
			budget = max(free, 1)
		}
	}
	return budget, nil
}

// adoptExtraction makes stream extraction s the unpack run's extraction
// snapshot, for extract-layers, verify-layout and update-db.
func (p *Pipelines) adoptExtraction(ctx context.Context, req *upReq, s *streamExtraction) (*upResp, error) {
	r, resp := req.Msg, req.Resp
	name, _, id, err := p.opts.Snapshots.DeviceOf(ctx, s.key)
	if err != nil {
		_ = p.discardKey(ctx, s.key)
		return nil, fmt.Errorf("unpack %s: device of %s: %w", r.ChainID, s.key, err)
	}
	resp.ExtractKey, resp.DeviceName, resp.DeviceID, resp.Streamed = s.key, name, id, true
	p.madeHere.Store(s.key, struct{}{})
	resp.SizeBytes, resp.FileCount = s.stats.Bytes, s.stats.Files
	log.G(ctx).WithField("chain", r.ChainID).WithField("snapshot", s.key).Debug("unpack: adopted the extraction made while downloading")
	return fsm.NewResponse(resp), nil
}

// verifyLayout: the chain's root must be a readable directory (the image's
// layout is checked on its activation, which is the image whole; a chain
// may be the top of one image and a lower layer of another). A violation
// removes the device and aborts.
func (p *Pipelines) verifyLayout(ctx context.Context, req *upReq) (_ *upResp, err error) {
	p.hook("verify-layout:started")
	r, resp := req.Msg, req.Resp
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMUnpack, State: "verify-layout", Files: resp.FileCount, Bytes: resp.SizeBytes})
	ms, err := p.opts.Snapshots.Mounts(ctx, resp.ExtractKey)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s: extraction snapshot %s is gone", r.ChainID, resp.ExtractKey)))
		}
		return nil, err
	}
	dir := p.mountDir(r.ChainID)
	umount, err := p.mountAt(ms, dir)
	if err != nil {
		return nil, err
	}
	var verr error
	if fi, serr := os.Stat(dir); serr != nil {
		verr = fmt.Errorf("root of %s: %w", resp.ExtractKey, serr)
	} else if !fi.IsDir() {
		verr = fmt.Errorf("root of %s is not a directory", resp.ExtractKey)
	}
	if uerr := umount(); uerr != nil {
		return nil, fmt.Errorf("unpack %s: unmount %s: %w", r.ChainID, dir, uerr)
	}
	if verr != nil {
		log.G(ctx).WithField("chain", r.ChainID).WithError(verr).Warn("security: unpacked layout rejected")
		return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s from %s: %w", r.ChainID, r.S3URL, verr)))
	}
	return fsm.NewResponse(resp), nil
}

// updateDB: commit the extraction snapshot as the chain ID (labels: diff
// ID, source, snapshot.ref), or put its device in place of a committed
// chain's lost one, then record the chain.
func (p *Pipelines) updateDB(ctx context.Context, req *upReq) (*upResp, error) {
	p.hook("update-db:started")
	r, resp := req.Msg, req.Resp
	exists, err := p.opts.Snapshots.Exists(ctx, r.ChainID)
	if err != nil {
		return nil, err
	}
	extracting, err := p.opts.Snapshots.Exists(ctx, resp.ExtractKey)
	if err != nil {
		return nil, err
	}
	switch {
	case exists && extracting:
		if err := p.opts.Snapshots.Recommit(ctx, r.ChainID, resp.ExtractKey); err != nil {
			if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) {
				return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s: rebuild: %w", r.ChainID, err)))
			}
			return nil, err
		}
	case !exists:
		// snapshot.ref = the chain ID lets containerd's unpacker adopt this
		// snapshot (see containerd.go).
		chainLabels := map[string]string{labels.LabelUncompressed: r.DiffID, LabelSource: r.S3URL, snapshots.LabelSnapshotRef: r.ChainID}
		if err := p.opts.Snapshots.Commit(ctx, r.ChainID, resp.ExtractKey, snapshots.WithLabels(chainLabels)); err != nil {
			if errdefs.IsNotFound(err) {
				return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s: commit: %w", r.ChainID, err)))
			}
			return nil, err
		}
	}
	if err := RecordsOf(p.db).StoreChain(ctx, Chain{ChainID: r.ChainID, ParentChainID: r.ParentChainID, DiffID: r.DiffID,
		SizeBytes: resp.SizeBytes, FileCount: int64(resp.FileCount)}); err != nil {
		return nil, err
	}
	name, _, id, err := p.opts.Snapshots.DeviceOf(ctx, r.ChainID)
	if err != nil {
		return nil, err
	}
	out := &UnpackResponse{ChainID: r.ChainID, DeviceID: id, DeviceName: name, SizeBytes: resp.SizeBytes, FileCount: resp.FileCount, Unpacked: true, Streamed: resp.Streamed}
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMUnpack, State: "complete", Files: out.FileCount, Bytes: out.SizeBytes})
	return fsm.NewResponse(out), nil
}

// unmountDir unmounts everything mounted at dir and removes dir. A mount
// that something still holds (a process with a file open in it) is
// detached lazily rather than left in place: its callers go on to remove
// the snapshot under it, and once no record names the snapshot nothing
// would ever unmount it, so its device could never be deleted. Detached,
// the device stays busy only until the holder lets go; the snapshotter's
// Cleanup, and its reconciliation at start-up, retry a removed device
// they could not unmap.
func unmountDir(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	for i := 0; i < 8; i++ {
		err := unix.Unmount(dir, 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(dir, unix.MNT_DETACH)
		}
		if err != nil {
			break
		}
	}
	return os.Remove(dir)
}
