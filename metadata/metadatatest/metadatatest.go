// Package metadatatest opens real metadata databases (SQLite files, every
// migration applied) for the tests of the packages that keep records in
// one, so that none of them opens, migrates and closes a database by hand.
package metadatatest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// Open opens a new database in a temporary folder of t, closed when t
// ends.
func Open(t testing.TB) *metadata.DB {
	t.Helper()
	return OpenPath(t, filepath.Join(t.TempDir(), "metadata.db"))
}

// OpenPath opens the database at path read-write, creating and migrating
// it as the daemon does, and closes it when t ends.
func OpenPath(t testing.TB, path string) *metadata.DB {
	t.Helper()
	db, err := metadata.Open(context.Background(), metadata.Options{Path: path})
	if err != nil {
		t.Fatalf("open database %s: %v", path, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
