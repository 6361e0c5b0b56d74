package thinpool

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestMetaSnapLockExcludesAnotherHolder checks that two handles on one
// pool (each with its own open file description, as two processes have)
// exclude each other: the second waits while the first holds the lock,
// gives up with its context, and gets the lock once it is released.
func TestMetaSnapLockExcludesAnotherHolder(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Name: "pool-a", RootDir: t.TempDir()}
	first, second := &Pool{cfg: cfg, name: cfg.Name}, &Pool{cfg: cfg, name: cfg.Name}
	if got, want := first.metaSnapLockPath(), filepath.Join(cfg.RootDir, MetadataSnapLockFileName); got != want {
		t.Fatalf("lock path %q, want %q", got, want)
	}
	unlockFirst, err := first.lockMetaSnap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if unlock, err := second.lockMetaSnap(short); !errors.Is(err, context.DeadlineExceeded) {
		if unlock != nil {
			unlock()
		}
		t.Fatalf("second lock while the first is held: got %v, want it to wait until its context ends", err)
	}
	var releasing atomic.Bool
	go func() {
		time.Sleep(50 * time.Millisecond)
		releasing.Store(true)
		unlockFirst()
	}()
	long, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	unlockSecond, err := second.lockMetaSnap(long)
	if err != nil {
		t.Fatalf("second lock after the first was released: %v", err)
	}
	if !releasing.Load() {
		t.Fatal("second lock granted while the first was still held")
	}
	unlockSecond()
	unlockAgain, err := first.lockMetaSnap(short)
	if err != nil {
		t.Fatalf("lock after both were released: %v", err)
	}
	unlockAgain()
}

// TestMetaSnapLockPathWithoutRootDir checks where a pool on given devices
// without a root directory keeps its lock: a name every process opening
// that pool derives alike.
func TestMetaSnapLockPathWithoutRootDir(t *testing.T) {
	p := &Pool{cfg: Config{Name: "pool-b"}, name: "pool-b"}
	if got, want := p.metaSnapLockPath(), "/dev/mapper/.thinpool/pool-b.metadata-snap.lock"; got != want {
		t.Fatalf("lock path %q, want %q", got, want)
	}
}
