package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// fakeBusyPool is a fake pool: it lists ids, and then, before `pool ls`
// reads the database, runs the daemon's work that committed meanwhile
// (after), as a daemon busy creating and deleting devices does.
type fakeBusyPool struct {
	ids   []uint32
	after func()
}

func (p *fakeBusyPool) ThinIDs(context.Context) ([]uint32, error) {
	defer p.after()
	return p.ids, nil
}

func (p *fakeBusyPool) ActiveDevices(context.Context) ([]thinpool.ActiveDevice, error) {
	return nil, nil
}

// TestPoolRowsWhileTheDaemonWorks: `pool ls` reads the pool, then the
// database, while the daemon goes on. A device the daemon creates (intent,
// create_thin, then its record) or deletes (delete from the pool, then its
// record dropped) between the two reads is in one and not in the other;
// neither is a disagreement between pool and database, and `pool ls
// --check`, which a monitor runs, must not fail for it.
func TestPoolRowsWhileTheDaemonWorks(t *testing.T) {
	ctx := context.Background()
	db, err := metadata.Open(ctx, metadata.Options{Path: filepath.Join(t.TempDir(), "m.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Statements().ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	device := func(id int, state string) {
		exec(`INSERT INTO thin_devices (device_id, name, role, state, size_bytes, fs_type, created_ns, updated_ns)
			VALUES (?, ?, 'snapshot', ?, 1048576, 'ext4', 1, 1)`, id, "flyio-snap-"+string(rune('0'+id)), state)
	}
	device(1, "active")
	device(5, "removed")                                                                                         // being deleted by Cleanup
	exec(`INSERT INTO device_intents (op, device_id, name, created_ns) VALUES ('create', 7, 'flyio-snap-7', 1)`) // being created
	pool := &fakeBusyPool{ids: []uint32{1, 5}, after: func() {
		// Cleanup deleted 5 from the pool and dropped its record; the
		// create of 7 made it in the pool and recorded it.
		exec(`DELETE FROM thin_devices WHERE device_id = 5`)
		device(7, "active")
		exec(`DELETE FROM device_intents WHERE device_id = 7`)
	}}
	rows, err := poolRows(ctx, pool, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Problem != "" {
			t.Errorf("thin id %d: %q, though only the daemon's work in progress separates pool and database", r.ID, r.Problem)
		}
	}

	// What stays a disagreement across the daemon's work is still one.
	pool = &fakeBusyPool{ids: []uint32{1, 9}, after: func() {}}
	exec(`DELETE FROM thin_devices WHERE device_id = 1`)
	device(3, "active")
	rows, err = poolRows(ctx, pool, db)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]string{1: "in the pool but not in the database", 9: "in the pool but not in the database",
		3: "recorded in the database but missing from the pool", 7: "recorded in the database but missing from the pool"}
	for _, r := range rows {
		if r.Problem != want[r.ID] {
			t.Errorf("thin id %d: problem %q, want %q", r.ID, r.Problem, want[r.ID])
		}
	}
}
