package snapshotter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

// fakeResumeFailPool is a FakePool whose CreateSnap, once armed, makes the
// snapshot and then fails as the real pool does when create_snap
// succeeded but resuming the suspended origin did not.
type fakeResumeFailPool struct {
	*thinpooltest.FakePool
	armed bool
}

func (p *fakeResumeFailPool) CreateSnap(ctx context.Context, id, originID uint32) error {
	if err := p.FakePool.CreateSnap(ctx, id, originID); err != nil || !p.armed {
		return err
	}
	return fmt.Errorf("fake pool: resume origin device of thin %d after create_snap %d: %w", originID, id, unix.EINVAL)
}

// TestFailedCreateSnapLeavesNoDevice: a Prepare whose create_snap made the
// device but then failed (the origin could not be resumed) fails, and
// leaves no device that nothing records, no intent and no quarantined id;
// the key can be prepared again. A create_snap refused because the id is
// taken by a device nothing records leaves that device alone.
func TestFailedCreateSnapLeavesNoDevice(t *testing.T) {
	bg := context.Background()
	pool := &fakeResumeFailPool{FakePool: thinpooltest.NewFakePool()}
	s, err := New(bg, metadatatest.Open(t), pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ensureBase(bg); err != nil {
		t.Fatal(err)
	}
	mustParent(t, s, "parent")

	pool.armed = true
	if _, err := s.Prepare(bg, "child", "parent"); err == nil {
		t.Fatal("Prepare succeeded though its create_snap failed")
	}
	pool.armed = false
	assertSettled(t, s, pool.FakePool)
	if q, err := s.reads().QuarantinedIDs(bg); err != nil || len(q) != 0 {
		t.Errorf("quarantined ids after the rollback: %+v (%v), want none", q, err)
	}
	if _, err := s.Prepare(bg, "child", "parent"); err != nil {
		t.Fatalf("Prepare again after the failed create: %v", err)
	}

	// A device nothing records holds the next candidate id of "other":
	// the create skips the id (quarantined) and the device stays.
	id := candidateID(keyspace, "other")
	parent, err := s.get(bg, "parent")
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.FakePool.CreateSnap(bg, id, parent.DeviceID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(bg, "other", "parent"); err != nil {
		t.Fatalf("Prepare whose first candidate id is taken: %v", err)
	}
	if present, err := pool.ThinExists(bg, id); err != nil || !present {
		t.Errorf("unrecorded device %d after a create that found it: present %v (%v), want kept", id, present, err)
	}
	if _, _, got, err := s.DeviceOf(bg, "other"); err != nil || got == id {
		t.Errorf("DeviceOf(other) = %d (%v), want an id other than the taken %d", got, err, id)
	}
}

// mappedDevices returns the dm names the fake pool has mapped.
func mappedDevices(t *testing.T, s *Snapshotter) []string {
	t.Helper()
	acts, err := s.pool.ActiveDevices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range acts {
		names = append(names, a.Name)
	}
	return names
}

// TestCallsDuringCommitLeaveCommittedDeviceAlone: a Usage or Mounts of the
// active snapshot that reaches the snapshotter while its Commit has
// unmapped the device (containerd's CRI calls Usage on every active
// snapshot every few seconds, unpacks' extractions included) waits for the
// Commit, then finds the key gone: it neither maps the committed device
// again nor hands it out writable.
func TestCallsDuringCommitLeaveCommittedDeviceAlone(t *testing.T) {
	for _, call := range []string{"usage", "mounts"} {
		t.Run(call, func(t *testing.T) {
			ctx := context.Background()
			s, _ := newFakeSnapshotter(t, Config{})
			if _, err := s.Prepare(ctx, "extract", ""); err != nil {
				t.Fatal(err)
			}
			r, err := s.get(ctx, "extract")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			var once sync.Once
			s.hook = func(step string) error {
				if step == "commit:deactivated" {
					once.Do(func() {
						go func() {
							var err error
							if call == "usage" {
								_, err = s.Usage(ctx, "extract")
							} else {
								var ms []mount.Mount
								if ms, err = s.Mounts(ctx, "extract"); err == nil && len(ms) == 1 && !slices.Contains(ms[0].Options, "ro") {
									err = fmt.Errorf("writable mount %v", ms)
								}
							}
							done <- err
						}()
						time.Sleep(50 * time.Millisecond) // the call reaches the snapshotter in the window
					})
				}
				return nil
			}
			if err := s.Commit(ctx, "layer", "extract"); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errdefs.IsNotFound(err) {
				t.Errorf("%s of the key while it was committed: %v; want NotFound (the key is committed under another name)", call, err)
			}
			if slices.Contains(mappedDevices(t, s), r.DeviceName) {
				t.Errorf("committed snapshot's device %s is mapped after Commit and the %s that overlapped it", r.DeviceName, call)
			}
		})
	}
}
