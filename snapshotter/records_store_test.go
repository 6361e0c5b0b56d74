package snapshotter

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
)

func openSnapStore(t *testing.T) (*metadata.DB, context.Context) {
	t.Helper()
	return metadatatest.Open(t), context.Background()
}

func snapTx(t *testing.T, ctx context.Context, db *metadata.DB, fn func(q Records) error) error {
	t.Helper()
	return db.WithTx(ctx, func(tx *sql.Tx) error { return fn(RecordsTx(tx)) })
}

func mustSnapTx(t *testing.T, ctx context.Context, db *metadata.DB, fn func(q Records) error) {
	t.Helper()
	if err := snapTx(t, ctx, db, fn); err != nil {
		t.Fatal(err)
	}
}

func thinDev(id uint32, state string) ThinDevice {
	return ThinDevice{ID: id, Name: fmt.Sprintf("pool-snap-%d", id), Role: ThinRoleSnapshot,
		State: state, SizeBytes: 1 << 30, FSType: "ext4", CreatedNs: 1, UpdatedNs: 1}
}

func TestSnapshotRecordsRoundTripAndCommit(t *testing.T) {
	db, ctx := openSnapStore(t)
	var parentID, childID int64
	mustSnapTx(t, ctx, db, func(q Records) error {
		if err := q.InsertThinDevice(ctx, thinDev(10, ThinStateActive)); err != nil {
			return err
		}
		var err error
		parentID, err = q.InsertSnapshot(ctx, CDSnapshot{Key: "layer-a", Kind: SnapKindActive, DeviceID: 10,
			Labels: map[string]string{"containerd.io/gc.root": "x", "k": "v"}, CreatedNs: 100, UpdatedNs: 100})
		return err
	})
	mustSnapTx(t, ctx, db, func(q Records) error {
		if err := q.commitSnapshot(ctx, parentID, "sha256:aaa", map[string]string{"containerd.io/snapshot.ref": "sha256:aaa"}, 200, 4096, 0); err != nil {
			return err
		}
		return q.setThinDeviceState(ctx, 10, ThinStateInactive, 200)
	})
	mustSnapTx(t, ctx, db, func(q Records) error {
		if err := q.InsertThinDevice(ctx, thinDev(11, ThinStateActive)); err != nil {
			return err
		}
		var err error
		childID, err = q.InsertSnapshot(ctx, CDSnapshot{Key: "child", Kind: SnapKindView, ParentID: parentID, DeviceID: 11, CreatedNs: 300, UpdatedNs: 300})
		return err
	})

	r := ReadRecords(db)
	old, ok, err := r.Snapshot(ctx, "layer-a")
	if err != nil || ok {
		t.Fatalf("key before commit still found: ok=%v err=%v (%+v)", ok, err, old)
	}
	p, ok, err := r.Snapshot(ctx, "sha256:aaa")
	if err != nil || !ok {
		t.Fatalf("committed snapshot not found: ok=%v err=%v", ok, err)
	}
	if p.Kind != SnapKindCommitted || p.SizeBytes != 4096 || p.CreatedNs != 200 || p.UpdatedNs != 200 || p.DeviceName != thinDev(10, "").Name {
		t.Fatalf("committed record = %+v", p)
	}
	if len(p.Labels) != 1 || p.Labels["containerd.io/snapshot.ref"] != "sha256:aaa" {
		t.Fatalf("labels after commit = %v, want only the commit's labels", p.Labels)
	}
	c, ok, err := r.Snapshot(ctx, "child")
	if err != nil || !ok {
		t.Fatalf("child not found: ok=%v err=%v", ok, err)
	}
	if c.ParentKey != "sha256:aaa" || c.ParentID != parentID || c.Labels != nil {
		t.Fatalf("child record = %+v, want parent sha256:aaa and nil labels", c)
	}
	// The snapshot.ref lookup: by label only (containerd then walks by it), same
	// parent only.
	const ref = "containerd.io/snapshot.ref"
	for _, tc := range []struct{ target, parent, want string }{
		{"sha256:aaa", "", "sha256:aaa"},
		{"sha256:aaa", "other-parent", ""},
		{"sha256:bbb", "", ""},
	} {
		got, err := r.refTarget(ctx, ref, tc.target, tc.parent)
		if err != nil || got != tc.want {
			t.Errorf("refTarget(%q, parent %q) = %q, %v; want %q", tc.target, tc.parent, got, err, tc.want)
		}
	}
	if n, err := r.childCount(ctx, parentID); err != nil || n != 1 {
		t.Fatalf("childCount = %d, %v; want 1", n, err)
	}
	all, err := r.Snapshots(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("Snapshots(default) = %d rows, %v; want 2", len(all), err)
	}
	// A parent with children cannot be deleted (foreign key).
	if err := snapTx(t, ctx, db, func(q Records) error { return q.deleteSnapshot(ctx, parentID) }); err == nil {
		t.Fatal("deleting a parent with a child succeeded")
	}
	// RemoveSnapshot refuses a parent, removes a leaf and marks its device.
	mustSnapTx(t, ctx, db, func(q Records) error {
		if _, children, found, err := q.RemoveSnapshot(ctx, "sha256:aaa", 400); err != nil || !found || children != 1 {
			return fmt.Errorf("RemoveSnapshot(parent) = children %d found %v err %v; want 1 child, refused", children, found, err)
		}
		if _, _, found, err := q.RemoveSnapshot(ctx, "nope", 400); err != nil || found {
			return fmt.Errorf("RemoveSnapshot(absent) found=%v err=%v", found, err)
		}
		d, children, found, err := q.RemoveSnapshot(ctx, "child", 400)
		if err != nil || !found || children != 0 || d.ID != 11 || d.State != ThinStateRemoved {
			return fmt.Errorf("RemoveSnapshot(child) = %+v, %d, %v, %v", d, children, found, err)
		}
		return nil
	})
	if _, ok, _ := r.snapshotByID(ctx, childID); ok {
		t.Fatal("removed snapshot still recorded")
	}
	if d, _, _ := r.thinDevice(ctx, 11); d.State != ThinStateRemoved {
		t.Fatalf("device of the removed snapshot is %q, want removed", d.State)
	}
	counts, err := r.DeviceStateCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts["committed"] != 1 || counts["view"] != 0 || counts["removed-pending"] != 1 || counts["active"] != 0 {
		t.Fatalf("counts = %v", counts)
	}
}

func TestDuplicateKeysAndIntentsAreRefused(t *testing.T) {
	db, ctx := openSnapStore(t)
	mustSnapTx(t, ctx, db, func(q Records) error {
		if err := q.InsertThinDevice(ctx, thinDev(20, ThinStateActive)); err != nil {
			return err
		}
		_, err := q.InsertSnapshot(ctx, CDSnapshot{Key: "k", Kind: SnapKindActive, DeviceID: 20, CreatedNs: 1, UpdatedNs: 1})
		return err
	})
	if err := snapTx(t, ctx, db, func(q Records) error {
		if err := q.InsertThinDevice(ctx, thinDev(21, ThinStateActive)); err != nil {
			return err
		}
		_, err := q.InsertSnapshot(ctx, CDSnapshot{Key: "k", Kind: SnapKindActive, DeviceID: 21, CreatedNs: 1, UpdatedNs: 1})
		return err
	}); err == nil {
		t.Fatal("second snapshot with the same key was accepted")
	}
	// The failed transaction left nothing behind.
	if _, ok, _ := ReadRecords(db).thinDevice(ctx, 21); ok {
		t.Fatal("device of the rolled-back transaction is recorded")
	}

	var intentID int64
	mustSnapTx(t, ctx, db, func(q Records) error {
		var err error
		intentID, err = q.insertIntent(ctx, DeviceIntent{Op: intentCreate, DeviceID: 30, Name: "pool-snap-30", OriginID: 20, Key: "new", CreatedNs: 5})
		return err
	})
	for _, in := range []DeviceIntent{
		{Op: intentCreate, DeviceID: 30, Name: "x", Key: "other", CreatedNs: 6},       // same id
		{Op: intentCreate, DeviceID: 31, Name: "y", Key: "new", CreatedNs: 6},         // same key
		{Op: "frobnicate", DeviceID: 32, Name: "z", Key: "third", CreatedNs: 6},       // unknown op
		{Op: intentCreate, DeviceID: 1 << 24, Name: "w", Key: "fourth", CreatedNs: 6}, // beyond 24 bits
	} {
		if err := snapTx(t, ctx, db, func(q Records) error { _, err := q.insertIntent(ctx, in); return err }); err == nil {
			t.Errorf("intent %+v accepted", in)
		}
	}
	r := ReadRecords(db)
	if res, _ := r.keyReserved(ctx, "new"); !res {
		t.Fatal("intent does not reserve its key")
	}
	if n, _ := r.intentsWithOrigin(ctx, 20); n != 1 {
		t.Fatalf("intentsWithOrigin(20) = %d, want 1", n)
	}
	ins, err := r.Intents(ctx)
	if err != nil || len(ins) != 1 || ins[0].ID != intentID || ins[0].OriginID != 20 || ins[0].Key != "new" {
		t.Fatalf("Intents = %+v, %v", ins, err)
	}
	// Base intents carry no key; several may not share an id but need no key.
	mustSnapTx(t, ctx, db, func(q Records) error {
		_, err := q.insertIntent(ctx, DeviceIntent{Op: intentFormatBase, DeviceID: 40, Name: "pool-base-40", CreatedNs: 7})
		return err
	})
}

func TestThinIDUsedCoversDevicesIntentsAndQuarantine(t *testing.T) {
	db, ctx := openSnapStore(t)
	mustSnapTx(t, ctx, db, func(q Records) error {
		if err := q.InsertThinDevice(ctx, thinDev(1, ThinStateInactive)); err != nil {
			return err
		}
		if _, err := q.insertIntent(ctx, DeviceIntent{Op: intentCreate, DeviceID: 2, Name: "n2", Key: "b", CreatedNs: 1}); err != nil {
			return err
		}
		if err := q.Quarantine(ctx, 3, "unexplained", false, 1); err != nil {
			return err
		}
		// Quarantining again keeps one row and never clears "deleted".
		if err := q.Quarantine(ctx, 3, "unexplained, deleted", true, 2); err != nil {
			return err
		}
		return q.Quarantine(ctx, 3, "seen again", false, 3)
	})
	r := ReadRecords(db)
	for id, want := range map[uint32]bool{1: true, 2: true, 3: true, 4: false} {
		got, err := r.thinIDUsed(ctx, id)
		if err != nil || got != want {
			t.Errorf("thinIDUsed(%d) = %v, %v; want %v", id, got, err, want)
		}
	}
	qs, err := r.QuarantinedIDs(ctx)
	if err != nil || len(qs) != 1 || !qs[0].Deleted || qs[0].Reason != "seen again" {
		t.Fatalf("QuarantinedIDs = %+v, %v", qs, err)
	}
	// A deleted quarantined id is not counted as a device still held.
	counts, _ := r.DeviceStateCounts(ctx)
	if counts["quarantined"] != 0 {
		t.Fatalf("quarantined count = %d, want 0 (its device was deleted)", counts["quarantined"])
	}
}

func TestOnlyOneBaseDevice(t *testing.T) {
	db, ctx := openSnapStore(t)
	base := ThinDevice{ID: 7, Name: "pool-base-7", Role: ThinRoleBase, State: ThinStateInactive, SizeBytes: 1 << 30, FSType: "ext4", CreatedNs: 1, UpdatedNs: 1}
	mustSnapTx(t, ctx, db, func(q Records) error { return q.InsertThinDevice(ctx, base) })
	second := base
	second.ID, second.Name = 8, "pool-base-8"
	if err := snapTx(t, ctx, db, func(q Records) error { return q.InsertThinDevice(ctx, second) }); err == nil {
		t.Fatal("a second base device was accepted")
	}
	got, ok, err := ReadRecords(db).baseDevice(ctx)
	if err != nil || !ok || got != base {
		t.Fatalf("baseDevice = %+v, %v, %v; want %+v", got, ok, err, base)
	}
	for _, bad := range []ThinDevice{
		{ID: 0, Name: "zero", Role: ThinRoleSnapshot, State: ThinStateActive, SizeBytes: 1, FSType: "ext4"},
		{ID: 9, Name: "badstate", Role: ThinRoleSnapshot, State: "gone", SizeBytes: 1, FSType: "ext4"},
		{ID: 10, Name: "pool-base-7", Role: ThinRoleSnapshot, State: ThinStateActive, SizeBytes: 1, FSType: "ext4"},
	} {
		if err := snapTx(t, ctx, db, func(q Records) error { return q.InsertThinDevice(ctx, bad) }); err == nil {
			t.Errorf("device %+v accepted", bad)
		}
	}
}
