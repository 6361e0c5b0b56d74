//go:build dm

package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
)

// TestPoolReadCommandsLeaveADeviceWithoutLiveTableDM: a device-mapper
// device of the pool's name without a live table, either with no table at
// all or with an inactive one only (a pool creation cut short before its
// table was loaded or resumed, or another tool's device of that name being
// set up), is not an active pool. `pool status`, `pool ls` and `pool
// quarantine ls` only read: they report that the pool is not active and
// leave the device as it is, loading and resuming no table into it, and
// make no pool file.
func TestPoolReadCommandsLeaveADeviceWithoutLiveTableDM(t *testing.T) {
	cfg := dmtest.Config(t)
	cfgPath := dmtest.WriteConfig(t, cfg)
	ctx := context.Background()
	db, err := metadata.Open(ctx, cfg.MetadataOptions(false))
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if out, err := exec.Command("dmsetup", "create", cfg.Pool.Name, "--notable").CombinedOutput(); err != nil {
		t.Fatalf("dmsetup create --notable: %v: %s", err, out)
	}
	// Removed before dmtest's teardown, which would open it as a pool.
	t.Cleanup(func() { _ = exec.Command("dmsetup", "remove", cfg.Pool.Name).Run() })
	tables := func() string {
		t.Helper()
		out, err := exec.Command("dmsetup", "info", "-c", "--noheadings", "-o", "attr,tables_loaded", cfg.Pool.Name).CombinedOutput()
		if err != nil {
			t.Fatalf("dmsetup info: %v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	check := func(state string) {
		t.Helper()
		before := tables()
		for _, args := range [][]string{
			{"pool", "status"},
			{"pool", "ls"},
			{"pool", "quarantine", "ls"},
		} {
			what := strings.Join(args, " ") + " on a device " + state
			code, out, errOut := runCommand(t, nil, append(args, "--config", cfgPath)...)
			t.Logf("%s = %d, %q, %q", what, code, out, errOut)
			if after := tables(); after != before {
				t.Errorf("%s changed the device: %q, was %q", what, after, before)
			}
			if _, err := os.Stat(cfg.Pool.RootDir); err == nil {
				t.Errorf("%s made the pool's directory %s", what, cfg.Pool.RootDir)
			}
			if args[1] != "quarantine" && (code == 0 || !strings.Contains(errOut, "not active")) {
				t.Errorf("%s = %d, %q: want a failure saying the pool is not active", what, code, errOut)
			}
			if args[1] == "quarantine" && code != 0 {
				t.Errorf("%s = %d, %q: want the quarantine listed without the pool", what, code, errOut)
			}
			if t.Failed() {
				// Changed: the next command would find another state.
				t.FailNow()
			}
		}
	}
	check("without a table")
	// A table loaded and not resumed: a creation cut short between the
	// two, or another tool's device being set up under that name.
	if out, err := exec.Command("dmsetup", "load", cfg.Pool.Name, "--table", "0 8 zero").CombinedOutput(); err != nil {
		t.Fatalf("dmsetup load: %v: %s", err, out)
	}
	check("with an inactive table only")
}
