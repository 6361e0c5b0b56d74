package metadata

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestBackupNewKeepsADestWrittenMeanwhile: a file that appears at the
// destination while a backup that must not replace one is copying (a
// second `db backup` to the same name, started at the same time) is left
// as it is, and the backup fails saying the destination exists, without a
// temporary file left behind.
func TestBackupNewKeepsADestWrittenMeanwhile(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	dir := t.TempDir()
	dest := filepath.Join(dir, "backup.db")
	other := []byte("another backup's copy")
	backupHook = func(string) {
		if err := os.WriteFile(dest, other, 0o600); err != nil {
			t.Error(err)
		}
	}
	defer func() { backupHook = nil }()

	err := d.BackupNew(ctx, dest)
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("a backup that must not replace its destination, written meanwhile: %v, want an error saying it exists", err)
	}
	if got, rerr := os.ReadFile(dest); rerr != nil || string(got) != string(other) {
		t.Errorf("the destination written meanwhile now holds %d bytes (%v), not its own %q", len(got), rerr, other)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if isBackupTemp(e.Name()) {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}
