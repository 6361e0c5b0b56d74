package snapshotter

import (
	"context"
	"maps"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
)

// TestEmptyLabelValuesAreNotStored: as in containerd's own snapshotters
// (boltutil.WriteLabels) and in this one's Update, a label given with an
// empty value is no label: Prepare, View and Commit do not store it, so
// Stat does not return it and a Walk on its presence does not match.
func TestEmptyLabelValuesAreNotStored(t *testing.T) {
	ctx := context.Background()
	s, _ := newFakeSnapshotter(t, Config{})
	given := map[string]string{"empty": "", "kept": "v"}
	want := map[string]string{"kept": "v"}
	if _, err := s.Prepare(ctx, "active", "", snapshots.WithLabels(maps.Clone(given))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "work", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "committed", "work", snapshots.WithLabels(maps.Clone(given))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.View(ctx, "view", "committed", snapshots.WithLabels(maps.Clone(given))); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"active", "committed", "view"} {
		info, err := s.Stat(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(info.Labels, want) {
			t.Errorf("Stat(%s).Labels = %q, want %q", key, info.Labels, want)
		}
	}
	var matched []string
	if err := s.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		matched = append(matched, i.Name)
		return nil
	}, "labels.empty"); err != nil {
		t.Fatal(err)
	}
	if len(matched) != 0 {
		t.Errorf("Walk(labels.empty) matched %v, want none", matched)
	}
}
