package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// repull answers a pull of an image that is pulled, unpacked and active
// from the records: one read transaction (Records.pulledImageState, whose
// answer records returns: see Pipelines.readRecords and recordsNow), a
// stat of the activation's device node and a sysfs read saying the node is
// still that live device-mapper device (how an activation removed behind
// our back, `dmsetup remove`, is noticed) and, with a registrar, one look at
// containerd's image per namespace. listed, when not nil, is what S3 says
// the image is now: the records answer only if they were pulled from the
// same objects (keys, ETags and sizes, in order). It starts no run and
// makes no device-mapper call; it writes only when ref is not yet a name
// of the image in the records, or is missing or names another image in a
// containerd namespace of nss (none: the registrar's own), and then names
// it as the activate run does (Pipelines.nameImage: recorded, then
// registered), or when a failure recorded by an earlier pull is over;
// replace as api.PullRequest.Replace.
// It returns nil and why when anything is missing or differs: the caller
// then runs the pipelines, which heal it.
//
// What it cannot see: a committed chain's thin device deleted from the
// pool behind our back (`dmsetup message POOL 0 "delete ID"`). Committed
// chains are not activated, so they have no node in /dev/mapper nor in
// /sys/block, and only a device-mapper call could tell. That probe stays on
// the slow path: `pull --refresh` runs the pipelines, whose check-unpacked
// asks the pool for each chain's device and rebuilds a missing one.
func (p *Pipelines) repull(ctx context.Context, records func() (*pulledState, error), source, imageID, ref string, nss []string, replace bool, listed []api.Layer) (*api.PullResult, string) {
	st, err := records()
	switch {
	case err != nil:
		return nil, err.Error()
	case st == nil:
		return nil, "not pulled, or its records are not all in place"
	case st.Image.Source != source:
		return nil, "recorded from another source"
	}
	if listed != nil {
		if len(listed) != len(st.Layers) {
			return nil, fmt.Sprintf("S3 lists %d layers, %d were pulled", len(listed), len(st.Layers))
		}
		for i, l := range listed {
			r := st.Layers[i]
			if l.Key != r.Key || l.ETag == "" || l.ETag != r.ETag || l.Size != r.SizeBytes {
				return nil, fmt.Sprintf("layer %d (%s) changed in S3", i+1, l.Key)
			}
		}
	}
	path := thinpool.DevicePath(st.ActivationDevice)
	if err := p.deviceLive(path); err != nil {
		return nil, err.Error()
	}
	layers := make([]api.Layer, len(st.Layers))
	for i, l := range st.Layers {
		layers[i] = api.Layer{Key: l.Key, Size: l.SizeBytes, ETag: l.ETag, DiffID: st.DiffIDs[i], ChainID: l.ChainID}
	}
	top := layers[len(layers)-1].ChainID
	// The name is in place when the records give it to this image and, in
	// each namespace, containerd has it for this very image: one lookup
	// per namespace. Otherwise it is named as the activate run names it
	// (recorded before containerd is written to, so that a name another
	// image took meanwhile is refused before it is repointed there): in
	// every namespace when the records do not give it to this image yet,
	// else in those where containerd lost it (`ctr image rm`) or has it for
	// another image.
	named := slices.Contains(st.Names, ref)
	var missing []string
	lost := !named
	if named && p.opts.Registrar != nil {
		diffs := make([]string, len(layers))
		for i, l := range layers {
			diffs[i] = l.DiffID
		}
		err := inNamespaces(ctx, nss, func(ctx context.Context, ns string) error {
			ok, err := p.opts.Registrar.Registered(ctx, ref, diffs)
			if err == nil && !ok {
				lost = true
				if ns != "" {
					missing = append(missing, ns)
				}
			}
			return err
		})
		if err != nil {
			return nil, err.Error()
		}
	}
	if lost {
		if !named {
			missing = nss
		}
		if err := p.nameImage(ctx, imageID, ref, missing, layers, replace); err != nil {
			return nil, err.Error()
		}
	}
	if st.Image.FailureReason != "" && listed != nil {
		// S3 says the image is what is in place: an earlier failure is over.
		if err := RecordsOf(p.db).clearImageFailure(ctx, imageID); err != nil {
			return nil, err.Error()
		}
	}
	registered, pending := p.registration(ctx, ref)
	return &api.PullResult{Ref: ref, Source: source, ImageID: imageID, Layers: layers, TopChainID: top,
		Snapshot: api.ActivateResponse{ImageID: imageID, SnapshotName: ActivationKey(imageID), DeviceName: st.ActivationDevice,
			DevicePath: path, Active: true, Registered: registered, RegisterPending: pending}}, ""
}

// readRecords starts reading image imageID's records (Records.pulledImageState)
// on a goroutine of its own and returns what waits for them. A pull reads
// them while S3 lists the image, since neither needs the other. The read
// is one moment's view either way; taken before the listing's answer
// rather than after it, a record that changes in between (another pull of
// the image ending) is seen as it was: missing, or pulled from objects the
// listing no longer names, and the pipelines, which reuse what is in
// place, then answer. What repull checks on the host (the
// device, containerd's name) is still looked at after both.
// The caller must call the returned function once, on every path, so that
// the read never outlives the pull.
func (p *Pipelines) readRecords(ctx context.Context, imageID string) func() (*pulledState, error) {
	type answer struct {
		st  *pulledState
		err error
	}
	done := make(chan answer, 1)
	go func() {
		st, err := RecordsOf(p.db).pulledImageState(ctx, imageID)
		done <- answer{st, err}
	}()
	return func() (*pulledState, error) {
		a := <-done
		return a.st, a.err
	}
}

// recordsNow reads image imageID's records on the caller's goroutine, for a
// repull with nothing to do beside.
func (p *Pipelines) recordsNow(ctx context.Context, imageID string) func() (*pulledState, error) {
	return func() (*pulledState, error) { return RecordsOf(p.db).pulledImageState(ctx, imageID) }
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
