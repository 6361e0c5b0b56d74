package snapshotter

import (
	"context"
	"testing"

	"github.com/containerd/errdefs"
)

// TestCommitRefusesEmptyName: a committed snapshot named "" could never
// be a parent (a parent "" means none) and is refused by containerd's own
// stores; Commit refuses it InvalidArgument, as Prepare refuses an empty
// key, and the active snapshot stays.
func TestCommitRefusesEmptyName(t *testing.T) {
	ctx := context.Background()
	s, _ := newFakeSnapshotter(t, Config{})
	if _, err := s.Prepare(ctx, "work", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "", "work"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Commit with an empty name: %v, want InvalidArgument", err)
	}
	if info, err := s.Stat(ctx, "work"); err != nil || info.Name != "work" {
		t.Errorf("active snapshot after the refused Commit: %+v, %v", info, err)
	}
}
