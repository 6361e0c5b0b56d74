package pipeline

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// ActivateRequest is one "activate-image" run: the image, its layers and
// the name to register it under.
type ActivateRequest struct {
	ImageID string      `json:"image_id"`
	Source  string      `json:"source"` // s3://bucket/key-or-prefix
	Ref     string      `json:"ref"`
	Layers  []api.Layer `json:"layers"`
	// Namespaces are the containerd namespaces to register Ref in; none
	// means the registrar's own.
	Namespaces []string `json:"namespaces,omitempty"`
	// Replace lets Ref move from another image of ours and repoint a
	// containerd image this daemon did not create (api.PullRequest.Replace).
	Replace bool `json:"replace,omitempty"`
}

func (r *ActivateRequest) topChain() string { return r.Layers[len(r.Layers)-1].ChainID }

// Registrar registers an activated image somewhere else (containerd). A
// containerd registrar works in the namespace ctx names
// (namespaces.WithNamespace), or in its own when ctx names none.
type Registrar interface {
	// Check is nil when ref can be registered: no image has that name
	// there, or one this daemon created, or replace. Otherwise its error
	// wraps ErrForeignImage and names the image and its owner.
	Check(ctx context.Context, ref string, replace bool) error
	// Register makes ref an image whose rootfs is the layers' diff IDs,
	// refused as Check refuses, keeping the labels of an image it
	// repoints.
	Register(ctx context.Context, ref string, diffIDs []string, replace bool) error
	// Registered reports whether ref is registered as Register would
	// leave it for diffIDs: an image this daemon created, whose rootfs is
	// those layers, unpacked (true when there is nowhere to register). A
	// name that exists but points at another image is not registered.
	Registered(ctx context.Context, ref string, diffIDs []string) (bool, error)
	// Unregister removes ref wherever it is an image this daemon created
	// (in every namespace), leaving others' images as they are; a name
	// nowhere registered, or no containerd, is not an error.
	Unregister(ctx context.Context, ref string) error
	// Namespaces lists the namespaces where ref is an image this daemon
	// created; none when it is nowhere, or there is no containerd.
	Namespaces(ctx context.Context, ref string) ([]string, error)
}

type acReq = fsm.Request[ActivateRequest, api.ActivateResponse]
type acResp = fsm.Response[api.ActivateResponse]

// LabelLayoutVerified is set on an image's activation once its layout
// passed the policy (verifyImageLayout), its value the top chain ID the
// activation was prepared on. Only an activation carrying it for the
// image's current top chain is kept by a later run; any other is removed
// and made (and checked) again.
const LabelLayoutVerified = "flyio.io/layout-verified"

// verifyPrefix starts the key of the read-only view of a new top chain
// through which an activate run checks the image's layout while the
// image's activation of its previous top chain stays in place
// (replacePrevious).
const verifyPrefix = "flyio-verify-"

// verifyKey is the key of image imageID's verification view.
func verifyKey(imageID string) string { return verifyPrefix + imageID }

func (p *Pipelines) buildActivate(ctx context.Context) (fsm.StartFunc[ActivateRequest], error) {
	start, _, err := fsm.Register[ActivateRequest, api.ActivateResponse](p.m, api.FSMActivate).
		Start("check-snapshot", p.checkSnapshot, p.retry(fsm.ExponentialBackoff(3))).
		To("create-snapshot", p.createSnapshot, p.retry(fsm.FixedRetry(3, fixedDelay))).
		To("register", p.register, p.retry(fsm.ExponentialJitter(5))).
		End("complete").
		OnFail(p.discardActivation).
		Build(ctx)
	return start, err
}

// checkSnapshot: an activation on the top chain whose device is in the
// pool and whose layout was verified for that chain (LabelLayoutVerified)
// is kept (its device mapped again if only the mapping was removed) and
// the run goes on to register the name. One on another chain that was
// verified for the chain it sits on is the image as pulled before: it
// stays, still usable, until create-snapshot has checked the new top
// (replacePrevious), so that a version refused or a device the pool
// cannot make leaves the image as it was. Any other (its device gone, its
// layout never verified: a run that failed before or during the check
// left it) is removed and made again. Nothing else is removed: a
// container's snapshot is never the activation.
func (p *Pipelines) checkSnapshot(ctx context.Context, req *acReq) (*acResp, error) {
	p.hook("check-snapshot:started")
	r := req.Msg
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMActivate, State: "check-snapshot"})
	if len(r.Layers) == 0 {
		return nil, fsm.Abort(fmt.Errorf("activate %s: no layers", r.Source))
	}
	top, err := p.parentKey(ctx, r.topChain())
	if err != nil {
		return nil, err
	}
	alive, origin, err := p.deviceAlive(ctx, top)
	if err != nil {
		return nil, err
	}
	if !alive {
		return nil, fsm.Abort(fmt.Errorf("activate %s: chain %s is not unpacked", r.Source, top))
	}
	name := ActivationKey(r.ImageID)
	resp := &api.ActivateResponse{ImageID: r.ImageID, SnapshotName: name, OriginDevice: origin}
	exists, err := p.opts.Snapshots.Exists(ctx, name)
	if err != nil || !exists {
		return fsm.NewResponse(resp), err
	}
	info, err := p.opts.Snapshots.Stat(ctx, name)
	if err != nil {
		return nil, err
	}
	alive, _, err = p.deviceAlive(ctx, name)
	if err != nil {
		return nil, err
	}
	verified := info.Labels[LabelLayoutVerified] == r.topChain()
	if _, labelled := info.Labels[LabelLayoutVerified]; !labelled && !verified {
		// An older release made activations without the label; it
		// recorded an image's layers only after checking its layout
		// through the activation, so one on the top chain the records
		// name for the image was checked. (This release labels the
		// activation before recording the image.)
		layers, err := RecordsOf(p.db).imageLayers(ctx, r.ImageID)
		if err != nil {
			return nil, err
		}
		verified = len(layers) > 0 && layers[len(layers)-1].ChainID == r.topChain()
	}
	if alive && verified && info.Parent == top && info.Kind == snapshots.KindActive {
		devName, path, _, err := p.opts.Snapshots.DeviceOf(ctx, name)
		if err != nil {
			return nil, err
		}
		if lerr := p.deviceLive(path); lerr != nil {
			// The thin device is there but its mapping was removed behind
			// our back (`dmsetup remove`): map it again (Mounts activates).
			log.G(ctx).WithField("snapshot", name).WithError(lerr).Warn("activate: the activation's device is not mapped; mapping it again")
			if _, err := p.opts.Snapshots.Mounts(ctx, name); err != nil {
				return nil, fmt.Errorf("activate %s: map %s again: %w", r.Source, path, err)
			}
		}
		resp.DeviceName, resp.DevicePath, resp.Active = devName, path, true
		return fsm.NewResponse(resp), nil
	}
	if alive && info.Parent != top && info.Kind == snapshots.KindActive {
		previous, err := p.verifiedOnParent(ctx, r.ImageID, info)
		if err != nil {
			return nil, err
		}
		if previous {
			log.G(ctx).WithField("snapshot", name).WithField("parent", info.Parent).WithField("top", top).
				Info("activate: the image's activation of its previous top chain stays until the new top's layout is verified")
			return fsm.NewResponse(resp), nil
		}
	}
	log.G(ctx).WithField("snapshot", name).WithField("parent", info.Parent).WithField("device_alive", alive).
		WithField("layout_verified", verified).Warn("activate: the activation is stale or its layout was never verified; making it again")
	if err := p.opts.Snapshots.Remove(ctx, name); err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("activate %s: remove stale activation %s: %w", r.Source, name, err)
	}
	if err := p.opts.Snapshots.Cleanup(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("activate: cleanup after removing a stale activation")
	}
	return fsm.NewResponse(resp), nil
}

// createSnapshot: Prepare the image's activation on the top chain (kept
// when check-snapshot found it in place), check the image's layout through
// it and label it verified for the top chain. An activation of the image's
// previous top chain is replaced only once the new top passed the check
// (replacePrevious); the new activation is then made labelled verified. An
// activation an interrupted attempt left on the top chain is checked
// again unless it carries the label; a verification view it left is
// removed.
func (p *Pipelines) createSnapshot(ctx context.Context, req *acReq) (*acResp, error) {
	p.hook("create-snapshot:started")
	r, resp := req.Msg, req.Resp
	if resp.Active {
		return nil, nil
	}
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMActivate, State: "create-snapshot"})
	top, err := p.parentKey(ctx, r.topChain())
	if err != nil {
		return nil, err
	}
	previous, err := p.replacePrevious(ctx, r, resp.SnapshotName, top)
	if err != nil {
		return nil, err
	}
	verified := previous != nil
	labels := map[string]string{LabelPrivate: privateActivation, LabelSource: r.Source}
	if verified {
		// The view showed the same committed chain the activation is made
		// on: its layout is the one just checked.
		labels[LabelLayoutVerified] = r.topChain()
	}
	_, err = p.opts.Snapshots.Prepare(ctx, resp.SnapshotName, top, snapshots.WithLabels(labels))
	if err != nil && previous != nil && !errdefs.IsAlreadyExists(err) {
		// The view's device goes first: the pool may have room for one
		// device and not two.
		if derr := p.discardVerifyView(ctx, r.ImageID); derr != nil {
			log.G(ctx).WithError(derr).Warn("activate: removing the verification view")
		}
		if _, err = p.opts.Snapshots.Prepare(ctx, resp.SnapshotName, top, snapshots.WithLabels(labels)); err != nil && !errdefs.IsAlreadyExists(err) {
			return nil, p.restorePrevious(ctx, r, previous, fmt.Errorf("prepare %s on the new top chain %s: %w", resp.SnapshotName, top, err))
		}
	}
	switch {
	case err == nil:
		resp.Activated = true
	case errdefs.IsAlreadyExists(err):
		info, serr := p.opts.Snapshots.Stat(ctx, resp.SnapshotName)
		if serr != nil {
			return nil, serr
		}
		if info.Parent != top {
			return nil, fsm.Abort(fmt.Errorf("activate %s: snapshot %s exists on %q, not on %s", r.Source, resp.SnapshotName, info.Parent, top))
		}
		verified = info.Labels[LabelLayoutVerified] == r.topChain()
	case errors.Is(err, thinpool.ErrPoolFull) || errdefs.IsNotFound(err):
		return nil, fsm.Abort(fmt.Errorf("activate %s: %w", r.Source, err))
	default:
		return nil, err
	}
	if !verified {
		if err := p.verifyImageLayout(ctx, r, resp.SnapshotName); err != nil {
			return nil, err
		}
		// Labelled only now: a later run keeps an activation
		// (check-snapshot) only when it carries this label, so one whose
		// check never ended is never adopted unchecked.
		if _, err := p.opts.Snapshots.Update(ctx, snapshots.Info{Name: resp.SnapshotName,
			Labels: map[string]string{LabelLayoutVerified: r.topChain()}}, "labels."+LabelLayoutVerified); err != nil {
			return nil, fmt.Errorf("activate %s: label %s verified for %s: %w", r.Source, resp.SnapshotName, r.topChain(), err)
		}
	}
	if err := p.discardVerifyView(ctx, r.ImageID); err != nil {
		return nil, fmt.Errorf("activate %s: %w", r.Source, err)
	}
	name, path, _, err := p.opts.Snapshots.DeviceOf(ctx, resp.SnapshotName)
	if err != nil {
		return nil, err
	}
	resp.DeviceName, resp.DevicePath, resp.Active = name, path, true
	return fsm.NewResponse(resp), nil
}

// replacePrevious: when image r's activation name sits on another chain
// than top (the image as pulled before, which check-snapshot kept), the
// image's layout on top is checked first, read-only, through a view of top
// (verifyKey), and that activation is removed only once the check passed.
// A layout refused or a view the pool cannot make aborts the run with the
// previous activation in place. It returns the activation it removed
// (nil when there was none to replace: top was then not checked here); the
// caller makes the new one, or the removed one again (restorePrevious),
// and removes the view once the new activation is made
// (discardVerifyView), so that the pool had room for a device until then.
// Each step finds what a crashed attempt left: a view on top is used
// again, and an attempt that finds the activation already removed makes
// and checks the new one as on a first pull.
func (p *Pipelines) replacePrevious(ctx context.Context, r *ActivateRequest, name, top string) (*snapshots.Info, error) {
	info, err := p.opts.Snapshots.Stat(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("activate %s: stat activation %s: %w", r.Source, name, err)
	}
	if info.Parent == top {
		return nil, nil
	}
	view := verifyKey(r.ImageID)
	if err := p.viewTop(ctx, r, view, top); err != nil {
		return nil, err
	}
	if err := p.verifyImageLayout(ctx, r, view); err != nil {
		return nil, err
	}
	p.hook("create-snapshot:verified")
	log.G(ctx).WithField("snapshot", name).WithField("parent", info.Parent).WithField("top", top).
		Info("activate: the new top's layout is verified; replacing the activation of the previous one")
	if err := p.opts.Snapshots.Remove(ctx, name); err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("activate %s: remove the activation %s of the previous top chain %s: %w", r.Source, name, info.Parent, err)
	}
	if err := p.opts.Snapshots.Cleanup(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("activate: cleanup after replacing an activation")
	}
	p.hook("create-snapshot:replaced")
	return &info, nil
}

// restorePrevious makes the image's activation again as it was before
// replacePrevious removed it (previous: on its chain, with its labels),
// when the new one could not be made (cause): a refused new version leaves
// the image as it was. A pool too full for the new device is most often
// too full for the old one too; the error then says the image has no
// activation until a pull makes it.
func (p *Pipelines) restorePrevious(ctx context.Context, r *ActivateRequest, previous *snapshots.Info, cause error) error {
	ctx = context.WithoutCancel(ctx)
	if _, err := p.opts.Snapshots.Prepare(ctx, previous.Name, previous.Parent, snapshots.WithLabels(previous.Labels)); err != nil && !errdefs.IsAlreadyExists(err) {
		log.G(ctx).WithError(err).WithField("snapshot", previous.Name).Error("activate: making the previous activation again")
		return fsm.Abort(fmt.Errorf("activate %s: %w; the activation %s of the previous version could not be made again either (%v): the image has none until a pull makes it",
			r.Source, cause, previous.Name, err))
	}
	log.G(ctx).WithField("snapshot", previous.Name).WithField("parent", previous.Parent).Warn("activate: the new version's activation could not be made; the previous one is made again")
	return fsm.Abort(fmt.Errorf("activate %s: %w (the image keeps its previous version)", r.Source, cause))
}

// viewTop makes view, a read-only view of top for replacePrevious; one an
// earlier attempt left on top is used again, one on another chain made
// again. A pool too full for it (or top gone) aborts the run.
func (p *Pipelines) viewTop(ctx context.Context, r *ActivateRequest, view, top string) error {
	_, err := p.opts.Snapshots.View(ctx, view, top,
		snapshots.WithLabels(map[string]string{LabelPrivate: privateVerify, LabelSource: r.Source}))
	if errdefs.IsAlreadyExists(err) {
		info, serr := p.opts.Snapshots.Stat(ctx, view)
		if serr != nil {
			return fmt.Errorf("activate %s: stat verification view %s: %w", r.Source, view, serr)
		}
		if info.Parent == top {
			return nil
		}
		if err := p.discardVerifyView(ctx, r.ImageID); err != nil {
			return fmt.Errorf("activate %s: %w", r.Source, err)
		}
		_, err = p.opts.Snapshots.View(ctx, view, top,
			snapshots.WithLabels(map[string]string{LabelPrivate: privateVerify, LabelSource: r.Source}))
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, thinpool.ErrPoolFull) || errdefs.IsNotFound(err):
		return fsm.Abort(fmt.Errorf("activate %s: view %s of the new top chain %s to check it: %w", r.Source, view, top, err))
	default:
		return fmt.Errorf("activate %s: view %s of the new top chain %s to check it: %w", r.Source, view, top, err)
	}
}

// discardVerifyView removes image imageID's verification view, if any,
// and its mount point.
func (p *Pipelines) discardVerifyView(ctx context.Context, imageID string) error {
	ctx = context.WithoutCancel(ctx)
	view := verifyKey(imageID)
	if err := unmountDir(filepath.Join(p.opts.MountDir, imageID)); err != nil {
		log.G(ctx).WithError(err).WithField("snapshot", view).Warn("activate: removing the verification view's mount point")
	}
	err := p.opts.Snapshots.Remove(ctx, view)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove verification view %s: %w", view, err)
	}
	if err := p.opts.Snapshots.Cleanup(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("activate: cleanup after removing a verification view")
	}
	return nil
}

// verifiedOnParent reports whether info, image imageID's activation, had
// its layout verified for the chain it sits on: labelled so
// (LabelLayoutVerified), or, unlabelled as an older release made it, on
// the top chain the records name for the image.
func (p *Pipelines) verifiedOnParent(ctx context.Context, imageID string, info snapshots.Info) (bool, error) {
	chain, labelled := info.Labels[LabelLayoutVerified]
	if !labelled {
		layers, err := RecordsOf(p.db).imageLayers(ctx, imageID)
		if err != nil || len(layers) == 0 {
			return false, err
		}
		chain = layers[len(layers)-1].ChainID
	}
	if chain == "" {
		return false, nil
	}
	key, err := p.parentKey(ctx, chain)
	if err != nil {
		return false, err
	}
	return key == info.Parent, nil
}

// verifyImageLayout checks the layout of the image whole, read-only
// through key (its activation, or the verification view of its new top):
// the layers of every image are checked, whichever image first made its
// chains. A violation removes key and aborts; when the removal fails the
// error is retryable (the next attempt checks and removes again, and the
// run's cleanup tries last).
func (p *Pipelines) verifyImageLayout(ctx context.Context, r *ActivateRequest, key string) error {
	ms, err := p.opts.Snapshots.Mounts(ctx, key)
	if err != nil {
		return fmt.Errorf("activate %s: mounts of %s: %w", r.Source, key, err)
	}
	for i := range ms {
		ms[i].Options = append(ms[i].Options, "ro")
	}
	dir := filepath.Join(p.opts.MountDir, r.ImageID)
	umount, err := p.mountAt(ms, dir)
	if err != nil {
		return fmt.Errorf("activate %s: %w", r.Source, err)
	}
	verr := tarball.VerifyLayoutDirOf(dir, p.opts.RequiredDirs)
	var le *tarball.LayoutError
	refused := errors.As(verr, &le)
	if refused {
		log.G(ctx).WithField("image", r.Source).WithError(verr).Warn("security: image layout rejected")
	}
	if uerr := umount(); uerr != nil {
		if verr != nil {
			// Retried like any failed unmount, the check's verdict kept:
			// should every attempt fail so, the run's error says why the
			// image was not accepted.
			return fmt.Errorf("activate %s: %w; then unmount %s: %w", r.Source, verr, dir, uerr)
		}
		return fmt.Errorf("activate %s: unmount %s: %w", r.Source, dir, uerr)
	}
	if refused {
		if err := p.opts.Snapshots.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("activate %s: remove %s of a rejected layout (%w): %w", r.Source, key, verr, err)
		}
		return fsm.Abort(fmt.Errorf("activate %s: %w", r.Source, verr))
	}
	return verr
}

// discardActivation removes what an activate run that stopped in
// create-snapshot may have left: its verification view, the image's
// activation on the request's top chain unless its layout was verified for
// that chain (a verified one is as good for the next run as for this one),
// and its mount point. check-snapshot had removed any activation it did
// not keep, and only one activate run per image is live, so an unverified
// activation on the top chain is this run's; one on another chain is the
// image as pulled before, which check-snapshot kept as verified, and
// stays. A run that stopped before create-snapshot made nothing, and
// leaves the activation of the image as pulled before alone.
func (p *Pipelines) discardActivation(ctx context.Context, req *acReq) error {
	if req.Run.Transition != "create-snapshot" {
		return nil
	}
	r := req.Msg
	name := ActivationKey(r.ImageID)
	dir := filepath.Join(p.opts.MountDir, r.ImageID)
	if err := unmountDir(dir); err != nil {
		log.G(ctx).WithError(err).WithField("dir", dir).Warn("activate: removing the activation's mount point")
	}
	if err := p.discardVerifyView(ctx, r.ImageID); err != nil {
		return fmt.Errorf("activate %s: %w", r.Source, err)
	}
	info, err := p.opts.Snapshots.Stat(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("activate %s: stat activation %s: %w", r.Source, name, err)
	}
	if len(r.Layers) > 0 && info.Labels[LabelLayoutVerified] == r.topChain() {
		return nil
	}
	if len(r.Layers) > 0 {
		top, err := p.parentKey(ctx, r.topChain())
		if err != nil {
			return fmt.Errorf("activate %s: %w", r.Source, err)
		}
		if info.Parent != top {
			return nil
		}
	}
	log.G(ctx).WithField("snapshot", name).Warn("activate: removing the unverified activation of a run that did not complete")
	if err := p.opts.Snapshots.Remove(ctx, name); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("activate %s: remove unverified activation %s: %w", r.Source, name, err)
	}
	if err := p.opts.Snapshots.Cleanup(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("activate: cleanup after removing an unverified activation")
	}
	return nil
}

// register: the image's records (its layers as pulled), then its name:
// refused, and the run aborted, when it belongs to someone else (another
// image in the records, an image in containerd this daemon did not
// create) unless r.Replace; else recorded, then registered in containerd
// when configured. Pull checks the name before any work
// (Pipelines.checkName); this checks it again for a name taken since.
func (p *Pipelines) register(ctx context.Context, req *acReq) (*acResp, error) {
	p.hook("register:started")
	r, resp := req.Msg, req.Resp
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMActivate, State: "register"})
	layers := make([]ImageLayer, len(r.Layers))
	for i, l := range r.Layers {
		layers[i] = ImageLayer{Key: l.Key, ETag: l.ETag, SizeBytes: l.Size, ChainID: l.ChainID}
	}
	if err := RecordsOf(p.db).RecordPulledImage(ctx, r.ImageID, r.Source, layers, ""); err != nil {
		return nil, err
	}
	if err := p.nameImage(ctx, r.ImageID, r.Ref, r.Namespaces, r.Layers, r.Replace); err != nil {
		if errors.Is(err, errNameTaken) || errors.Is(err, ErrForeignImage) {
			return nil, fsm.Abort(err)
		}
		return nil, err
	}
	resp.Registered, resp.RegisterPending = p.registration(ctx, r.Ref)
	resp.Ref, resp.Namespaces = r.Ref, r.Namespaces
	return fsm.NewResponse(resp), nil
}

// checkName is nil when name can name image imageID in each containerd
// namespace of nss: no other image of ours has it in the records and
// containerd has no image of that name this daemon did not create, or
// replace. Otherwise the error (wrapping errNameTaken or
// ErrForeignImage) names who has it. It writes nothing.
func (p *Pipelines) checkName(ctx context.Context, imageID, name string, nss []string, replace bool) error {
	if name == "" || replace {
		return nil
	}
	holder, err := RecordsOf(p.db).ImageIDByName(ctx, name)
	if err != nil {
		return err
	}
	if holder != "" && holder != imageID {
		img, err := RecordsOf(p.db).GetImage(ctx, holder)
		if err != nil {
			return err
		}
		source := ""
		if img != nil {
			source = img.Source
		}
		return fmt.Errorf("name %q is the name of image %s (%s): %w (pull with --replace to move it, or choose another --name)", name, holder, source, errNameTaken)
	}
	if p.opts.Registrar == nil {
		return nil
	}
	return inNamespaces(ctx, nss, func(ctx context.Context, _ string) error {
		return p.opts.Registrar.Check(ctx, name, false)
	})
}

// nameImage gives image imageID the name name: checked (checkName),
// recorded, then registered in containerd as the image of layers in each
// namespace of nss. A registration refused (ErrForeignImage) takes back
// the registrations it made in the namespaces before the one that
// refused, then the record this call added: a containerd image of ours
// whose name no record gives is one nothing would ever remove, so the
// record stays when the registrations cannot be taken back. The record and the registration of one name
// are done under that name's lock (Pipelines.names), so two namings of it
// (two --replace pulls) leave the records and containerd naming the same
// image: the one named last.
func (p *Pipelines) nameImage(ctx context.Context, imageID, name string, nss []string, layers []api.Layer, replace bool) error {
	if name == "" {
		return nil
	}
	if err := p.checkName(ctx, imageID, name, nss, replace); err != nil {
		return err
	}
	unlock := p.names.Lock(name)
	defer unlock()
	had, err := RecordsOf(p.db).ImageIDByName(ctx, name)
	if err != nil {
		return err
	}
	if err := RecordsOf(p.db).AddImageName(ctx, name, imageID, replace); err != nil {
		return err
	}
	err = p.registerName(ctx, name, nss, layers, replace)
	if errors.Is(err, ErrForeignImage) && had != imageID {
		// The registrations go first, the record last: should containerd
		// not answer (or the daemon die) in between, the record still
		// names what containerd has, and removing the image removes it.
		ctx := context.WithoutCancel(ctx)
		if uerr := p.opts.Registrar.Unregister(ctx, name); uerr != nil {
			log.G(ctx).WithError(uerr).WithField("name", name).Error("register: taking back the registrations made before the refusal; the name stays recorded for the image")
		} else if derr := RecordsOf(p.db).dropImageName(ctx, name, imageID); derr != nil {
			log.G(ctx).WithError(derr).WithField("name", name).Error("register: taking back a refused name")
		}
	}
	return err
}

// registerName registers name in containerd (when there is a registrar)
// as the image of layers, in each of nss (none: the registrar's own
// namespace).
func (p *Pipelines) registerName(ctx context.Context, name string, nss []string, layers []api.Layer, replace bool) error {
	if p.opts.Registrar == nil || name == "" {
		return nil
	}
	diffs := make([]string, len(layers))
	for i, l := range layers {
		diffs[i] = l.DiffID
	}
	return inNamespaces(ctx, nss, func(ctx context.Context, ns string) error {
		err := p.opts.Registrar.Register(ctx, name, diffs, replace)
		if errors.Is(err, ErrContainerdAbsent) {
			// The image is usable from the records; the name is
			// registered once containerd answers (pending.go).
			log.G(ctx).WithError(err).WithField("name", name).WithField("namespace", ns).
				Warn("register: containerd is not up; the name is registered once it answers")
			return RecordsOf(p.db).markPending(context.WithoutCancel(ctx), name, ns, replace)
		}
		if err == nil {
			err = RecordsOf(p.db).clearPending(ctx, name, ns)
		}
		if err != nil {
			if ns != "" {
				return fmt.Errorf("register %s in containerd namespace %s: %w", name, ns, err)
			}
			return fmt.Errorf("register %s in containerd: %w", name, err)
		}
		return nil
	})
}

// inNamespaces calls f with ctx naming each containerd namespace of nss in
// turn (namespaces.WithNamespace, which the registrar reads), or once with
// ctx as it is and "" when nss is empty.
func inNamespaces(ctx context.Context, nss []string, f func(context.Context, string) error) error {
	if len(nss) == 0 {
		return f(ctx, "")
	}
	for _, ns := range nss {
		if err := f(namespaces.WithNamespace(ctx, ns), ns); err != nil {
			return err
		}
	}
	return nil
}
