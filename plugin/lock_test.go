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
