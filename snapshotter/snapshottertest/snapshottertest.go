// Package snapshottertest builds the real Snapshotter for the tests of
// other packages, over a fake thin pool held in memory
// (thinpooltest.FakePool, whose devices may keep files in directories),
// so that they run on hosts without
// device-mapper: the snapshotter's records and rules are the daemon's,
// only the pool is not. Only tests import this package.
package snapshottertest

import (
	"context"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

// New returns a Snapshotter with its records in db (metadatatest.Open
// gives one) over a new, empty FakePool, configured by cfg as
// snapshotter.New is, and that pool. The Snapshotter is closed when t
// ends; db is left open. Its devices hold no filesystem (the fake's Format
// makes none): what a test writes to one is what it says with the pool's
// Write.
func New(t testing.TB, db *metadata.DB, cfg snapshotter.Config) (*snapshotter.Snapshotter, *thinpooltest.FakePool) {
	t.Helper()
	pool := thinpooltest.NewFakePool()
	return NewOn(t, db, pool, cfg), pool
}

// NewOn is New over pool, a FakePool the test made: one from
// thinpooltest.NewFakePoolAt gives the snapshots' devices files.
func NewOn(t testing.TB, db *metadata.DB, pool *thinpooltest.FakePool, cfg snapshotter.Config) *snapshotter.Snapshotter {
	t.Helper()
	s, err := snapshotter.New(context.Background(), db, pool, cfg)
	if err != nil {
		t.Fatalf("snapshotter on a fake pool: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
