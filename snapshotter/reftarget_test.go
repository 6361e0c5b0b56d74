package snapshotter

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/content/local"
	bolt "go.etcd.io/bbolt"
)

// TestRefTargetIsWhatContainerdFinds: containerd's metadata store takes
// the AlreadyExists of a Prepare carrying containerd.io/snapshot.ref as
// "the backend found a snapshot matching the target", and looks it up
// with a Walk on that label and the parent; when the Walk finds nothing
// it fails the Prepare NotFound. A committed snapshot merely named like
// the target (without the label) must therefore not be answered
// AlreadyExists: containerd, through its own metadata store, must be able
// to prepare the snapshot (and unpack the layer itself).
func TestRefTargetIsWhatContainerdFinds(t *testing.T) {
	ctx := context.Background()
	s, _ := newFakeSnapshotter(t, Config{})
	const chain = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	// A chain committed under its chain ID without the label (as the
	// pipeline committed its chains before they carried it).
	if _, err := s.Prepare(ctx, "extract", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, chain, "extract"); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	bdb, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bdb.Close() })
	cs, err := local.NewStore(filepath.Join(dir, "content"))
	if err != nil {
		t.Fatal(err)
	}
	mdb := metadata.NewDB(bdb, cs, map[string]snapshots.Snapshotter{"flyio": s})
	if err := mdb.Init(ctx); err != nil {
		t.Fatal(err)
	}
	nctx := namespaces.WithNamespace(ctx, "default")
	_, err = mdb.Snapshotter("flyio").Prepare(nctx, "extract-1 "+chain, "",
		snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: chain}))
	if err != nil {
		t.Fatalf("containerd's Prepare of layer %s through its metadata store: %v", chain, err)
	}
}
