//go:build dm

package thinpool

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDiscardGivesBlocksBackToLoopFile: discarding a thin device gives
// the blocks only it maps back to the filesystem under the loop-file pool,
// leaves the blocks a snapshot shares with it and the snapshot's bytes as
// they were, and refuses a device open exclusively elsewhere. (That a
// delete alone gives nothing back is TestCleanupGivesBlocksBackToLoopFile's
// discard_blocks=false case.)
func TestDiscardGivesBlocksBackToLoopFile(t *testing.T) {
	ctx := context.Background()
	p, cfg := testPool(t, 256*mib)
	dataFile := filepath.Join(cfg.RootDir, DataFileName)
	allocated := func() int64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(dataFile, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	const size = 64 * mib
	nameA, nameB := p.name+"-a", p.name+"-b"
	a := openDirect(t, activeThin(t, ctx, p, 20, nameA, size))
	shared := pattern(20, 32*mib)
	a.mustWrite(0, shared)
	if err := p.CreateSnap(ctx, 21, 20); err != nil {
		t.Fatal(err)
	}
	a.mustWrite(32*mib, pattern(21, 16*mib)) // only a maps these
	a.f.Close()

	excl, err := os.OpenFile(DevicePath(nameA), os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "discard of a device open exclusively", p.Discard(ctx, nameA), ErrBusy)
	excl.Close()

	before := allocated()
	if err := p.Discard(ctx, nameA); err != nil {
		t.Fatal(err)
	}
	freed := before - allocated()
	t.Logf("data file: %d MiB allocated, %d MiB given back by discarding the device", before/mib, freed/mib)
	if freed < 15*mib || freed > 17*mib {
		t.Errorf("discarding gave back %d bytes of the data file, want the 16 MiB only the device mapped", freed)
	}
	a = openDirect(t, DevicePath(nameA))
	if got := a.read(0, mib); string(got) != string(make([]byte, mib)) {
		t.Error("the discarded device does not read zeros")
	}
	a.f.Close()
	bPath, err := p.Activate(ctx, nameB, 21, size)
	if err != nil {
		t.Fatal(err)
	}
	b := openDirect(t, bPath)
	mustEqual(t, "snapshot after its origin was discarded", b.read(0, 32*mib), shared)
	b.f.Close()

	// The blocks the snapshot shared are its own once the origin is
	// deleted, and go with its discard.
	if err := p.Deactivate(ctx, nameA); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, 20); err != nil {
		t.Fatal(err)
	}
	before = allocated()
	if err := p.Discard(ctx, nameB); err != nil {
		t.Fatal(err)
	}
	if freed := before - allocated(); freed < 31*mib || freed > 33*mib {
		t.Errorf("discarding the snapshot gave back %d bytes, want the 32 MiB it had shared", freed)
	}
}
