package plugin

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLockRootSingleInstance: while one owner holds the root's lock a
// second is refused at once, naming the lock file and the holder's pid,
// and the lock file is left as it was; once released the next owner gets
// it.
func TestLockRootSingleInstance(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	first, err := lockRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, LockFileName)
	before, err := os.ReadFile(path)
	if err != nil || string(before) != strconv.Itoa(os.Getpid())+"\n" {
		t.Fatalf("lock file holds %q (%v), want our pid", before, err)
	}
	second, err := lockRoot(root)
	if !errors.Is(err, ErrLocked) || second != nil {
		t.Fatalf("second lock: %v, want %v", err, ErrLocked)
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("refusal %q does not name %s and the holder's pid", msg, path)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Errorf("the refused owner changed the lock file: %q", after)
	}
	first.Close()
	third, err := lockRoot(root)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	third.Close()
}

// TestLockDaemonSharedDatabase: two daemons on two roots that name one
// database outside both are refused like two on one root, naming the
// database's lock; a database inside its root takes the root's lock only
// (nothing more beside it), and two roots with their own databases do
// not stand in each other's way.
func TestLockDaemonSharedDatabase(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared", "metadata.db")
	if err := os.MkdirAll(filepath.Dir(shared), 0o700); err != nil {
		t.Fatal(err)
	}
	first, err := lockDaemon(filepath.Join(dir, "a"), shared)
	if err != nil {
		t.Fatal(err)
	}
	second, err := lockDaemon(filepath.Join(dir, "b"), shared)
	if !errors.Is(err, ErrLocked) || second != nil || !strings.Contains(err.Error(), shared+".lock") {
		t.Fatalf("a second daemon on database %s from another root: %v, want %v naming %s.lock", shared, err, ErrLocked, shared)
	}
	// The refused daemon let go of its root's lock too.
	b, err := lockRoot(filepath.Join(dir, "b"))
	if err != nil {
		t.Fatalf("root b after the refusal: %v", err)
	}
	b.Close()
	for _, l := range first {
		l.Close()
	}

	own := filepath.Join(dir, "c", "metadata.db")
	c, err := lockDaemon(filepath.Join(dir, "c"), own)
	if err != nil || len(c) != 1 {
		t.Fatalf("a daemon whose database is in its root: %d locks, %v; want the root's only", len(c), err)
	}
	if _, err := os.Stat(own + ".lock"); !os.IsNotExist(err) {
		t.Errorf("a lock beside a database inside its root: %v", err)
	}
	d, err := lockDaemon(filepath.Join(dir, "d"), filepath.Join(dir, "d", "metadata.db"))
	if err != nil {
		t.Fatalf("a daemon on another root and database: %v", err)
	}
	for _, l := range append(c, d...) {
		l.Close()
	}
}
