package plugin

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter/snapshottertest"
)

// TestWalkErrorsKeepTheirClassOverTheWire: a Walk refused by the daemon's
// snapshotter reaches containerd's proxy client with the same errdefs
// class as the other calls' errors: an invalid filter is InvalidArgument,
// a closed snapshotter FailedPrecondition, not Unknown.
func TestWalkErrorsKeepTheirClassOverTheWire(t *testing.T) {
	db := metadatatest.Open(t)
	sn, _ := snapshottertest.New(t, db, snapshotter.DefaultConfig())
	socket := filepath.Join(t.TempDir(), "s.sock")
	startServe(t, sn, ServeOptions{Socket: socket})
	cl := DialProxy(t, socket)
	ctx := namespaces.WithNamespace(context.Background(), "default")
	nop := func(context.Context, snapshots.Info) error { return nil }

	if err := cl.Walk(ctx, nop, `labels."x===`); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Walk with an invalid filter over the wire: %v; want InvalidArgument", err)
	}
	sn.Close()
	if err := cl.Walk(ctx, nop); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Walk of a closed snapshotter over the wire: %v; want FailedPrecondition, as Stat gets", err)
	}
}
