//go:build dm

package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// TestPoolQuarantineReviewDM: a thin device nobody recorded, mapped by a
// device-mapper device, is quarantined at start-up; `pool quarantine`
// lists it in the pool, refuses to release it, deletes it (and its
// mapping), then releases its id.
func TestPoolQuarantineReviewDM(t *testing.T) {
	cfg := dmtest.Config(t)
	cfgPath := dmtest.WriteConfig(t, cfg)
	ctx := context.Background()
	const stray = 4242
	p, err := thinpool.Open(ctx, cfg.ThinpoolConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CreateThin(ctx, stray); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Activate(ctx, cfg.Pool.Name+"-stray", stray, 64<<20); err != nil {
		t.Fatal(err)
	}
	db, err := metadata.Open(ctx, cfg.MetadataOptions(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snapshotter.New(ctx, db, p, cfg.SnapshotterConfig()); err != nil { // start-up
		t.Fatal(err)
	}
	db.Close()
	p.Close()

	ls := func() []quarantineView {
		t.Helper()
		code, out, errOut := runCommand(t, nil, "pool", "quarantine", "ls", "--config", cfgPath, "--format", "json")
		var rows []quarantineView
		if code != 0 || json.Unmarshal([]byte(out), &rows) != nil {
			t.Fatalf("pool quarantine ls = %d, %q, %q", code, out, errOut)
		}
		return rows
	}
	if rows := ls(); len(rows) != 1 || rows[0].ThinID != stray || rows[0].InPool != "yes" || rows[0].Deleted {
		t.Fatalf("after start-up: %+v, want %d in the pool", rows, stray)
	}
	if code, _, errOut := runCommand(t, nil, "pool", "quarantine", "release", "--config", cfgPath, "4242"); code != 1 || !strings.Contains(errOut, "delete it first") {
		t.Fatalf("release of an id in the pool = %d, %q", code, errOut)
	}
	if code, out, errOut := runCommand(t, nil, "pool", "quarantine", "delete", "--config", cfgPath, "4242"); code != 0 || out != "deleted 4242\n" {
		t.Fatalf("delete = %d, %q, %q", code, out, errOut)
	}
	if rows := ls(); len(rows) != 1 || rows[0].InPool != "no" || !rows[0].Deleted {
		t.Fatalf("after delete: %+v, want %d deleted, no longer in the pool", rows, stray)
	}
	if dmDev, err := dmDeviceExists(cfg.Pool.Name + "-stray"); err != nil || dmDev {
		t.Fatalf("the stray's device-mapper device is still there: %v %v", dmDev, err)
	}
	if code, out, errOut := runCommand(t, nil, "pool", "quarantine", "release", "--config", cfgPath, "4242"); code != 0 || out != "released 4242\n" {
		t.Fatalf("release = %d, %q, %q", code, out, errOut)
	}
	if rows := ls(); len(rows) != 0 {
		t.Fatalf("after release: %+v, want nothing quarantined", rows)
	}
}
