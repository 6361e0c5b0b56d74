package snapshotter

import (
	"context"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

// newFakeSnapshotter returns a Snapshotter on a real database and a new
// fake pool, and the pool for the test to look into. Its base device is
// already made (recorded and in the pool, without a filesystem: the fake's
// Format makes none), so that the tests' first parentless snapshot does no
// more device work than any other.
func newFakeSnapshotter(t testing.TB, cfg Config) (*Snapshotter, *thinpooltest.FakePool) {
	t.Helper()
	ctx := context.Background()
	pool := thinpooltest.NewFakePool()
	s, err := New(ctx, metadatatest.Open(t), pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ensureBase(ctx); err != nil {
		t.Fatal(err)
	}
	return s, pool
}
