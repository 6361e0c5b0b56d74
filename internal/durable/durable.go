// Package durable makes what was written to a filesystem survive a power
// cut: the parts of it that the file's own fsync does not cover.
package durable

import (
	"fmt"
	"os"
)

// SyncDir fsyncs directory dir, so that the names created, renamed or
// removed in it, and the sizes of its files set since, are on disk.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
