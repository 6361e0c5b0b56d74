//go:build dm

package thinpool

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// failingMetadataPool opens a pool whose metadata device is a linear
// device over a loop file, and returns it with a function that swaps that
// device for the error target: the metadata device fails from then on.
func failingMetadataPool(t *testing.T, ctx context.Context) (*Pool, func()) {
	t.Helper()
	dir := scratch.Dir(t, "tp-failmeta-")
	const metaSize, dataSize = 16 * mib, 64 * mib
	mk := func(name string, size int64) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
		return path
	}
	ml, err := attachLoop(mk("meta", metaSize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ml.Close() })
	dl, err := attachLoop(mk("data", dataSize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dl.Close() })
	ctl, err := control()
	if err != nil {
		t.Fatal(err)
	}
	mlDev, err := blockDevNumber(ml.Name())
	if err != nil {
		t.Fatal(err)
	}
	lin := "tp-failmeta-" + strings.ToLower(t.Name())
	if len(lin) > 60 {
		lin = lin[:60]
	}
	dev, err := ctl.create(lin, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.remove(lin); removeNode(lin) })
	if err := ctl.load(lin, []dmTarget{{Length: metaSize / 512, Type: "linear", Params: devString(mlDev) + " 0"}}, false); err != nil {
		t.Fatal(err)
	}
	if dev, err = ctl.resume(lin); err != nil {
		t.Fatal(err)
	}
	linPath, err := ensureNode(lin, dev)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Name: lin + "-pool", RootDir: dir, DataDevice: dl.Name(), MetadataDevice: linPath, NoSpaceTimeout: conf.D(testNoSpaceTimeout)}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.remove(cfg.Name); removeNode(cfg.Name) })
	if err := p.Adjust(ctx); err != nil {
		t.Fatal(err)
	}
	fail := func() {
		t.Helper()
		if err := ctl.load(lin, []dmTarget{{Length: metaSize / 512, Type: "error"}}, false); err != nil {
			t.Fatal(err)
		}
		if err := ctl.suspend(lin, false); err != nil {
			t.Fatal(err)
		}
		if _, err := ctl.resume(lin); err != nil {
			t.Fatal(err)
		}
	}
	return p, fail
}

// TestWatchFailedPoolIsNotLowWater: a pool whose metadata device fails
// goes to "Fail", whose status holds no block counts. Watch must not
// report that as the pool at or under its low-water mark (Event.LowWater:
// "the free data blocks are at or under the mark"; lowWaterNow: "nothing
// a handler could grow then").
func TestWatchFailedPoolIsNotLowWater(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, fail := failingMetadataPool(t, ctx)
	events := make(chan Event, 100)
	go p.Watch(ctx, func(_ context.Context, ev Event) { events <- ev })
	time.Sleep(200 * time.Millisecond)

	fail()
	_ = p.CreateThin(ctx, 1) // its commit fails: the pool fails
	if st, err := p.Status(ctx); err != nil || st.Mode != ModeFail {
		t.Fatalf("status after the metadata device failed: %+v, %v; want fail mode", st, err)
	}
	deadline := time.After(3 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.LowWater && ev.Status.TotalDataBlocks == 0 {
				t.Errorf("Watch reported a pool in %q mode, with no data block counts, as at or under its low-water mark: %+v", ev.Status.Mode, ev)
			}
		case <-deadline:
			return
		}
	}
}

// TestCreateOnFailingMetadataIsAnError: the kernel answers create_thin
// before committing it and ignores a failed commit (the pool aborts the
// transaction and fails), so a create whose commit failed came back as
// success though the device is not in the pool's metadata. The caller
// records a device the pool does not have: CreateThin must fail.
func TestCreateOnFailingMetadataIsAnError(t *testing.T) {
	ctx := context.Background()
	p, fail := failingMetadataPool(t, ctx)
	fail()
	err := p.CreateThin(ctx, 1)
	st, serr := p.Status(ctx)
	if err == nil {
		t.Errorf("CreateThin whose commit failed returned nil; the pool is now %+v (%v)", st, serr)
	}
}
