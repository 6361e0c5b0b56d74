//go:build dm

package thinpool

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestActivateFinishesDeviceLeftWithoutTable makes the devices a process
// killed inside Activate leaves (created with our name and uuid, but with
// no table, or with its table loaded but never resumed) and checks that
// Activate finishes them into working devices, while a device of that name
// it did not make (another uuid, another thin id's uuid, no uuid) is still
// refused and left alone.
func TestActivateFinishesDeviceLeftWithoutTable(t *testing.T) {
	ctx := context.Background()
	p, _ := testPool(t, 128*mib)
	for _, id := range []uint32{1, 2} {
		if err := p.CreateThin(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	const size = 16 * mib
	// leftover creates device name without a live table, as a crash
	// leaves it, and removes it when the test ends if nothing else did.
	leftover := func(name, uuid string) {
		t.Helper()
		if _, err := p.ctl.create(name, uuid); err != nil {
			t.Fatalf("create %q (uuid %q) without a table: %v", name, uuid, err)
		}
		t.Cleanup(func() {
			if err := p.ctl.remove(name); err != nil && !errors.Is(err, unix.ENXIO) {
				t.Errorf("cleanup: remove %q: %v", name, err)
			}
			removeNode(name)
		})
	}
	thinTable := func(id uint32) []dmTarget {
		return []dmTarget{{Start: 0, Length: size / 512, Type: "thin", Params: p.devStr + " " + strconv.FormatUint(uint64(id), 10)}}
	}

	noTable := p.name + "-notable"
	leftover(noTable, p.thinUUID(noTable, 1))
	path, err := p.Activate(ctx, noTable, 1, size)
	if err != nil {
		t.Fatalf("Activate over a device left without a table: %v", err)
	}
	if path != DevicePath(noTable) {
		t.Fatalf("Activate returned %q, want %q", path, DevicePath(noTable))
	}
	d := openDirect(t, path)
	d.mustWrite(mib, pattern(7, mib))
	d.f.Close()
	// The data lands in thin 1: it is there after the device is made anew.
	if err := p.Deactivate(ctx, noTable); err != nil {
		t.Fatal(err)
	}
	if path, err = p.Activate(ctx, noTable, 1, size); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "data written through the finished device, read after reactivation", openDirect(t, path).read(mib, mib), pattern(7, mib))

	loaded := p.name + "-loaded"
	leftover(loaded, p.thinUUID(loaded, 2))
	if err := p.ctl.load(loaded, thinTable(2), false); err != nil {
		t.Fatal(err)
	}
	if path, err = p.Activate(ctx, loaded, 2, size); err != nil {
		t.Fatalf("Activate over a device left with its table loaded but not resumed: %v", err)
	}
	if got, err := deviceSize(path); err != nil || got != size {
		t.Fatalf("size of %s = %d, %v; want %d", path, got, err, size)
	}
	devs, err := p.ActiveDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []ActiveDevice{{Name: loaded, ThinID: 2, Sectors: size / 512}, {Name: noTable, ThinID: 1, Sectors: size / 512}}
	for i := range devs {
		devs[i].Major, devs[i].Minor = 0, 0
	}
	if !reflect.DeepEqual(devs, want) {
		t.Fatalf("ActiveDevices = %+v, want %+v", devs, want)
	}

	missing := p.name + "-missing"
	leftover(missing, p.thinUUID(missing, 9))
	_, err = p.Activate(ctx, missing, 9, size)
	wantErr(t, "finishing a device left without a table for a thin id not in the pool", err, ErrNotFound)
	if ok, err := p.IsActive(ctx, missing); err != nil || ok {
		t.Fatalf("IsActive(%q) after the refused activation = %v, %v; want the leftover removed", missing, ok, err)
	}

	for _, c := range []struct{ what, name, uuid string }{
		{"another tool's uuid", p.name + "-foreign", "other-tool-device"},
		{"the uuid of another thin id", p.name + "-otherid", p.thinUUID(p.name+"-otherid", 2)},
		{"no uuid", p.name + "-nouuid", ""},
	} {
		leftover(c.name, c.uuid)
		_, err := p.Activate(ctx, c.name, 1, size)
		wantErr(t, "activating over a device without a table with "+c.what, err, ErrExists)
		info, err := p.ctl.info(c.name)
		if err != nil || info.hasLiveTable() || info.UUID != c.uuid {
			t.Fatalf("device with %s after the refused activation: %+v, %v; want it left as it was", c.what, info, err)
		}
	}
}

// TestThinIDsWaitsForAnotherReader holds the pool's metadata snapshot the
// way another process's ThinIDs does (its lock, then the snapshot) and
// checks that ThinIDs waits for it instead of releasing it under that
// reader, then lists the ids once the reader is done.
func TestThinIDsWaitsForAnotherReader(t *testing.T) {
	ctx := context.Background()
	p, cfg := testPool(t, 64*mib)
	if err := p.CreateThin(ctx, 5); err != nil {
		t.Fatal(err)
	}
	// Another handle on the pool opens the lock file anew, as another
	// process does: flock excludes open file descriptions.
	other, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := other.lockMetaSnap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.ctl.message(other.name, "reserve_metadata_snap"); err != nil {
		unlock()
		t.Fatal(err)
	}
	st, err := p.Status(ctx)
	if err != nil || !st.HasHeldRoot {
		unlock()
		t.Fatalf("status after reserve_metadata_snap: %+v, %v; want a held root", st, err)
	}
	held := st.HeldMetadataRoot

	type result struct {
		ids []uint32
		err error
	}
	done := make(chan result, 1)
	go func() {
		ids, err := p.ThinIDs(ctx)
		done <- result{ids, err}
	}()
	select {
	case r := <-done:
		unlock()
		t.Fatalf("ThinIDs returned %v, %v while another reader held the metadata snapshot; want it to wait", r.ids, r.err)
	case <-time.After(time.Second):
	}
	st, err = p.Status(ctx)
	if err != nil || !st.HasHeldRoot || st.HeldMetadataRoot != held {
		unlock()
		t.Fatalf("status while ThinIDs waits: %+v, %v; want the other reader's snapshot (root %d) still held", st, err, held)
	}
	err = other.ctl.message(other.name, "release_metadata_snap")
	unlock()
	if err != nil {
		t.Fatalf("the other reader releasing its own snapshot: %v", err)
	}
	select {
	case r := <-done:
		if r.err != nil || !reflect.DeepEqual(r.ids, []uint32{5}) {
			t.Fatalf("ThinIDs after the other reader finished = %v, %v; want [5]", r.ids, r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ThinIDs still waiting a minute after the other reader released its lock")
	}
	if st, err := p.Status(ctx); err != nil || st.HasHeldRoot {
		t.Fatalf("status after ThinIDs: %+v, %v; want no snapshot left held", st, err)
	}
}

// TestThinIDsFromTwoHandles runs ThinIDs over and over from two handles on
// one pool at once, as the daemon and the CLI do: each call must list the
// ids, none may release the other's metadata snapshot.
func TestThinIDsFromTwoHandles(t *testing.T) {
	ctx := context.Background()
	p, cfg := testPool(t, 64*mib)
	for _, id := range []uint32{3, 8} {
		if err := p.CreateThin(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	other, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 25
	errs := make(chan error, 2*rounds)
	var wg sync.WaitGroup
	for _, h := range []*Pool{p, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ids, err := h.ThinIDs(ctx)
				if err == nil && !reflect.DeepEqual(ids, []uint32{3, 8}) {
					err = fmt.Errorf("ThinIDs listed %v, want [3 8]", ids)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st, err := p.Status(ctx); err != nil || st.HasHeldRoot {
		t.Fatalf("status after the readers: %+v, %v; want no snapshot left held", st, err)
	}
}

// TestThinIDsReleasesSnapshotOfDeadReader leaves a metadata snapshot held
// with nobody holding the lock, as a reader that died leaves it, and
// checks that ThinIDs releases it and lists the ids.
func TestThinIDsReleasesSnapshotOfDeadReader(t *testing.T) {
	ctx := context.Background()
	p, _ := testPool(t, 64*mib)
	if err := p.CreateThin(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if err := p.ctl.message(p.name, "reserve_metadata_snap"); err != nil {
		t.Fatal(err)
	}
	if ids, err := p.ThinIDs(ctx); err != nil || !reflect.DeepEqual(ids, []uint32{4}) {
		t.Fatalf("ThinIDs with a snapshot left held = %v, %v; want [4]", ids, err)
	}
	if st, err := p.Status(ctx); err != nil || st.HasHeldRoot {
		t.Fatalf("status after ThinIDs: %+v, %v; want no snapshot left held", st, err)
	}
}
