package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

// openHolderPool is a fake at the pool's boundary: FakePool, whose held
// devices (FakePool.Hold: a VM given an activation's device path as its
// disk) refuse removal busy, as the kernel does, while Discard, whose
// exclusive open only conflicts with other exclusive holders (a mount),
// goes through. When busyWait is set, Deactivate of a held device keeps
// trying for that long (or until its context ends) before it gives up,
// as thinpool.Pool's does for about 5 s.
type openHolderPool struct {
	*thinpooltest.FakePool
	busyWait time.Duration
}

func (p *openHolderPool) Deactivate(ctx context.Context, name string) error {
	err := p.FakePool.Deactivate(ctx, name)
	if errors.Is(err, thinpool.ErrBusy) {
		select {
		case <-ctx.Done():
		case <-time.After(p.busyWait):
		}
	}
	return err
}

// TestReclaimSparesDeviceHeldOpen: the reclaim of a removed snapshot whose
// device is still held open neither discards nor deletes it (Cleanup
// reports it), and once it is let go the next Cleanup does both.
func TestReclaimSparesDeviceHeldOpen(t *testing.T) {
	bg := context.Background()
	for _, async := range []bool{true, false} {
		t.Run(fmt.Sprintf("async_remove=%v", async), func(t *testing.T) {
			pool := &openHolderPool{FakePool: thinpooltest.NewFakePool()}
			s, err := New(bg, metadatatest.Open(t), pool, Config{AsyncRemove: async, DiscardBlocks: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Prepare(bg, "vm-disk", ""); err != nil {
				t.Fatal(err)
			}
			name, _, id, err := s.DeviceOf(bg, "vm-disk")
			if err != nil {
				t.Fatal(err)
			}
			pool.Hold(name)
			if err := s.Remove(bg, "vm-disk"); err != nil {
				t.Fatal(err)
			}
			if err := s.Cleanup(bg); err == nil {
				t.Error("Cleanup reported no error for a removed device held open")
			}
			if got := pool.Discarded(); len(got) != 0 {
				t.Fatalf("discarded %v while a process holds it open: its data is gone under the holder", got)
			}
			if ok, _ := pool.ThinExists(bg, id); !ok {
				t.Fatalf("thin %d deleted while held open", id)
			}
			pool.Release(name)
			if err := s.Cleanup(bg); err != nil {
				t.Fatalf("Cleanup once let go: %v", err)
			}
			if got := pool.Discarded(); len(got) != 1 || got[0] != name {
				t.Errorf("discarded %v once let go, want [%s]", got, name)
			}
			if ok, _ := pool.ThinExists(bg, id); ok {
				t.Errorf("thin %d still in the pool once let go", id)
			}
		})
	}
}

// TestCleanupDoesNotWaitOutHeldDevices: a removed device held open stays
// so for as long as its holder runs (a VM on an activation a re-pull
// replaced), so a Cleanup, which the collector runs after each image it
// removes while the pool is full, must not wait out the pool's whole
// busy retry on it each time: it tries briefly and goes on.
func TestCleanupDoesNotWaitOutHeldDevices(t *testing.T) {
	bg := context.Background()
	pool := &openHolderPool{FakePool: thinpooltest.NewFakePool(), busyWait: 5 * time.Second}
	s, err := New(bg, metadatatest.Open(t), pool, Config{AsyncRemove: true, DiscardBlocks: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"vm-1", "vm-2"} {
		if _, err := s.Prepare(bg, key, ""); err != nil {
			t.Fatal(err)
		}
		name, _, _, err := s.DeviceOf(bg, key)
		if err != nil {
			t.Fatal(err)
		}
		pool.Hold(name)
		if err := s.Remove(bg, key); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := s.Cleanup(bg); err == nil {
		t.Error("Cleanup reported no error for removed devices held open")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Cleanup took %v over 2 removed devices held open: it waits out the pool's busy retry on each", took.Round(time.Millisecond))
	}
}
