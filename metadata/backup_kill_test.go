package metadata

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// killChildPausedInBackup runs a child in role (backup-pause or
// migrate-backup-pause) with env, waits until its backup has written its
// temporary file, kills it with SIGKILL and returns that file's name.
func killChildPausedInBackup(t *testing.T, role string, env ...string) string {
	t.Helper()
	cmd, out := startChild(t, role, env...)
	tmp := strings.TrimPrefix(waitLine(t, out, "PAUSED "), "PAUSED ")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v", err)
	}
	if !exists(tmp) {
		t.Fatalf("the killed backup's temporary file %s is not there to clean up", tmp)
	}
	return tmp
}

// TestBackupKilledMidwayLeavesNoTempFile: a backup killed (SIGKILL) after
// writing its temporary copy and before renaming it leaves that file; the
// next backup into the same directory removes it, also when it is written
// under another name (dated backups), and leaves other programs' files.
func TestBackupKilledMidwayLeavesNoTempFile(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	dir := t.TempDir()
	dest := filepath.Join(dir, "backup-1.db")
	tmp := killChildPausedInBackup(t, "backup-pause", "METADATA_TEST_DB="+d.Path(), "BACKUP_DEST="+dest)
	// Not names the backup gives its temporary files: someone else's.
	others := []string{dest + ".tmp-1", dest + ".flyio-snapshotter-tmp-old", filepath.Join(dir, ".flyio-snapshotter-tmp-1")}
	for _, o := range others {
		if err := os.WriteFile(o, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Backup(ctx, filepath.Join(dir, "backup-2.db")); err != nil {
		t.Fatal(err)
	}
	if exists(tmp) {
		t.Errorf("after a backup killed midway and a second backup into %s, %s is left", dir, tmp)
	}
	for _, o := range others {
		if !exists(o) {
			t.Errorf("the backup removed %s, not one of its temporary files", o)
		}
	}
	openReadOnlyAtVersion(t, filepath.Join(dir, "backup-2.db"), LatestVersion(), "the second backup").Close()
}

// TestOpenRemovesTheTempFileOfABackupKilledMidway: the daemon's start (a
// read-write open) removes what a backup killed midway left in the
// database's directory.
func TestOpenRemovesTheTempFileOfABackupKilledMidway(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	dir := filepath.Dir(d.Path())
	tmp := killChildPausedInBackup(t, "backup-pause", "METADATA_TEST_DB="+d.Path(), "BACKUP_DEST="+filepath.Join(dir, "copy.db"))
	d2, err := Open(ctx, Options{Path: d.Path()})
	if err != nil {
		t.Fatal(err)
	}
	d2.Close()
	if exists(tmp) {
		t.Errorf("after a backup killed midway and a read-write open, %s is left", tmp)
	}
}

// TestCopyBeforeMigrationKilledMidwayLeavesNoTempFile: an open killed while
// copying the database before migrating it leaves <db>.pre-v<N>.tmp-*; the
// next open, which migrates and copies again, removes it.
func TestCopyBeforeMigrationKilledMidwayLeavesNoTempFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	d, err := Open(ctx, Options{Path: path, MigrateTo: 7})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	tmp := killChildPausedInBackup(t, "migrate-backup-pause", "METADATA_TEST_DB="+path)
	d, err = Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if exists(tmp) {
		t.Errorf("after an open killed while copying before migrating and a second open, %s is left", tmp)
	}
	openReadOnlyAtVersion(t, path+".pre-v8", 7, "the copy before migrating").Close()
}

// TestBackupKeepsAnotherBackupInProgress: a backup to a destination another
// live process is backing up to at the same time leaves that process's
// temporary file alone, and both backups complete.
func TestBackupKeepsAnotherBackupInProgress(t *testing.T) {
	ctx := context.Background()
	d := openTestDB(t)
	dir := t.TempDir()
	dest, release := filepath.Join(dir, "backup.db"), filepath.Join(dir, "release")
	cmd, out := startChild(t, "backup-pause", "METADATA_TEST_DB="+d.Path(), "BACKUP_DEST="+dest, "RELEASE_FILE="+release)
	tmp := strings.TrimPrefix(waitLine(t, out, "PAUSED "), "PAUSED ")
	if err := d.Backup(ctx, dest); err != nil {
		t.Fatal(err)
	}
	if !exists(tmp) {
		t.Errorf("a second backup removed the temporary file %s of a backup in progress", tmp)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitLine(t, out, "BACKED UP")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the first backup: %v", err)
	}
	openReadOnlyAtVersion(t, dest, LatestVersion(), "the backup").Close()
}
