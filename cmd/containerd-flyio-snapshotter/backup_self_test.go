package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// TestDBBackupRefusesTheDatabase: `db backup --force` naming the live
// database (or its -wal or -shm file) as DEST, under any spelling, is
// refused and leaves the database whole. Renaming the copy over the file
// the daemon has open would leave the daemon writing to an unlinked file
// and its write-ahead log replayed onto the copy: the next open finds a
// corrupt database.
func TestDBBackupRefusesTheDatabase(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.db")
	populate(t, path, time.Now())
	ctx := context.Background()
	// The daemon: a writer with the database open, its last commits still
	// in the write-ahead log.
	daemon, err := metadata.Open(ctx, metadata.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer daemon.Close()
	insert := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := daemon.Statements().ExecContext(ctx, `INSERT INTO s3_images (image_id, source, created_ns, pulled_ns) VALUES (?, ?, 1, 1)`,
				fmt.Sprintf("img-%d", i), fmt.Sprintf("s3://bkt/x/%d.tar", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	insert(0, 50)
	// The same file through a symlinked directory.
	other := filepath.Join(t.TempDir(), "state")
	if err := os.Symlink(dir, other); err != nil {
		t.Fatal(err)
	}
	for _, dest := range []string{path, filepath.Join(other, "m.db"), path + "-wal", path + "-shm"} {
		code, out, errOut := runCommand(t, nil, "db", "backup", "--force", "--db", path, dest)
		if code != 1 || out != "" || !strings.Contains(errOut, "is the database") {
			t.Errorf("db backup --force over %s = %d, %q, %q; want 1, refused as the database itself", dest, code, out, errOut)
		}
	}
	insert(50, 400)
	if code, out, errOut := runCommand(t, nil, "db", "check", "--db", path); code != 0 {
		t.Errorf("db check after the backups = %d, %q, %q", code, out, errOut)
	}
}
