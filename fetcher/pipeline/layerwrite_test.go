package pipeline

import (
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
)

// TestLayerWrite: the snapshots containerd's unpackers prepare to apply a
// layer into are told apart from containers' and the pipelines' own.
func TestLayerWrite(t *testing.T) {
	ref := snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: "sha256:c"})
	for _, tc := range []struct {
		key  string
		opts []snapshots.Opt
		want bool
	}{
		{"default/7/extract-123-abc sha256:c", []snapshots.Opt{ref}, true},
		{"default/7/extract-123-abc sha256:c", nil, true},
		{"k8s.io/9/anything", []snapshots.Opt{ref}, true},
		{"default/8/my-container", nil, false},
		{"default/8/my-container", []snapshots.Opt{snapshots.WithLabels(map[string]string{"x": "y"})}, false},
		{"extract-1-2 sha256:c", []snapshots.Opt{snapshots.WithLabels(map[string]string{LabelPrivate: privateExtract})}, false},
	} {
		if got := layerWrite(tc.key, tc.opts); got != tc.want {
			t.Errorf("layerWrite(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
}
