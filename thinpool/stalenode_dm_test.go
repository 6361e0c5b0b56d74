//go:build dm

package thinpool

import (
	"context"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenRemovesStaleNodes: a daemon killed inside Deactivate, after the
// kernel removed the device and before its node was removed, leaves
// /dev/mapper/NAME naming a freed device number that a later device may
// take. The next start's Open removes such a node of the pool's names; a
// live device's node, and a node of a name outside the pool's, stay.
func TestOpenRemovesStaleNodes(t *testing.T) {
	ctx := context.Background()
	p, cfg := testPool(t, 64<<20)
	stale, live := p.name+"-c1", p.name+"-c2"
	activeThin(t, ctx, p, 1, stale, 8<<20)
	livePath := activeThin(t, ctx, p, 2, live, 8<<20)
	// The kill: the kernel's removal done, the node's not.
	if err := p.ctl.remove(stale); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(DevicePath(stale)); err != nil {
		t.Fatalf("node of the removed device: %v; want it left, as the kill leaves it", err)
	}
	// A node of another name, stale too, that is not the pool's to sweep.
	other := "tp-other-stalenode"
	if err := unix.Mknod(DevicePath(other), unix.S_IFBLK|0o600, int(unix.Mkdev(250, 250))); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(DevicePath(other))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p2, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer p2.Close()
	if _, err := os.Lstat(DevicePath(stale)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale node %s after the next Open: %v; want it removed", DevicePath(stale), err)
	}
	if _, err := os.Lstat(livePath); err != nil {
		t.Errorf("node of live device %s: %v; want it kept", livePath, err)
	}
	if _, err := os.Lstat(DevicePath(other)); err != nil {
		t.Errorf("node %s outside the pool's names: %v; want it kept", DevicePath(other), err)
	}
}
