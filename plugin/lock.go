package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// LockFileName is the file in daemon.root_dir whose lock (flock) the
// daemon owning that root holds for its whole life; it holds the owner's
// pid.
const LockFileName = "daemon.lock"

// ErrLocked is matched by Open's error when another live process holds
// the lock of daemon.root_dir, or of the database.
var ErrLocked = errors.New("another daemon is running on this root or database")

// lockDaemon takes the locks of a daemon on root whose database is db:
// root's (lockRoot) and, when db is not in root, db's own (the file
// db + ".lock" beside it). Two daemons on two roots must not share a
// database either: each would reconcile the other's records against its
// own pool. The locks go with the returned files, and with the process.
func lockDaemon(root, db string) ([]*os.File, error) {
	rl, err := lockRoot(root)
	if err != nil {
		return nil, err
	}
	if filepath.Dir(filepath.Clean(db)) == filepath.Clean(root) {
		return []*os.File{rl}, nil
	}
	dl, err := lockPath(db + ".lock")
	if err != nil {
		rl.Close()
		return nil, err
	}
	return []*os.File{rl, dl}, nil
}

// LockDatabase takes, at once, the locks a daemon on the database at db
// holds for its whole life (lockDaemon): its root's, when db lies in a
// root (LockFileName beside it), and db's own (db + ".lock"). Only lock
// files that exist are taken, so none is made beside a database no daemon
// ran on. Each records this process's pid, as a daemon's does, so that a
// daemon starting meanwhile names it. A lock held by another process is
// an error matching ErrLocked and naming the holder. release drops them.
func LockDatabase(db string) (release func(), err error) {
	var held []*os.File
	release = func() {
		for _, f := range held {
			f.Close() // closing the file drops its lock
		}
	}
	for _, p := range []string{filepath.Join(filepath.Dir(db), LockFileName), db + ".lock"} {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		f, err := lockPath(p)
		if err != nil {
			release()
			return nil, err
		}
		held = append(held, f)
	}
	return release, nil
}

// lockRoot takes the exclusive lock of root (created 0700 if missing) at
// once or fails naming the lock file and the holder's pid. The lock goes
// with the returned file, and with the process.
func lockRoot(root string) (*os.File, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("lock %s: %w", root, err)
	}
	return lockPath(filepath.Join(root, LockFileName))
}

// lockPath takes the exclusive lock (flock) of the file at path, made if
// missing, at once or fails naming it and the holder's pid, and writes
// the process's pid into it.
func lockPath(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "unknown pid"
			if b, rerr := os.ReadFile(path); rerr == nil && strings.TrimSpace(string(b)) != "" {
				holder = "pid " + strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("lock %s is held by %s: %w", path, holder, ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: record pid: %w", path, err)
	}
	return f, nil
}
