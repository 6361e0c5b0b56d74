package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// ChainID is the OCI chain ID of a layer whose parent chain is parent (""
// for the first layer) and whose diff ID is diffID.
func ChainID(parent, diffID string) string {
	if parent == "" {
		return diffID
	}
	sum := sha256.Sum256([]byte(parent + " " + diffID))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Labels the pipeline puts on the committed chain snapshots.
const (
	// LabelUncompressed is containerd's label naming a layer's diff ID.
	LabelUncompressed = "containerd.io/uncompressed"
	// LabelSource names the S3 object the layer came from.
	LabelSource = "flyio.io/s3-source"
)

// UnpackRequest is one "unpack-image" run: the layer at one chain position
// (seed 004's ImageUnpackRequest keyed by chain ID). LocalPath and the
// digest come from the run-after Download run.
type UnpackRequest struct {
	ChainID       string `json:"chain_id"`
	ParentChainID string `json:"parent_chain_id"`
	DiffID        string `json:"diff_id"`
	ImageID       string `json:"image_id"` // the layer's images row (holds the unpacked record)
	S3URL         string `json:"s3_url"`
	Top           bool   `json:"top"` // top of the image: verify-layout checks the full layout
}

// UnpackResponse is what the run produced (seed 004's ImageUnpackResponse).
type UnpackResponse struct {
	ChainID         string `json:"chain_id"`
	ImageID         string `json:"image_id"`
	ExtractKey      string `json:"extract_key,omitempty"`
	DeviceID        string `json:"device_id"`
	DeviceName      string `json:"device_name"`
	DevicePath      string `json:"device_path"`
	SizeBytes       int64  `json:"size_bytes"`
	FileCount       int    `json:"file_count"`
	Unpacked        bool   `json:"unpacked"`
	AlreadyUnpacked bool   `json:"already_unpacked"`
}

type upReq = fsm.Request[UnpackRequest, UnpackResponse]
type upResp = fsm.Response[UnpackResponse]

func (p *Pipelines) buildUnpack(ctx context.Context) (fsm.StartFunc[UnpackRequest], error) {
	start, _, err := fsm.Register[UnpackRequest, UnpackResponse](p.m, FSMUnpack).
		Start("check-unpacked", p.checkUnpacked, p.retry(fsm.ExponentialBackoff(3))).
		To("create-device", p.createDevice, p.retry(fsm.FixedRetry(3, fixedDelay))).
		To("extract-layers", p.extractLayers, fsm.WithTimeout(p.opts.ExtractTimeout), p.retry(fsm.FixedRetry(2, fixedDelay))).
		To("verify-layout", p.verifyLayout, p.retry(fsm.FixedRetry(2, fixedDelay))).
		To("update-db", p.updateDB, p.retry(fsm.ExponentialBackoff(5))).
		End("complete").
		Build(ctx)
	return start, err
}

// extractKey is the active snapshot a chain is extracted into.
func extractKey(chainID string) string {
	return "flyio-extract-" + strings.TrimPrefix(chainID, "sha256:")
}

// lockHolder names run runID as an image lock's holder.
func lockHolder(runID string) string { return FSMUnpack + ":" + runID }

// snCtx is ctx in the snapshots' containerd namespace.
func (p *Pipelines) snCtx(ctx context.Context) context.Context {
	return withNamespace(ctx, p.opts.Namespace)
}

// takeLock acquires chain's image lock for run runID. A lock this run
// already holds (taken before a crash) is kept; one held by a run that is no
// longer live is stale and taken over; one held by a live run (another
// process's) is a retryable error.
func (p *Pipelines) takeLock(ctx context.Context, chain, runID string) error {
	me := lockHolder(runID)
	for try := 0; try < 2; try++ {
		err := p.db.AcquireImageLock(ctx, chain, me)
		var held *metadata.LockHeldError
		if !errors.As(err, &held) {
			return err
		}
		if held.LockedBy == me {
			return nil
		}
		other, ok := strings.CutPrefix(held.LockedBy, FSMUnpack+":")
		if ok {
			if rec, rerr := p.m.Run(ctx, other); rerr == nil && !rec.State.Terminal() {
				return fmt.Errorf("unpack %s: %w", chain, err)
			}
		}
		log.G(ctx).WithField("chain", chain).WithField("holder", held.LockedBy).Warn("unpack: taking over the lock of a run that ended")
		if err := p.db.ReleaseImageLock(ctx, chain); err != nil {
			return err
		}
	}
	return fmt.Errorf("unpack %s: lock keeps being taken", chain)
}

// releaseLock drops chain's lock if run runID holds it.
func (p *Pipelines) releaseLock(ctx context.Context, chain, runID string) {
	ctx = context.WithoutCancel(ctx)
	l, err := p.db.GetImageLock(ctx, chain)
	if err == nil && l != nil && l.LockedBy == lockHolder(runID) {
		err = p.db.ReleaseImageLock(ctx, chain)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("chain", chain).Error("unpack: releasing the image lock")
	}
}

// ReleaseRunLock drops the image lock a run of "unpack-image" left, if it
// still holds it (a run that failed out of attempts cannot release it
// itself). Pull calls it for every unpack run that did not complete.
func (p *Pipelines) ReleaseRunLock(ctx context.Context, chain, runID string) {
	p.releaseLock(ctx, chain, runID)
}

// deviceAlive reports whether key's snapshot record exists and its thin
// device is in the pool.
func (p *Pipelines) deviceAlive(ctx context.Context, key string) (bool, uint32, error) {
	sctx := p.snCtx(ctx)
	ok, err := p.opts.Snapshots.Exists(sctx, key)
	if err != nil || !ok {
		return false, 0, err
	}
	_, _, id, err := p.opts.Snapshots.DeviceOf(sctx, key)
	if err != nil {
		return false, 0, err
	}
	alive, err := p.opts.ThinExists(ctx, id)
	return alive, id, err
}

// checkUnpacked (seed 004/001): take the lock; a recorded chain whose
// snapshot and device exist hands off; a record whose device vanished is
// healed (the snapshots on it and the stale rows removed) and unpacked
// again.
func (p *Pipelines) checkUnpacked(ctx context.Context, req *upReq) (_ *upResp, err error) {
	r := req.Msg
	p.hub.emit(Event{Run: req.Run.ID, FSM: FSMUnpack, State: "check-unpacked"})
	if err := p.takeLock(ctx, r.ChainID, req.Run.ID); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && (fsm.IsHandoff(err) || fsm.IsAbort(err)) {
			p.releaseLock(ctx, r.ChainID, req.Run.ID)
		}
	}()
	ch, err := p.db.GetChain(ctx, r.ChainID)
	if err != nil {
		return nil, err
	}
	alive, id, err := p.deviceAlive(ctx, r.ChainID)
	if err != nil {
		return nil, err
	}
	if ch != nil {
		u, err := p.db.CheckImageUnpacked(ctx, ch.ImageID)
		if err != nil {
			return nil, err
		}
		if u != nil && u.LayoutVerified && alive && u.DeviceID == strconv.FormatUint(uint64(id), 10) {
			return nil, fsm.Handoff(&UnpackResponse{ChainID: r.ChainID, ImageID: ch.ImageID, DeviceID: u.DeviceID,
				DeviceName: u.DeviceName, DevicePath: u.DevicePath, SizeBytes: u.SizeBytes, FileCount: int(u.FileCount), AlreadyUnpacked: true})
		}
	}
	exists, err := p.opts.Snapshots.Exists(p.snCtx(ctx), r.ChainID)
	if err != nil {
		return nil, err
	}
	if ch == nil && exists && alive {
		// Committed but not recorded (a crash inside update-db): record it.
		resp, err := p.recordChain(ctx, r, 0, 0)
		if err != nil {
			return nil, err
		}
		resp.AlreadyUnpacked = true
		return nil, fsm.Handoff(resp)
	}
	if ch != nil || exists {
		log.G(ctx).WithField("chain", r.ChainID).WithField("device_alive", alive).Warn("unpack: recorded chain has lost its device; removing the stale records and unpacking again")
		if err := p.removeTree(ctx, r.ChainID); err != nil {
			return nil, err
		}
		if err := p.db.DeleteChain(ctx, r.ChainID); err != nil {
			return nil, err
		}
	}
	return fsm.NewResponse(&UnpackResponse{ChainID: r.ChainID, ImageID: r.ImageID, ExtractKey: extractKey(r.ChainID)}), nil
}

// removeTree removes snapshot key and every snapshot above it, children
// first, and deletes their devices (Cleanup). Seed snapshot and chain rows
// of the removed snapshots go too.
func (p *Pipelines) removeTree(ctx context.Context, key string) error {
	sctx := p.snCtx(ctx)
	var children []string
	err := p.opts.Snapshots.Walk(sctx, func(_ context.Context, info snapshots.Info) error {
		children = append(children, info.Name)
		return nil
	}, fmt.Sprintf(`parent==%q`, key))
	if err != nil {
		return fmt.Errorf("remove snapshots above %s: %w", key, err)
	}
	for _, c := range children {
		if err := p.removeTree(ctx, c); err != nil {
			return err
		}
		if err := p.db.DeleteChain(ctx, c); err != nil {
			return err
		}
		if err := p.db.DeleteSnapshotByName(ctx, c); err != nil {
			return err
		}
	}
	if err := p.opts.Snapshots.Remove(sctx, key); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove snapshot %s: %w", key, err)
	}
	if err := p.opts.Snapshots.Cleanup(sctx); err != nil {
		log.G(ctx).WithError(err).Warn("unpack: cleanup after removing snapshots")
	}
	return nil
}

// discardExtract removes the extraction snapshot of chain, if any (a
// failed or interrupted attempt's half-made device).
func (p *Pipelines) discardExtract(ctx context.Context, chain string) error {
	ctx = context.WithoutCancel(ctx)
	key := extractKey(chain)
	_ = unmountDir(p.mountDir(chain))
	sctx := p.snCtx(ctx)
	if err := p.opts.Snapshots.Remove(sctx, key); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove extraction snapshot %s: %w", key, err)
	}
	if err := p.opts.Snapshots.Cleanup(sctx); err != nil {
		log.G(ctx).WithError(err).Warn("unpack: cleanup of the extraction snapshot")
	}
	return nil
}

func (p *Pipelines) mountDir(chain string) string {
	return filepath.Join(p.opts.MountDir, strings.TrimPrefix(chain, "sha256:")[:24])
}

// failUnpack is every non-success exit of the unpack transitions after
// create-device: remove what was made; Abort and the last attempt also
// release the lock.
func (p *Pipelines) failUnpack(ctx context.Context, req *upReq, cause error) error {
	if derr := p.discardExtract(ctx, req.Msg.ChainID); derr != nil {
		log.G(ctx).WithError(derr).Error("unpack: removing the half-made device")
		if !fsm.IsAbort(cause) {
			return errors.Join(cause, derr)
		}
	}
	if fsm.IsAbort(cause) || fsm.IsUnrecoverable(cause) {
		p.releaseLock(ctx, req.Msg.ChainID, req.Run.ID)
	}
	return cause
}

// createDevice (seed 004): Prepare the extraction snapshot on the parent
// chain; one an interrupted attempt left is removed first.
func (p *Pipelines) createDevice(ctx context.Context, req *upReq) (*upResp, error) {
	r, resp := req.Msg, req.Resp
	p.hub.emit(Event{Run: req.Run.ID, FSM: FSMUnpack, State: "create-device"})
	if err := p.discardExtract(ctx, r.ChainID); err != nil {
		return nil, err
	}
	if err := p.prepareExtract(ctx, r, resp); err != nil {
		if errors.Is(err, thinpool.ErrPoolFull) || errdefs.IsNotFound(err) {
			return nil, p.failUnpack(ctx, req, fsm.Abort(err))
		}
		return nil, err
	}
	return fsm.NewResponse(resp), nil
}

func (p *Pipelines) prepareExtract(ctx context.Context, r *UnpackRequest, resp *UnpackResponse) error {
	sctx := p.snCtx(ctx)
	key := extractKey(r.ChainID)
	if _, err := p.opts.Snapshots.Prepare(sctx, key, r.ParentChainID,
		snapshots.WithLabels(map[string]string{LabelPrivate: privateExtract, LabelSource: r.S3URL})); err != nil {
		return fmt.Errorf("unpack %s: prepare %s on %q: %w", r.ChainID, key, r.ParentChainID, err)
	}
	name, path, id, err := p.opts.Snapshots.DeviceOf(sctx, key)
	if err != nil {
		return err
	}
	resp.ExtractKey, resp.DeviceName, resp.DevicePath, resp.DeviceID = key, name, path, strconv.FormatUint(uint64(id), 10)
	return nil
}

// extractLayers (seed 004): mount the extraction snapshot, extract the
// layer confined with os.Root (whiteouts, rootfs/ stripping, limits,
// progress), sync, unmount. Extraction cannot resume: an attempt after a
// crash or a failure starts again on a fresh device.
func (p *Pipelines) extractLayers(ctx context.Context, req *upReq) (_ *upResp, err error) {
	r, resp := req.Msg, req.Resp
	dl, err := fsm.PredecessorResponse[DownloadResponse](req.Run, FSMDownload)
	if err != nil {
		return nil, p.failUnpack(ctx, req, fsm.Abort(err))
	}
	if dl.Checksum != r.DiffID {
		return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s: download produced %s, the chain wants diff %s", r.ChainID, dl.Checksum, r.DiffID)))
	}
	// The file data written is at most the tarball's size (runs of zeros
	// stay holes), so a tarball within the budget cannot overrun it.
	budget := p.opts.MaxLayerSize
	if p.opts.PoolFree != nil {
		free, err := p.opts.PoolFree(ctx)
		if err != nil {
			return nil, fmt.Errorf("unpack %s: free space of the pool: %w", r.ChainID, err)
		}
		budget = min(budget, free)
	}
	if dl.SizeBytes > budget {
		return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s from %s: layer of %d bytes, more than the %d bytes the pool has free or pipeline.max_image_size allows", r.ChainID, r.S3URL, dl.SizeBytes, budget)))
	}
	if req.Run.Attempt > 1 {
		log.G(ctx).WithField("chain", r.ChainID).WithField("attempt", req.Run.Attempt).Info("unpack: discarding the partial extraction of an earlier attempt")
		if err := p.discardExtract(ctx, r.ChainID); err != nil {
			return nil, err
		}
		if err := p.prepareExtract(ctx, r, resp); err != nil {
			return nil, err
		}
	}
	sctx := p.snCtx(ctx)
	ms, err := p.opts.Snapshots.Mounts(sctx, resp.ExtractKey)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: mounts of %s: %w", r.ChainID, resp.ExtractKey, err)
	}
	dir := p.mountDir(r.ChainID)
	umount, err := mountAll(ms, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if uerr := umount(); uerr != nil && err == nil {
			err = fmt.Errorf("unpack %s: unmount %s: %w", r.ChainID, dir, uerr)
		}
		if err != nil && !fsm.IsAbort(err) {
			// The next attempt starts on a fresh device anyway; make sure
			// the lock is released if this was the last one.
			if req.Run.Attempt >= 2 {
				err = p.failUnpack(ctx, req, err)
			}
		}
	}()
	f, err := os.Open(dl.LocalPath)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: open %s: %w", r.ChainID, dl.LocalPath, err)
	}
	defer f.Close()
	p.hook("extract:started")
	th := throttle{every: progressInterval}
	st, err := tarball.ExtractDir(ctx, f, dir, tarball.ExtractOptions{
		Limits: p.opts.Limits, StripRootfs: dl.HasRootfs, NoChown: p.opts.NoChown, MaxDataBytes: budget,
		Progress: func(pr tarball.Progress) {
			if th.ok(false) {
				p.hub.emit(Event{Run: req.Run.ID, FSM: FSMUnpack, State: "extract-layers", Bytes: pr.Bytes, Files: pr.Files, Total: dl.SizeBytes})
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
	if err := syncFS(dir); err != nil {
		return nil, err
	}
	p.hub.emit(Event{Run: req.Run.ID, FSM: FSMUnpack, State: "extract-layers", Bytes: st.Bytes, Files: st.Files, Total: dl.SizeBytes})
	resp.SizeBytes, resp.FileCount = st.Bytes, st.Files
	return fsm.NewResponse(resp), nil
}

func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// verifyLayout (seed 004): the top layer's tree must have the canonical
// layout (tarball.VerifyLayout); a lower layer only needs a readable root
// directory. A violation removes the device and aborts.
func (p *Pipelines) verifyLayout(ctx context.Context, req *upReq) (_ *upResp, err error) {
	r, resp := req.Msg, req.Resp
	p.hub.emit(Event{Run: req.Run.ID, FSM: FSMUnpack, State: "verify-layout", Files: resp.FileCount, Bytes: resp.SizeBytes})
	ms, err := p.opts.Snapshots.Mounts(p.snCtx(ctx), resp.ExtractKey)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s: extraction snapshot %s is gone", r.ChainID, resp.ExtractKey)))
		}
		return nil, err
	}
	dir := p.mountDir(r.ChainID)
	umount, err := mountAll(ms, dir)
	if err != nil {
		return nil, err
	}
	var verr error
	if r.Top {
		verr = tarball.VerifyLayoutDir(dir)
	} else if fi, serr := os.Stat(dir); serr != nil {
		verr = fmt.Errorf("root of %s: %w", resp.ExtractKey, serr)
	} else if !fi.IsDir() {
		verr = fmt.Errorf("root of %s is not a directory", resp.ExtractKey)
	}
	if uerr := umount(); uerr != nil {
		return nil, fmt.Errorf("unpack %s: unmount %s: %w", r.ChainID, dir, uerr)
	}
	var le *tarball.LayoutError
	if errors.As(verr, &le) || (verr != nil && !r.Top) {
		log.G(ctx).WithField("chain", r.ChainID).WithError(verr).Warn("security: unpacked layout rejected")
		return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s from %s: %w", r.ChainID, r.S3URL, verr)))
	}
	if verr != nil {
		return nil, verr
	}
	return fsm.NewResponse(resp), nil
}

// updateDB (seed 004): Commit the extraction snapshot as the chain ID
// (labels: diff ID, source, snapshot.ref), then record the device in
// unpacked_images and the chain, and release the lock.
func (p *Pipelines) updateDB(ctx context.Context, req *upReq) (*upResp, error) {
	r, resp := req.Msg, req.Resp
	sctx := p.snCtx(ctx)
	committed, err := p.opts.Snapshots.Exists(sctx, r.ChainID)
	if err != nil {
		return nil, err
	}
	if !committed {
		// snapshot.ref = the chain ID lets containerd's unpacker adopt this
		// snapshot (see containerd.go).
		labels := map[string]string{LabelUncompressed: r.DiffID, LabelSource: r.S3URL, snapshots.LabelSnapshotRef: r.ChainID}
		if err := p.opts.Snapshots.Commit(sctx, r.ChainID, resp.ExtractKey, snapshots.WithLabels(labels)); err != nil {
			if errdefs.IsNotFound(err) {
				return nil, p.failUnpack(ctx, req, fsm.Abort(fmt.Errorf("unpack %s: commit: %w", r.ChainID, err)))
			}
			return nil, err
		}
	}
	out, err := p.recordChain(ctx, r, resp.SizeBytes, resp.FileCount)
	if err != nil {
		if errors.Is(err, metadata.ErrInvalidArgument) {
			return nil, fsm.Abort(err)
		}
		return nil, err
	}
	out.Unpacked = true
	p.releaseLock(ctx, r.ChainID, req.Run.ID)
	p.hub.emit(Event{Run: req.Run.ID, FSM: FSMUnpack, State: "complete", Files: out.FileCount, Bytes: out.SizeBytes})
	return fsm.NewResponse(out), nil
}

// recordChain writes the unpacked_images and pipeline_chains rows of the
// committed chain snapshot.
func (p *Pipelines) recordChain(ctx context.Context, r *UnpackRequest, size int64, files int) (*UnpackResponse, error) {
	name, path, id, err := p.opts.Snapshots.DeviceOf(p.snCtx(ctx), r.ChainID)
	if err != nil {
		return nil, err
	}
	rec := metadata.UnpackedImageRecord{ImageID: r.ImageID, DeviceID: strconv.FormatUint(uint64(id), 10),
		DeviceName: name, DevicePath: path, SizeBytes: size, FileCount: int64(files)}
	if err := p.db.StoreUnpackedChain(ctx, metadata.Chain{ChainID: r.ChainID, ParentChainID: r.ParentChainID, DiffID: r.DiffID, ImageID: r.ImageID}, rec); err != nil {
		return nil, err
	}
	return &UnpackResponse{ChainID: r.ChainID, ImageID: r.ImageID, DeviceID: rec.DeviceID, DeviceName: name, DevicePath: path,
		SizeBytes: size, FileCount: files}, nil
}

func unmountDir(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	for i := 0; i < 8; i++ {
		if err := unix.Unmount(dir, 0); err != nil {
			break
		}
	}
	return os.Remove(dir)
}
