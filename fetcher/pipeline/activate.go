package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

func withNamespace(ctx context.Context, ns string) context.Context {
	return namespaces.WithNamespace(ctx, ns)
}

// Layer is one layer of a pulled image.
type Layer struct {
	Key     string `json:"key"`
	Size    int64  `json:"size"`
	ETag    string `json:"etag,omitempty"`
	DiffID  string `json:"diff_id,omitempty"`
	ChainID string `json:"chain_id,omitempty"`
}

// ActivateRequest is one "activate-image" run (seed 004's
// ImageActivateRequest): the image and the top of its unpacked chain.
type ActivateRequest struct {
	ImageID    string  `json:"image_id"` // images row carrying the activation
	Source     string  `json:"source"`   // s3://bucket/key-or-prefix
	Ref        string  `json:"ref"`
	TopChainID string  `json:"top_chain_id"`
	Layers     []Layer `json:"layers"`
}

// ActivateResponse is what the run produced (seed 004's
// ImageActivateResponse).
type ActivateResponse struct {
	ImageID        string `json:"image_id"`
	SnapshotID     string `json:"snapshot_id"`
	SnapshotName   string `json:"snapshot_name"` // also the active snapshot's key
	DevicePath     string `json:"device_path"`
	OriginDeviceID string `json:"origin_device_id"`
	Active         bool   `json:"active"`
	Activated      bool   `json:"activated"` // false when it already was
	Registered     bool   `json:"registered"`
}

// Registrar registers an activated image somewhere else (containerd).
type Registrar interface {
	// Register makes ref an image whose rootfs is the layers' diff IDs.
	Register(ctx context.Context, ref string, diffIDs []string) error
	// Registered reports whether ref is registered with topChain as its
	// unpacked chain (true when there is nowhere to register).
	Registered(ctx context.Context, ref, topChain string) (bool, error)
}

type acReq = fsm.Request[ActivateRequest, ActivateResponse]
type acResp = fsm.Response[ActivateResponse]

func (p *Pipelines) buildActivate(ctx context.Context) (fsm.StartFunc[ActivateRequest], error) {
	start, _, err := fsm.Register[ActivateRequest, ActivateResponse](p.m, FSMActivate).
		Start("check-snapshot", p.checkSnapshot, p.retry(fsm.ExponentialBackoff(3))).
		To("create-snapshot", p.createSnapshot, p.retry(fsm.FixedRetry(3, fixedDelay))).
		To("register", p.register, p.retry(fsm.ExponentialJitter(5))).
		End("complete").
		Build(ctx)
	return start, err
}

// SnapshotName is seed 001's deterministic name of image imageID's active
// snapshot (and its key in the snapshotter).
func SnapshotName(imageID string) string { return "snap-" + imageID }

// originOf returns the device id of the top chain's unpacked record.
func (p *Pipelines) originOf(ctx context.Context, chain string) (*metadata.UnpackedImage, error) {
	ch, err := p.db.GetChain(ctx, chain)
	if err != nil {
		return nil, err
	}
	if ch == nil {
		return nil, fsm.Abort(fmt.Errorf("activate: chain %s is not unpacked", chain))
	}
	u, err := p.db.CheckImageUnpacked(ctx, ch.ImageID)
	if err != nil {
		return nil, err
	}
	if u == nil {
		return nil, fsm.Abort(fmt.Errorf("activate: chain %s has no unpacked record", chain))
	}
	return u, nil
}

// checkSnapshot (seed 004/001): an active snapshot row whose snapshot and
// device exist on the right origin hands off, its device mapped again if
// only the mapping was removed; a stale one is removed.
func (p *Pipelines) checkSnapshot(ctx context.Context, req *acReq) (*acResp, error) {
	r := req.Msg
	p.hub.emit(Event{Run: req.Run.ID, FSM: FSMActivate, State: "check-snapshot"})
	if err := p.ensureImageRow(ctx, r); err != nil {
		return nil, err
	}
	origin, err := p.originOf(ctx, r.TopChainID)
	if err != nil {
		return nil, err
	}
	name := SnapshotName(r.ImageID)
	sn, err := p.db.CheckSnapshotExists(ctx, r.ImageID, name)
	if err != nil {
		return nil, err
	}
	sctx := p.snCtx(ctx)
	alive, _, err := p.deviceAlive(ctx, name)
	if err != nil {
		return nil, err
	}
	parentOK := false
	if alive {
		info, err := p.opts.Snapshots.Stat(sctx, name)
		if err != nil {
			return nil, err
		}
		parentOK = info.Parent == r.TopChainID && info.Kind == snapshots.KindActive
	}
	if sn != nil && sn.Active && alive && parentOK && sn.OriginDeviceID == origin.DeviceID {
		_, path, _, err := p.opts.Snapshots.DeviceOf(sctx, name)
		if err != nil {
			return nil, err
		}
		if lerr := p.deviceLive(path); lerr != nil {
			// The thin device is there but its mapping was removed behind
			// our back (`dmsetup remove`): map it again (Mounts activates).
			log.G(ctx).WithField("snapshot", name).WithError(lerr).Warn("activate: active snapshot's device is not mapped; activating it again")
			if _, err := p.opts.Snapshots.Mounts(sctx, name); err != nil {
				return nil, fmt.Errorf("activate %s: map %s again: %w", r.Ref, path, err)
			}
		}
		return nil, fsm.Handoff(&ActivateResponse{ImageID: r.ImageID, SnapshotID: sn.SnapshotID, SnapshotName: name,
			DevicePath: path, OriginDeviceID: origin.DeviceID, Active: true})
	}
	if sn != nil {
		log.G(ctx).WithField("snapshot", name).Warn("activate: recorded snapshot is missing or stale; re-creating it")
		if err := p.db.DeleteSnapshotByName(ctx, name); err != nil {
			return nil, err
		}
	}
	if exists, err := p.opts.Snapshots.Exists(sctx, name); err != nil {
		return nil, err
	} else if exists && (!alive || !parentOK) {
		if err := p.removeTree(ctx, name); err != nil {
			return nil, err
		}
	}
	return fsm.NewResponse(&ActivateResponse{ImageID: r.ImageID, SnapshotName: name, OriginDeviceID: origin.DeviceID}), nil
}

// ensureImageRow makes the images row of a multi-layer image (a prefix has
// no object of its own; a one-key image is its layer's row).
func (p *Pipelines) ensureImageRow(ctx context.Context, r *ActivateRequest) error {
	if _, err := p.db.GetImageByID(ctx, r.ImageID); err == nil {
		return nil
	} else if !errors.Is(err, metadata.ErrNotFound) {
		return err
	}
	var size int64
	for _, l := range r.Layers {
		size += l.Size
	}
	return p.db.StoreImageMetadata(ctx, r.ImageID, r.Source, "", r.TopChainID, size)
}

// createSnapshot (seed 004): Prepare the image's active snapshot on the top
// chain; one that exists already on that parent is reused.
func (p *Pipelines) createSnapshot(ctx context.Context, req *acReq) (*acResp, error) {
	r, resp := req.Msg, req.Resp
	p.hub.emit(Event{Run: req.Run.ID, FSM: FSMActivate, State: "create-snapshot"})
	sctx := p.snCtx(ctx)
	_, err := p.opts.Snapshots.Prepare(sctx, resp.SnapshotName, r.TopChainID,
		snapshots.WithLabels(map[string]string{LabelPrivate: privateActivation, LabelSource: r.Source}))
	switch {
	case err == nil:
		resp.Activated = true
	case errdefs.IsAlreadyExists(err):
		info, serr := p.opts.Snapshots.Stat(sctx, resp.SnapshotName)
		if serr != nil {
			return nil, serr
		}
		if info.Parent != r.TopChainID {
			return nil, fsm.Abort(fmt.Errorf("activate %s: snapshot %s exists on %q, not on %s", r.Ref, resp.SnapshotName, info.Parent, r.TopChainID))
		}
	case errors.Is(err, thinpool.ErrPoolFull) || errdefs.IsNotFound(err):
		return nil, fsm.Abort(fmt.Errorf("activate %s: %w", r.Ref, err))
	default:
		return nil, err
	}
	_, path, _, err := p.opts.Snapshots.DeviceOf(sctx, resp.SnapshotName)
	if err != nil {
		return nil, err
	}
	resp.DevicePath = path
	return fsm.NewResponse(resp), nil
}

// register (seed 004): the seed's register transaction (snapshot row and
// image active, together), then the containerd image when configured.
func (p *Pipelines) register(ctx context.Context, req *acReq) (*acResp, error) {
	r, resp := req.Msg, req.Resp
	p.hub.emit(Event{Run: req.Run.ID, FSM: FSMActivate, State: "register"})
	id := resp.OriginDeviceID + "-snap"
	owner, err := p.db.SnapshotIDOwner(ctx, id)
	if err != nil {
		return nil, err
	}
	if owner != "" && owner != r.ImageID {
		// Another image has the same top chain: seed 001's id would clash.
		id = resp.OriginDeviceID + "-snap-" + r.ImageID
	}
	if err := p.db.RegisterActivation(ctx, metadata.SnapshotRecord{ImageID: r.ImageID, SnapshotID: id,
		SnapshotName: resp.SnapshotName, DevicePath: resp.DevicePath, OriginDeviceID: resp.OriginDeviceID}); err != nil {
		return nil, err
	}
	resp.SnapshotID, resp.Active = id, true
	if p.opts.Registrar != nil && r.Ref != "" {
		diffs := make([]string, len(r.Layers))
		for i, l := range r.Layers {
			diffs[i] = l.DiffID
		}
		if err := p.opts.Registrar.Register(ctx, r.Ref, diffs); err != nil {
			return nil, fmt.Errorf("activate %s: register in containerd: %w", r.Ref, err)
		}
		resp.Registered = true
	}
	return fsm.NewResponse(resp), nil
}
