package snapshotter

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// TestStaleReclaimSparesDeviceThatReusedItsID: a reclaim that lags behind
// another one (a Cleanup that listed the removed devices before another
// Cleanup deleted them, or a synchronous Remove overtaken by a Cleanup)
// must not delete the device that a new snapshot of the same key made
// meanwhile under the same thin id and dm name: the committed snapshot
// keeps its device, can still be viewed, and the lagging call succeeds.
func TestStaleReclaimSparesDeviceThatReusedItsID(t *testing.T) {
	bg := context.Background()
	// A pipeline key: making it again hashes to the same candidate thin id.
	const key = "flyio-extract-sha256:c1"
	for _, tc := range []struct {
		name  string
		async bool
		// step is where the lagging call is overtaken; lagging is that call.
		step    string
		lagging func(s *Snapshotter) error
	}{
		{"cleanup behind cleanup", true, "cleanup:listed", func(s *Snapshotter) error { return s.Cleanup(bg) }},
		{"remove behind cleanup", false, "remove:marked", func(s *Snapshotter) error { return s.Remove(bg, key) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pool := newFakeSnapshotter(t, Config{AsyncRemove: tc.async})
			if _, err := s.Prepare(bg, key, ""); err != nil {
				t.Fatal(err)
			}
			_, _, oldID, err := s.DeviceOf(bg, key)
			if err != nil {
				t.Fatal(err)
			}
			if tc.async {
				if err := s.Remove(bg, key); err != nil {
					t.Fatal(err)
				}
			}

			// Where the lagging call has read the removed device, another
			// Cleanup deletes it, and the key is prepared again and
			// committed, under the freed id.
			var newID uint32
			overtaken := false
			s.hook = func(step string) error {
				if step != tc.step || overtaken {
					return nil
				}
				overtaken = true
				if err := s.Cleanup(bg); err != nil {
					return err
				}
				if _, err := s.Prepare(bg, key, ""); err != nil {
					return err
				}
				if _, _, newID, err = s.DeviceOf(bg, key); err != nil {
					return err
				}
				return s.Commit(bg, "sha256:chain1", key)
			}
			err = tc.lagging(s)
			s.hook = nil
			if !overtaken {
				t.Fatalf("step %s never reached", tc.step)
			}
			if err != nil {
				t.Errorf("lagging call: %v", err)
			}
			if newID != oldID {
				t.Fatalf("the key made again got thin id %d, not the freed %d: the reuse this test needs did not happen", newID, oldID)
			}

			if present, err := pool.ThinExists(bg, newID); err != nil || !present {
				t.Errorf("committed snapshot's thin id %d in the pool: %v (%v), want present", newID, present, err)
			}
			if _, err := s.View(bg, "view-of-chain1", "sha256:chain1"); err != nil {
				t.Errorf("View on the committed snapshot: %v", err)
			}
			if err := s.Cleanup(bg); err != nil {
				t.Fatal(err)
			}
			assertSettled(t, s, pool)
		})
	}
}

// TestReclaimDiscardsBeforeDelete: with pool.discard_blocks, a removed
// device is discarded whole before it is deleted, also a committed one
// that is no longer active (it is activated for the discard), and nothing
// of it stays mapped; without it the device is only deleted.
func TestReclaimDiscardsBeforeDelete(t *testing.T) {
	bg := context.Background()
	for _, discard := range []bool{true, false} {
		t.Run(fmt.Sprintf("discard_blocks=%v", discard), func(t *testing.T) {
			s, pool := newFakeSnapshotter(t, Config{AsyncRemove: true, DiscardBlocks: discard})
			if _, err := s.Prepare(bg, "layer", ""); err != nil {
				t.Fatal(err)
			}
			name, _, id, err := s.DeviceOf(bg, "layer")
			if err != nil {
				t.Fatal(err)
			}
			if err := pool.Write(id, 2048); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(bg, "sha256:chain1", "layer"); err != nil {
				t.Fatal(err)
			}
			_, active := pool.Counts()
			if err := s.Remove(bg, "sha256:chain1"); err != nil {
				t.Fatal(err)
			}
			if err := s.Cleanup(bg); err != nil {
				t.Fatal(err)
			}
			want := []string(nil)
			if discard {
				want = []string{name}
			}
			if got := pool.Discarded(); !slices.Equal(got, want) {
				t.Errorf("discarded %v, want %v", got, want)
			}
			if ok, err := pool.ThinExists(bg, id); err != nil || ok {
				t.Errorf("thin %d still in the pool after Cleanup: %v, %v", id, ok, err)
			}
			if _, after := pool.Counts(); after != active {
				t.Errorf("%d devices mapped after Cleanup, %d before the Remove: the device activated for its discard stayed mapped", after, active)
			}
		})
	}
}
