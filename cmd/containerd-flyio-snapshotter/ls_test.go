package main

import (
	"encoding/json"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

func lsJSON[T any](t *testing.T, args ...string) []T {
	t.Helper()
	code, out, errOut := runCommand(t, nil, append([]string{"ls"}, args...)...)
	if code != 0 {
		t.Fatalf("ls %v = %d, %q", args, code, errOut)
	}
	var v []T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("ls %v: output is not a JSON array: %v: %q", args, err, out)
	}
	return v
}

func TestLsImages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	populate(t, path, time.Now())
	imgs := lsJSON[metadata.ImageView](t, "images", "--db", path, "--format", "json")
	states := map[string]string{}
	for _, v := range imgs {
		states[v.ImageID] = v.State
	}
	want := map[string]string{"img-failed": "failed", "img-downloaded": "downloaded", "img-unpacked": "unpacked", "img-active": "active", "img-pending": "pending"}
	for id, st := range want {
		if states[id] != st {
			t.Errorf("image %s: state %q, want %q (all: %v)", id, states[id], st, states)
		}
	}
	// Filters: flags before and after the kind, repeated, all must match.
	active := lsJSON[metadata.ImageView](t, "--filter", "state=active", "images", "--db", path, "--format", "json")
	if len(active) != 1 || active[0].ImageID != "img-active" || active[0].Snapshots != 2 || active[0].ActiveSnapshots != 1 {
		t.Errorf("--filter state=active = %+v", active)
	}
	none := lsJSON[metadata.ImageView](t, "images", "--db", path, "--format", "json", "--filter", "state=active", "--filter", "s3_key=images/failed.tar")
	if len(none) != 0 {
		t.Errorf("two contradicting filters listed %+v", none)
	}
	failed := lsJSON[metadata.ImageView](t, "images", "--db", path, "--format", "json", "--filter", "s3_key=images/failed.tar")
	if len(failed) != 1 || !strings.Contains(failed[0].FailureReason, "climbs above the root") {
		t.Errorf("failed image = %+v", failed)
	}
	// Table: a header and one line per image, the reason shown.
	code, out, _ := runCommand(t, nil, "ls", "images", "--db", path)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 6 || !strings.HasPrefix(lines[0], "IMAGE ID") || !strings.Contains(out, "climbs above the root") {
		t.Errorf("ls images table = %d, %q", code, out)
	}
}

func TestLsUnpackedSnapshotsLocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	populate(t, path, time.Now())
	unp := lsJSON[metadata.UnpackedView](t, "unpacked", "--db", path, "--format", "json")
	sort.Slice(unp, func(i, j int) bool { return unp[i].DeviceID < unp[j].DeviceID })
	if len(unp) != 2 || unp[0].RefCount != 0 || unp[1].RefCount != 2 || unp[1].ActiveRefs != 1 {
		t.Errorf("ls unpacked = %+v", unp)
	}
	ref := lsJSON[metadata.UnpackedView](t, "unpacked", "--db", path, "--format", "json", "--filter", "referenced=true")
	if len(ref) != 1 || ref[0].DeviceName != "thin-3" {
		t.Errorf("--filter referenced=true = %+v", ref)
	}
	snaps := lsJSON[metadata.SnapshotView](t, "snapshots", "--db", path, "--format", "json", "--filter", "active=false")
	if len(snaps) != 1 || snaps[0].SnapshotID != "3-snap-b" || snaps[0].DeactivatedAt == nil || snaps[0].OriginDeviceName != "thin-3" {
		t.Errorf("ls snapshots active=false = %+v", snaps)
	}
	locks := lsJSON[metadata.LockView](t, "locks", "--db", path, "--format", "json")
	if len(locks) != 2 {
		t.Fatalf("ls locks = %+v", locks)
	}
	for _, l := range locks {
		wantStale := l.ImageID == "img-stale"
		if l.Stale != wantStale {
			t.Errorf("lock %s: stale %v, want %v (age %s)", l.ImageID, l.Stale, wantStale, l.Age)
		}
		if l.ImageID == "img-stale" && (l.Age < 2*time.Hour || l.LockedBy != "unpack-fsm:crashed") {
			t.Errorf("stale lock = %+v", l)
		}
	}
	stale := lsJSON[metadata.LockView](t, "locks", "--db", path, "--format", "json", "--filter", "stale=true")
	if len(stale) != 1 || stale[0].ImageID != "img-stale" {
		t.Errorf("--filter stale=true = %+v", stale)
	}
	code, out, _ := runCommand(t, nil, "ls", "locks", "--db", path)
	if code != 0 || !strings.Contains(out, "img-stale") || !strings.Contains(out, "2h") {
		t.Errorf("ls locks table = %d, %q", code, out)
	}
	// runs are listed through ls too (no runs in this database).
	if runs := lsJSON[metadata.Run](t, "runs", "--db", path, "--format", "json"); len(runs) != 0 {
		t.Errorf("ls runs = %+v", runs)
	}
}

func TestLsErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	populate(t, path, time.Now())
	cases := []struct {
		args    []string
		code    int
		wantErr string
	}{
		{[]string{"images", "--filter", "colour=red"}, 2, `unknown filter key "colour" (allowed: activation_status, device_name, download_status, image_id, locked, s3_key, state)`},
		{[]string{"locks", "--filter", "image=x"}, 2, `allowed: image_id, locked_by, stale`},
		{[]string{"images", "--filter", "state=weird"}, 2, `value must be one of pending, downloaded, unpacked, active, failed`},
		{[]string{"images", "--filter", "novalue"}, 2, `want KEY=VALUE`},
		{[]string{"images", "--format", "yaml"}, 2, `must be table or json`},
		{[]string{"volumes"}, 2, `unknown kind "volumes"`},
		{[]string{}, 2, `name what to list`},
		{[]string{"images", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"images", "--db", filepath.Join(t.TempDir(), "none.db")}, 1, "no database file"},
	}
	for _, c := range cases {
		args := append([]string{"ls"}, c.args...)
		if c.code == 2 && !strings.Contains(strings.Join(c.args, " "), "--db") {
			args = append(args, "--db", path)
		}
		code, _, errOut := runCommand(t, nil, args...)
		if code != c.code || !strings.Contains(errOut, c.wantErr) {
			t.Errorf("ls %v = %d, %q; want %d and %q", c.args, code, errOut, c.code, c.wantErr)
		}
	}
}
