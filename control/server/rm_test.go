package server

import (
	"context"

	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// fakeEmptyPool is a fake of a snapshotter that holds no snapshot (host: no
// device-mapper); rm never gets as far as removing one in these tests.
type fakeEmptyPool struct{}

func (fakeEmptyPool) Walk(context.Context, snapshots.WalkFunc, ...string) error { return nil }
func (fakeEmptyPool) Remove(context.Context, string) error                      { return nil }
func (fakeEmptyPool) RemoveIf(context.Context, string, snapshotter.RemoveGuard) error {
	return nil
}
func (fakeEmptyPool) Cleanup(context.Context) error { return nil }
func (fakeEmptyPool) HeldOpen(context.Context, string) (bool, error) {
	return false, nil
}
