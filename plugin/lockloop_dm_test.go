//go:build dm

package plugin

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// attachLoop attaches a loop device to file until the test ends and
// returns its node (a test of the VM harness, which has loop devices).
func attachLoop(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup %s: %v: %s", file, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// TestLockPoolLoopDeviceOfLoopFile: a pool whose data_device is the loop
// device a loop-file pool's data file is attached to (a node an operator
// set up by hand once, which a reboot gave to another file) shares that
// pool's backing store, and is refused while the loop-file pool's daemon
// runs, and the other way round.
func TestLockPoolLoopDeviceOfLoopFile(t *testing.T) {
	dir := t.TempDir()
	poolLockDir = filepath.Join(dir, "run-lock")
	t.Cleanup(func() { poolLockDir = PoolLockDir })
	files := hostDaemonConfig(t, dir, "files").ThinpoolConfig()
	if err := os.MkdirAll(files.RootDir, 0o700); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(files.RootDir, thinpool.DataFileName)
	if err := os.WriteFile(data, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	block := hostDaemonConfig(t, dir, "block").ThinpoolConfig()
	block.DataDevice = attachLoop(t, data)
	block.MetadataDevice = filepath.Join(dir, "meta")
	mknodBlock(t, block.MetadataDevice, 7, 1000)
	block.DataSize, block.MetadataSize = 0, 0

	for _, order := range [][2]thinpool.Config{{files, block}, {block, files}} {
		first, second := order[0], order[1]
		held, err := lockPool(first)
		if err != nil {
			t.Fatalf("pool %s alone: %v", first.Name, err)
		}
		got, err := lockPool(second)
		for _, f := range append(held, got...) {
			f.Close()
		}
		if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), data+".lock") {
			t.Errorf("pool %s while pool %s runs, both on %s: %v, want %v naming %s.lock", second.Name, first.Name, data, err, ErrLocked, data)
		}
	}
}
