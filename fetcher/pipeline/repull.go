package pipeline

import (
	"context"
	"encoding/json"
	"os"
	"slices"

	"github.com/containerd/log"
)

// repull answers a pull of an image that is already pulled, unpacked and
// active, and unchanged since, from what is recorded (seed 001's test case
// 4: "only DB queries"): one read transaction (metadata.PulledState), a
// stat of each layer's tarball and of the activation's device node, one
// read of the pool's thin ids (the only device-mapper call: how a device
// deleted behind our back is noticed, seed 001's test case 5) and, with a
// registrar, one look at containerd's image. It starts no FSM run, makes
// no S3 request, extracts nothing and writes nothing. It returns nil, and
// the caller runs the pipelines, when anything is missing or disagrees:
// they heal it.
func (p *Pipelines) repull(ctx context.Context, source, imageID, ref string) *PullResult {
	lg := log.G(ctx).WithField("ref", ref)
	miss := func(why string) *PullResult {
		lg.WithField("reason", why).Debug("re-pull: running the pipelines")
		return nil
	}
	rec, err := p.db.GetPulledImage(ctx, ref)
	if err != nil || rec == nil || rec.Source != source || rec.ImageID != imageID {
		return miss("no pulled-image record of this source under this name")
	}
	var layers []Layer
	if err := json.Unmarshal([]byte(rec.Layers), &layers); err != nil || len(layers) == 0 {
		return miss("recorded layers unreadable")
	}
	chains, diffs := make([]string, len(layers)), make([]string, len(layers))
	for i, l := range layers {
		if l.ChainID == "" || l.DiffID == "" {
			return miss("recorded layers without digests")
		}
		chains[i], diffs[i] = l.ChainID, l.DiffID
	}
	if chains[len(chains)-1] != rec.TopChainID {
		return miss("recorded top chain disagrees with the layers")
	}
	st, err := p.db.PulledState(ctx, imageID, rec.SnapshotKey, chains, diffs)
	if err != nil || st == nil {
		return miss("records incomplete")
	}
	for _, l := range st.Layers {
		if l.Blob == nil {
			return miss("a layer's tarball is not recorded")
		}
		fi, err := os.Stat(l.Blob.Path)
		if err != nil {
			return miss("a layer's tarball is gone")
		}
		if size, mtime, ino := fileStamp(fi); size != l.Blob.StatSize || mtime != l.Blob.StatMtimeNs || ino != l.Blob.StatIno {
			return miss("a layer's tarball changed")
		}
	}
	if _, err := os.Stat(st.Activation.DevicePath); err != nil {
		return miss("the activation's device node is gone")
	}
	if p.opts.ThinIDs != nil {
		ids, err := p.opts.ThinIDs(ctx)
		if err != nil {
			return miss("thin ids unreadable: " + err.Error())
		}
		if !slices.Contains(ids, st.ActivationDeviceID) {
			return miss("the activation's thin device is gone")
		}
		for _, l := range st.Layers {
			if !slices.Contains(ids, l.DeviceID) {
				return miss("a chain's thin device is gone")
			}
		}
	}
	registered := false
	if p.opts.Registrar != nil {
		ok, err := p.opts.Registrar.Registered(ctx, ref, rec.TopChainID)
		if err != nil || !ok {
			return miss("not registered in containerd")
		}
		registered = true
	}
	a := st.Activation
	return &PullResult{Ref: ref, Source: source, ImageID: imageID, Layers: layers, TopChainID: rec.TopChainID,
		Snapshot: ActivateResponse{ImageID: imageID, SnapshotID: a.SnapshotID, SnapshotName: a.SnapshotName,
			DevicePath: a.DevicePath, OriginDeviceID: a.OriginDeviceID, Active: true, Registered: registered}}
}
