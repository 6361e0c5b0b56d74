//go:build dm

package thinpool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestReopenThroughSymlinkedRootDir: a pool.root_dir reached through a
// symlink (a host's /var/lib on a data disk) names the loop files the
// pool runs on, though the kernel gives their backing file by its real
// path: a daemon restart, and a reader such as pool status, adopt the
// active pool instead of refusing it as another pool's.
func TestReopenThroughSymlinkedRootDir(t *testing.T) {
	ctx := context.Background()
	_, cfg := testPool(t, 64*mib)
	link := filepath.Join(filepath.Dir(cfg.RootDir), filepath.Base(cfg.RootDir)+"-link")
	if err := os.Symlink(cfg.RootDir, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(link) })
	viaLink := cfg
	viaLink.RootDir = link
	if _, err := Open(ctx, viaLink); err != nil {
		t.Errorf("Open of the active pool through a symlinked root dir: %v", err)
	}
	if _, err := OpenActive(ctx, viaLink); err != nil {
		t.Errorf("OpenActive of the active pool through a symlinked root dir: %v", err)
	}
	// Another root directory still names another pool's files.
	other := cfg
	other.RootDir = t.TempDir()
	if _, err := OpenActive(ctx, other); !errors.Is(err, ErrExists) {
		t.Errorf("OpenActive of the active pool from another root dir: %v, want ErrExists", err)
	}
}
