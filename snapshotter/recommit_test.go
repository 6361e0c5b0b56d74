package snapshotter

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
)

// TestRacingRecommitsLeaveNoDeviceUnowned: two replacements of the same lost
// committed device, the second run to its end between the first one's
// checks and its records. The second one wins; the first fails
// FailedPrecondition and leaves its active snapshot as it was (its device
// mapped again, removable), so the name holds one device and every device
// the records hold belongs to a snapshot or is the base.
func TestRacingRecommitsLeaveNoDeviceUnowned(t *testing.T) {
	bg := context.Background()
	s, pool := newFakeSnapshotter(t, Config{})
	mustParent(t, s, "parent")
	if _, err := s.Prepare(bg, "name-work", "parent"); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(bg, "name", "name-work"); err != nil {
		t.Fatal(err)
	}
	_, _, lost, err := s.DeviceOf(bg, "name")
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Delete(bg, lost); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"fix-1", "fix-2"} {
		if _, err := s.Prepare(bg, key, "parent"); err != nil {
			t.Fatal(err)
		}
	}
	_, _, second, err := s.DeviceOf(bg, "fix-2")
	if err != nil {
		t.Fatal(err)
	}

	var inner error
	ran := false
	s.hook = func(step string) error {
		if step == "recommit:checked" && !ran {
			ran = true
			inner = s.Recommit(bg, "name", "fix-2")
		}
		return nil
	}
	outer := s.Recommit(bg, "name", "fix-1")
	s.hook = nil
	if !ran {
		t.Fatal("step recommit:checked never reached")
	}
	if inner != nil {
		t.Fatalf("the replacement that ran to its end first: %v", inner)
	}
	if !errors.Is(outer, errdefs.ErrFailedPrecondition) {
		t.Fatalf("the replacement that came second: %v, want FailedPrecondition", outer)
	}
	if _, _, got, err := s.DeviceOf(bg, "name"); err != nil || got != second {
		t.Errorf("name is on device %d (%v), want %d, the first replacement's", got, err, second)
	}
	if _, err := s.Mounts(bg, "fix-1"); err != nil {
		t.Errorf("the losing replacement's snapshot cannot be mounted: %v", err)
	}

	owned := map[uint32]string{}
	for _, key := range []string{"parent", "name", "fix-1"} {
		_, _, id, err := s.DeviceOf(bg, key)
		if err != nil {
			t.Fatal(err)
		}
		owned[id] = key
	}
	devs, err := s.reads().ThinDevices(bg, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if _, ok := owned[d.ID]; !ok && d.Role != ThinRoleBase {
			t.Errorf("device %d (%s, %s) belongs to no snapshot", d.ID, d.Name, d.State)
		}
	}
	if slices.ContainsFunc(devs, func(d ThinDevice) bool { return d.ID == lost }) {
		t.Errorf("the lost device %d is still recorded", lost)
	}
	removeAfterCancel(t, s, pool, "recommit", "fix-1", "name")
}
