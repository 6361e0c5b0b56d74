package flock_test

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/flock"
)

// TestTryLock: a file's lock is taken once; a second open of it is
// refused with EWOULDBLOCK while the first holds it, and takes it once
// the first is closed.
func TestTryLock(t *testing.T) {
	first, err := os.CreateTemp(t.TempDir(), "lock")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := os.Open(first.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if err := flock.TryLock(first); err != nil {
		t.Fatalf("first lock: %v", err)
	}
	if err := flock.TryLock(second); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("lock held by another open: %v, want EWOULDBLOCK", err)
	}
	first.Close()
	if err := flock.TryLock(second); err != nil {
		t.Fatalf("lock after its holder closed: %v", err)
	}
}
