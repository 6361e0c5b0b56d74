//go:build dm

package thinpool

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProbeLeftByKilledProcess: a process killed inside ThinExists, between
// creating its probe device and removing it, leaves the probe with the
// thin id's table in its inactive slot, which holds the thin id open in
// the pool. The owner's start-up (Open and Adjust) must remove it: until
// then the id cannot be deleted (EBUSY) and the pool cannot be removed.
func TestProbeLeftByKilledProcess(t *testing.T) {
	ctx := context.Background()
	p, cfg := testPool(t, 64*mib)
	if err := p.CreateThin(ctx, 7); err != nil {
		t.Fatal(err)
	}
	// The pid of a process that is gone.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	probe := fmt.Sprintf("thinpool-probe-%d-1", cmd.Process.Pid)
	if _, err := p.ctl.create(probe, ""); err != nil {
		t.Fatalf("create %q: %v", probe, err)
	}
	t.Cleanup(func() {
		if err := p.ctl.remove(probe); err != nil && !errors.Is(err, unix.ENXIO) {
			t.Errorf("cleanup: remove %q: %v", probe, err)
		}
	})
	table := []dmTarget{{Start: 0, Length: uint64(p.blockSize), Type: "thin", Params: p.devStr + " " + strconv.FormatUint(7, 10)}}
	if err := p.ctl.load(probe, table, true); err != nil {
		t.Fatalf("load the probe's table: %v", err)
	}

	// The daemon starts again.
	p2, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Adjust(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.ctl.info(probe); !errors.Is(err, unix.ENXIO) {
		t.Errorf("probe device %q of a dead process still there after Open and Adjust (info: %v)", probe, err)
	}
	if err := p2.Delete(ctx, 7); err != nil {
		t.Errorf("Delete(7) after a restart, the probe a killed ThinExists left on it: %v", err)
	}
}
