package snapshotter

import (
	"context"
	"fmt"
	"testing"

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
