package durable

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestSyncDir: a directory syncs; one that does not exist is an error
// naming it.
func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	if err := SyncDir(dir); err != nil {
		t.Errorf("SyncDir(%s): %v", dir, err)
	}
	missing := filepath.Join(dir, "missing")
	if err := SyncDir(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("SyncDir of a missing directory: %v, want an error naming it", err)
	}
}
