package metadata

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/flock"
)

// A backup writes its copy to a temporary file beside its destination,
// <dest>.flyio-snapshotter-tmp-<digits>, and holds an exclusive flock on
// that file from its creation until it is renamed over dest or removed. A
// process killed midway cannot remove its file, but the kernel drops its
// lock: every backup removes, in its destination's directory, the files of
// that naming whose lock nobody holds, and leaves alone those a live backup
// is writing; a read-write Open does the same in the database's directory
// (the daemon's start). The lock is what tells the two apart; neither the
// file's age nor a process id can (a backup of a large database takes
// long, a process id is reused and means nothing across PID namespaces).
// The sweep covers the whole directory, not only the temporary files of
// the same destination, because backups are often written under a new
// name each time (dated): the name's marker, which only this package
// writes, is what makes that safe. SQLite's own locks on the file are
// POSIX record locks, which flock does not interfere with.
//
// An anonymous file (O_TMPFILE) linked in at the end would vanish by
// itself on a kill, but VACUUM INTO and the ATTACH that checks the
// pre-migration copy open the copy by path, which an anonymous file has
// not.

// backupTempMarker separates a temporary file's destination name from
// the random digits os.CreateTemp puts in its place of "*".
const backupTempMarker = ".flyio-snapshotter-tmp-"

// backupTempPattern is the os.CreateTemp pattern of dest's temporary files.
func backupTempPattern(dest string) string { return filepath.Base(dest) + backupTempMarker + "*" }

// isBackupTemp says whether name (a base name) is one os.CreateTemp makes
// from a backupTempPattern: a destination's name, the marker, then decimal
// digits only.
func isBackupTemp(name string) bool {
	i := strings.LastIndex(name, backupTempMarker)
	if i <= 0 {
		return false
	}
	digits := name[i+len(backupTempMarker):]
	if digits == "" {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// createBackupTemp creates an empty temporary file for a backup to dest and
// returns it locked; the lock lasts until the file is closed, which the
// caller does once the file is renamed or removed.
func createBackupTemp(dest string) (*os.File, error) {
	// Each retry follows another backup's sweep taking the new file in the
	// instant between its creation and its lock: a few tries suffice.
	const tries = 100
	for try := 0; try < tries; try++ {
		f, err := os.CreateTemp(filepath.Dir(dest), backupTempPattern(dest))
		if err != nil {
			return nil, err
		}
		err = flock.TryLock(f)
		if err == nil {
			// Between its creation and the lock, another backup's sweep
			// may have found the file unlocked and removed it: it is ours
			// only if its name still leads to it.
			if fi, ferr := f.Stat(); ferr == nil {
				if pi, perr := os.Stat(f.Name()); perr == nil && os.SameFile(fi, pi) {
					return f, nil
				}
			}
			f.Close()
			continue
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			continue // a sweep holds it, and removes it
		}
		_ = os.Remove(f.Name())
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return nil, fmt.Errorf("create a temporary file beside %s: %d files in a row were taken by other backups' sweeps", dest, tries)
}

// removeStaleBackupTemps removes, in dir, the temporary files of backups
// whose processes died before they finished: those whose lock nobody
// holds. A file it cannot examine or remove is logged and left; the caller
// goes on.
func removeStaleBackupTemps(ctx context.Context, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		log.G(ctx).WithError(err).WithField("dir", dir).Warn("metadata: listing left-over backup files")
		return
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !isBackupTemp(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		removed, err := removeIfUnlocked(p)
		switch {
		case err != nil:
			log.G(ctx).WithError(err).WithField("file", p).Warn("metadata: removing a backup's left-over temporary file")
		case removed:
			log.G(ctx).WithField("file", p).Info("metadata: removed the temporary file of a backup that did not finish")
		}
	}
}

// removeIfUnlocked removes p if no live backup holds its lock, holding the
// lock itself while it removes it, so that a backup that has just created
// p and not yet locked it finds its file gone and makes another.
func removeIfUnlocked(p string) (bool, error) {
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := flock.TryLock(f); errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil // a live backup's
	} else if err != nil {
		return false, fmt.Errorf("lock %s: %w", p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	if pi, err := os.Stat(p); err != nil || !os.SameFile(fi, pi) {
		return false, nil // removed, or replaced, since it was opened
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	return true, nil
}
