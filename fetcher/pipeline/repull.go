package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// repull answers a pull of an image that is already pulled, unpacked and
// active, and unchanged since, from what is recorded (seed 001's test case
// 4: "only DB queries", "no devicemapper operations"): one read
// transaction (metadata.PulledImageState), a stat of each layer's tarball,
// a stat of the activation's device node and a sysfs read saying the node
// is still that live device-mapper device (how an activation removed
// behind our back, `dmsetup remove`, is noticed: seed 001's test case 5)
// and, with a registrar, one look at containerd's image. It starts no FSM
// run, makes no S3 request and no device-mapper ioctl, extracts nothing
// and writes nothing. It returns nil, and the caller runs the pipelines,
// when anything is missing or disagrees: they heal it.
//
// What it cannot see: a committed chain's thin device deleted from the
// pool behind our back (`dmsetup message POOL 0 "delete ID"`). Committed
// chains are not activated, so they have no node in /dev/mapper nor in
// /sys/block, and only a device-mapper call (a pool message and a read of
// its metadata, thinpool.Pool.ThinIDs, or one ThinExists per chain) could
// tell. That probe stays on the slow path: `pull --refresh` runs the
// pipelines, whose check-unpacked asks the pool for each chain's device
// and heals a missing one.
func (p *Pipelines) repull(ctx context.Context, source, imageID, ref string) *PullResult {
	lg := log.G(ctx).WithField("ref", ref)
	miss := func(why string) *PullResult {
		lg.WithField("reason", why).Debug("re-pull: running the pipelines")
		return nil
	}
	var layers []Layer
	rec, st, err := p.db.PulledImageState(ctx, ref, func(rec *metadata.PulledImage) (chains, diffs []string, err error) {
		layers = nil
		if err := json.Unmarshal([]byte(rec.Layers), &layers); err != nil {
			return nil, nil, fmt.Errorf("layers of %s: %w", rec.Ref, err)
		}
		for _, l := range layers {
			chains, diffs = append(chains, l.ChainID), append(diffs, l.DiffID)
		}
		return chains, diffs, nil
	})
	switch {
	case err != nil:
		return miss(err.Error())
	case rec == nil:
		return miss("no pulled-image record under this name")
	case rec.Source != source || rec.ImageID != imageID:
		return miss("the name was pulled from another source")
	case st == nil:
		return miss("records missing or disagreeing")
	}
	for _, l := range layers {
		if l.ChainID == "" || l.DiffID == "" {
			return miss("recorded layers without digests")
		}
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
	if err := p.deviceLive(st.Activation.DevicePath); err != nil {
		return miss(err.Error())
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

// sysDevBlock is where sysfs lists block devices by device number.
const sysDevBlock = "/sys/dev/block"

// mappedDeviceLive says whether path (/dev/mapper/NAME, or a link to
// /dev/dm-N) is a block device node that sysfs knows as the live
// device-mapper device NAME: file-system calls only, no device-mapper
// ioctl. A node left behind by `dmsetup remove` without udev, or one now
// pointing at another device, does not count.
func mappedDeviceLive(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("activation device node %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("activation device node %s: not a block device", path)
	}
	sys := filepath.Join(sysDevBlock, fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), "dm", "name")
	name, err := os.ReadFile(sys)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("activation device %s: no live device-mapper device behind it (%s)", path, sys)
	}
	if err != nil {
		return fmt.Errorf("activation device %s: %w", path, err)
	}
	if got := strings.TrimSpace(string(name)); got != filepath.Base(path) {
		return fmt.Errorf("activation device %s: its node is device-mapper device %q now", path, got)
	}
	return nil
}
