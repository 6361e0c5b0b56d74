package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/inventory"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// indexBy maps each of rows by its key, so that a test can look up the row
// it expects whatever order the listing gave.
func indexBy[T any, K comparable](rows []T, key func(T) K) map[K]T {
	m := make(map[K]T, len(rows))
	for _, r := range rows {
		m[key(r)] = r
	}
	return m
}

// lsJSON runs `ls ARGS...`, which must succeed, and decodes its output as a
// JSON array of T.
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

// lsTable runs `ls ARGS...` (table format) and returns its rows as maps from
// header to cell. tabwriter starts every cell of a column where its header
// starts, so cells are cut at the headers' offsets; headers lists them in
// order (they may hold spaces).
func lsTable(t *testing.T, headers []string, args ...string) []map[string]string {
	t.Helper()
	code, out, errOut := runCommand(t, nil, append([]string{"ls"}, args...)...)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if code != 0 || len(lines) == 0 {
		t.Fatalf("ls %v = %d, %q, %q", args, code, out, errOut)
	}
	var starts []int
	from := 0
	for _, h := range headers {
		i := strings.Index(lines[0][from:], h)
		if i < 0 {
			t.Fatalf("ls %v: header %q lacks %q after offset %d", args, lines[0], h, from)
		}
		starts = append(starts, from+i)
		from += i + len(h)
	}
	if strings.TrimSpace(lines[0][from:]) != "" {
		t.Fatalf("ls %v: header %q has columns after %q", args, lines[0], headers[len(headers)-1])
	}
	var rows []map[string]string
	for _, l := range lines[1:] {
		row := map[string]string{}
		for i, h := range headers {
			end := len(l)
			if i+1 < len(starts) {
				end = min(starts[i+1], len(l))
			}
			if starts[i] > end {
				t.Fatalf("ls %v: row %q is shorter than its header", args, l)
			}
			row[h] = strings.TrimSpace(l[starts[i]:end])
		}
		rows = append(rows, row)
	}
	return rows
}

// lsImagesHeaders are the columns of `ls images`, in order.
var lsImagesHeaders = []string{"IMAGE ID", "S3 KEY", "NAMES", "STATE", "LAYERS", "DOWNLOAD", "ACTIVATION", "SIZE", "DEVICE", "LOCKED BY", "UPDATED", "REASON", "LAST USED"}

// TestLsImagesLastUse: ls images shows when each image was last used (its
// last pull or activation), what garbage collection removes the least
// recent of first, in the table and in JSON, apart from when its record
// was updated; an image never pulled has none.
func TestLsImagesLastUse(t *testing.T) {
	path := populatedDB(t)
	now := time.Now()
	pulled, used := now.Add(-72*time.Hour), now.Add(-2*time.Hour)
	func() {
		ctx := context.Background()
		d, err := metadata.Open(ctx, metadata.Options{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		// img-active was pulled three days ago and activated two hours ago
		// (the daemon writes the times as unix nanoseconds).
		if _, err := d.Statements().ExecContext(ctx, `UPDATE s3_images SET created_ns = ?, pulled_ns = ?, used_ns = ? WHERE image_id = 'img-active'`,
			pulled.UnixNano(), pulled.UnixNano(), used.UnixNano()); err != nil {
			t.Fatal(err)
		}
	}()
	byID := indexBy(lsJSON[inventory.Image](t, "images", "--db", path, "--format", "json"), func(v inventory.Image) string { return v.ImageID })
	if got := byID["img-active"].LastUsedAt; !got.Equal(used.Round(0)) {
		t.Errorf("img-active's last_used_at = %v, want its activation, %v", got, used)
	}
	if got := byID["img-failed"].LastUsedAt; !got.IsZero() {
		t.Errorf("img-failed, never pulled, has last_used_at %v", got)
	}
	code, out, _ := runCommand(t, nil, "ls", "images", "--db", path, "--format", "json")
	var raw []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &raw) != nil {
		t.Fatalf("ls images --format json = %d, %q", code, out)
	}
	for _, r := range raw {
		if _, ok := r["last_used_at"]; ok != (r["image_id"] != "img-failed") {
			t.Errorf("ls images --format json: %v's last_used_at present %v, want it for every image pulled", r["image_id"], ok)
		}
	}
	for _, r := range lsTable(t, lsImagesHeaders, "images", "--db", path) {
		switch id := r["IMAGE ID"]; {
		case id == "img-active" && (r["UPDATED"] != "3d ago" || r["LAST USED"] != "2h ago"):
			t.Errorf("ls images: img-active's UPDATED %q, LAST USED %q; want 3d ago (its pull), 2h ago (its activation)", r["UPDATED"], r["LAST USED"])
		case id == "img-unpacked" && !strings.HasSuffix(r["LAST USED"], "s ago"): // pulled a moment ago
			t.Errorf("ls images: img-unpacked's LAST USED %q, want its pull, seconds ago", r["LAST USED"])
		case id == "img-failed" && r["LAST USED"] != "-":
			t.Errorf("ls images: img-failed's LAST USED %q, want - (never pulled)", r["LAST USED"])
		}
	}
}

func TestLsImages(t *testing.T) {
	path := populatedDB(t)
	imgs := lsJSON[inventory.Image](t, "images", "--db", path, "--format", "json")
	byID := indexBy(imgs, func(v inventory.Image) string { return v.ImageID })
	want := []struct {
		id, state, source, device, lockedBy string
		names                               []string
		layers                              int
		size                                int64
		activations                         int
	}{
		{"img-active", inventory.ImageStateActive, "s3://bkt/images/active/", devName(devChainAB), "",
			[]string{"registry.example/active:1", "s3://bkt/images/active/"}, 2, 3000, 1},
		{"img-unpacked", inventory.ImageStateUnpacked, "s3://bkt/images/unpacked.tar", devName(devChainA), "activate-image:run-new",
			[]string{"registry.example/unpacked:1"}, 1, 1000, 0},
		{"img-failed", inventory.ImageStateFailed, "s3://bkt/images/failed.tar", "", "", []string{}, 0, 0, 0},
	}
	if len(imgs) != len(want) {
		t.Errorf("ls images listed %d images, want %d: %+v", len(imgs), len(want), imgs)
	}
	for _, w := range want {
		v, ok := byID[w.id]
		if !ok {
			t.Errorf("image %s not listed", w.id)
			continue
		}
		if v.State != w.state || v.S3Key != w.source || v.DeviceName != w.device || v.LockedBy != w.lockedBy ||
			!reflect.DeepEqual(v.Names, w.names) || v.Layers != w.layers || v.SizeBytes != w.size || v.ActiveSnapshots != w.activations {
			t.Errorf("image %s = %+v\nwant state %s, source %s, device %q, locked by %q, names %q, %d layers, %d bytes, %d activations",
				w.id, v, w.state, w.source, w.device, w.lockedBy, w.names, w.layers, w.size, w.activations)
		}
	}
	if v := byID["img-active"]; v.DeviceID != strconv.Itoa(devChainAB) {
		t.Errorf("img-active's device id = %q, want its top chain's, %d", v.DeviceID, devChainAB)
	}
	// Filters: flags before and after the kind, repeated, all must match.
	active := lsJSON[inventory.Image](t, "--filter", "state=active", "images", "--db", path, "--format", "json")
	if len(active) != 1 || active[0].ImageID != "img-active" {
		t.Errorf("--filter state=active = %+v", active)
	}
	none := lsJSON[inventory.Image](t, "images", "--db", path, "--format", "json", "--filter", "state=active", "--filter", "s3_key=s3://bkt/images/failed.tar")
	if len(none) != 0 {
		t.Errorf("two contradicting filters listed %+v", none)
	}
	failed := lsJSON[inventory.Image](t, "images", "--db", path, "--format", "json", "--filter", "s3_key=s3://bkt/images/failed.tar")
	if len(failed) != 1 || failed[0].State != inventory.ImageStateFailed || !strings.Contains(failed[0].FailureReason, "climbs above the root") {
		t.Errorf("failed image = %+v", failed)
	}
	locked := lsJSON[inventory.Image](t, "images", "--db", path, "--format", "json", "--filter", "locked=true")
	if len(locked) != 1 || locked[0].ImageID != "img-unpacked" {
		t.Errorf("--filter locked=true = %+v", locked)
	}
	// A name filter matches any one of an image's names, exactly.
	for name, wantID := range map[string]string{
		"registry.example/unpacked:1": "img-unpacked",
		"registry.example/active:1":   "img-active",
		"s3://bkt/images/active/":     "img-active",
		"registry.example/active":     "",
		"registry.example/nothing:1":  "",
	} {
		got := lsJSON[inventory.Image](t, "images", "--db", path, "--format", "json", "--filter", "name="+name)
		if wantID == "" && len(got) != 0 || wantID != "" && (len(got) != 1 || got[0].ImageID != wantID) {
			t.Errorf("--filter name=%s = %+v, want %q only", name, got, wantID)
		}
	}
	byName := lsJSON[inventory.Image](t, "images", "--db", path, "--format", "json", "--filter", "name=registry.example/active:1", "--filter", "state=unpacked")
	if len(byName) != 0 {
		t.Errorf("name and a state the image is not in listed %+v", byName)
	}
	// Table: a header and one line per image, with names, layer counts and
	// the reason shown.
	rows := lsTable(t, lsImagesHeaders, "images", "--db", path)
	if len(rows) != 3 {
		t.Fatalf("ls images table has %d rows, want 3: %v", len(rows), rows)
	}
	wantRows := map[string]map[string]string{
		"img-active": {"S3 KEY": "s3://bkt/images/active/", "NAMES": "registry.example/active:1,s3://bkt/images/active/", "STATE": "active",
			"LAYERS": "2", "SIZE": "2.9 KiB", "DEVICE": devName(devChainAB), "LOCKED BY": "-", "REASON": "-"},
		"img-unpacked": {"S3 KEY": "s3://bkt/images/unpacked.tar", "NAMES": "registry.example/unpacked:1", "STATE": "unpacked",
			"LAYERS": "1", "SIZE": "1000 B", "DEVICE": devName(devChainA), "LOCKED BY": "activate-image:run-new", "REASON": "-"},
		"img-failed": {"S3 KEY": "s3://bkt/images/failed.tar", "NAMES": "-", "STATE": "failed", "LAYERS": "0", "DEVICE": "-",
			"REASON": `validate s3://bkt/images/failed.tar: entry "../x": climbs...`},
	}
	for _, r := range rows {
		for col, want := range wantRows[r["IMAGE ID"]] {
			if r[col] != want {
				t.Errorf("ls images: %s's %s = %q, want %q (row %v)", r["IMAGE ID"], col, r[col], want, r)
			}
		}
		delete(wantRows, r["IMAGE ID"])
	}
	if len(wantRows) != 0 {
		t.Errorf("ls images table lacks %v", wantRows)
	}
}

func TestLsChains(t *testing.T) {
	path := populatedDB(t)
	chains := lsJSON[inventory.Chain](t, "chains", "--db", path, "--format", "json")
	byID := indexBy(chains, func(c inventory.Chain) string { return c.ChainID })
	// chainX has no snapshot, hence no device: it is not listed.
	if len(chains) != 3 {
		t.Errorf("ls chains listed %d chains, want chainA, chainAB and chainC: %+v", len(chains), chains)
	}
	for _, w := range []struct {
		id, parent, diff string
		dev              uint32
		images, children int
		size, files      int64
	}{
		{chainA, "", diffA, devChainA, 2, 1, 4000, 40},       // under img-active's top chain and img-unpacked's only one
		{chainAB, chainA, diffB, devChainAB, 1, 1, 8000, 80}, // its child is img-active's activation
		{chainC, "", diffC, devChainC, 0, 0, 500, 5},
	} {
		c, ok := byID[w.id]
		if !ok {
			t.Errorf("chain %s not listed", w.id)
			continue
		}
		if c.Parent != w.parent || c.DiffID != w.diff || c.DeviceID != w.dev || c.DeviceName != devName(w.dev) ||
			c.Images != w.images || c.Children != w.children || c.SizeBytes != w.size || c.FileCount != w.files {
			t.Errorf("chain %s = %+v\nwant parent %q, diff %s, device %d (%s), %d images, %d children, %d bytes, %d files",
				w.id, c, w.parent, w.diff, w.dev, devName(w.dev), w.images, w.children, w.size, w.files)
		}
	}
	unused := lsJSON[inventory.Chain](t, "chains", "--db", path, "--format", "json", "--filter", "used=false")
	if len(unused) != 1 || unused[0].ChainID != chainC {
		t.Errorf("--filter used=false = %+v, want chainC only", unused)
	}
	children := lsJSON[inventory.Chain](t, "chains", "--db", path, "--format", "json", "--filter", "parent_chain_id="+chainA)
	if len(children) != 1 || children[0].ChainID != chainAB {
		t.Errorf("--filter parent_chain_id=chainA = %+v, want chainAB only", children)
	}
	byDev := lsJSON[inventory.Chain](t, "chains", "--db", path, "--format", "json", "--filter", "device_id="+strconv.Itoa(devChainC))
	if len(byDev) != 1 || byDev[0].ChainID != chainC {
		t.Errorf("--filter device_id=%d = %+v, want chainC only", devChainC, byDev)
	}
	// Table: digests shortened to sha256: and 12 hex digits, device ids and
	// image counts in their columns.
	rows := lsTable(t, []string{"CHAIN ID", "PARENT", "DIFF ID", "DEVICE ID", "DEVICE NAME", "SIZE", "FILES", "IMAGES", "CHILDREN", "UNPACKED"},
		"chains", "--db", path)
	wantRows := map[string]map[string]string{
		chainA[:19]: {"PARENT": "-", "DIFF ID": diffA[:19], "DEVICE ID": strconv.Itoa(devChainA), "DEVICE NAME": devName(devChainA),
			"SIZE": "3.9 KiB", "FILES": "40", "IMAGES": "2", "CHILDREN": "1"},
		chainAB[:19]: {"PARENT": chainA[:19], "DIFF ID": diffB[:19], "DEVICE ID": strconv.Itoa(devChainAB), "DEVICE NAME": devName(devChainAB),
			"FILES": "80", "IMAGES": "1", "CHILDREN": "1"},
		chainC[:19]: {"PARENT": "-", "DIFF ID": diffC[:19], "DEVICE ID": strconv.Itoa(devChainC), "DEVICE NAME": devName(devChainC),
			"SIZE": "500 B", "FILES": "5", "IMAGES": "0", "CHILDREN": "0"},
	}
	if len(rows) != len(wantRows) {
		t.Errorf("ls chains table has %d rows, want %d: %v", len(rows), len(wantRows), rows)
	}
	for _, r := range rows {
		want, ok := wantRows[r["CHAIN ID"]]
		if !ok {
			t.Errorf("ls chains lists %v", r)
		}
		for col, w := range want {
			if r[col] != w {
				t.Errorf("ls chains: %s's %s = %q, want %q (row %v)", r["CHAIN ID"], col, r[col], w, r)
			}
		}
	}
}

func TestLsUnpackedSnapshotsLocks(t *testing.T) {
	path := populatedDB(t)
	unp := lsJSON[inventory.UnpackedImage](t, "unpacked", "--db", path, "--format", "json")
	sort.Slice(unp, func(i, j int) bool { return unp[i].DeviceID < unp[j].DeviceID })
	// One row per image whose top chain is unpacked: img-unpacked on
	// chainA's device, img-active on chainAB's, with its activation.
	if len(unp) != 2 || unp[0].ImageID != "img-unpacked" || unp[0].DeviceID != strconv.Itoa(devChainA) || unp[0].RefCount != 0 ||
		unp[1].ImageID != "img-active" || unp[1].DeviceName != devName(devChainAB) || unp[1].RefCount != 1 || unp[1].ActiveRefs != 1 ||
		unp[1].SizeBytes != 12000 || unp[1].FileCount != 120 || unp[1].DevicePath != "/dev/mapper/"+devName(devChainAB) {
		t.Errorf("ls unpacked = %+v", unp)
	}
	ref := lsJSON[inventory.UnpackedImage](t, "unpacked", "--db", path, "--format", "json", "--filter", "referenced=true")
	if len(ref) != 1 || ref[0].DeviceName != devName(devChainAB) {
		t.Errorf("--filter referenced=true = %+v", ref)
	}
	snaps := lsJSON[inventory.Snapshot](t, "snapshots", "--db", path, "--format", "json")
	if len(snaps) != 1 || snaps[0].ImageID != "img-active" || snaps[0].SnapshotName != pipeline.ActivationKey("img-active") ||
		!snaps[0].Active || snaps[0].OriginDeviceID != strconv.Itoa(devChainAB) || snaps[0].OriginDeviceName != devName(devChainAB) ||
		snaps[0].DevicePath != "/dev/mapper/"+devName(devActivation) || snaps[0].S3Key != "s3://bkt/images/active/" {
		t.Errorf("ls snapshots = %+v", snaps)
	}
	if inactive := lsJSON[inventory.Snapshot](t, "snapshots", "--db", path, "--format", "json", "--filter", "active=false"); len(inactive) != 0 {
		t.Errorf("ls snapshots active=false = %+v; an activation is a live snapshot", inactive)
	}

	// Locks are the running runs, newest first: not the pending nor the
	// finished one.
	locks := lsJSON[inventory.Lock](t, "locks", "--db", path, "--format", "json")
	if len(locks) != 2 || locks[0].ImageID != "img-unpacked" || locks[0].LockedBy != "activate-image:run-new" ||
		locks[1].ImageID != chainC || locks[1].LockedBy != "unpack-image:run-old" {
		t.Fatalf("ls locks = %+v", locks)
	}
	if a := locks[1].Age; a < 2*time.Hour || a > 2*time.Hour+time.Minute {
		t.Errorf("the 2h-old run's lock is %s old", a)
	}
	if a := locks[0].Age; a < 10*time.Minute || a > 11*time.Minute {
		t.Errorf("the 10m-old run's lock is %s old", a)
	}
	mine := lsJSON[inventory.Lock](t, "locks", "--db", path, "--format", "json", "--filter", "locked_by=unpack-image:run-old")
	if len(mine) != 1 || mine[0].ImageID != chainC {
		t.Errorf("--filter locked_by=unpack-image:run-old = %+v", mine)
	}
	rows := lsTable(t, []string{"IMAGE ID", "LOCKED BY", "LOCKED AT", "AGE"}, "locks", "--db", path)
	if len(rows) != 2 || rows[0]["IMAGE ID"] != "img-unpacked" || rows[0]["AGE"] != "10m" ||
		rows[1]["IMAGE ID"] != chainC || rows[1]["LOCKED BY"] != "unpack-image:run-old" || rows[1]["AGE"] != "2h" {
		t.Errorf("ls locks table = %v", rows)
	}
	// Runs are listed through ls too: every state.
	if runs := lsJSON[map[string]any](t, "runs", "--db", path, "--format", "json"); len(runs) != 4 {
		t.Errorf("ls runs = %+v", runs)
	}
	if runs := lsJSON[map[string]any](t, "runs", "state=running", "--db", path, "--format", "json"); len(runs) != 2 {
		t.Errorf("ls runs state=running = %+v", runs)
	}
}

func TestLsErrors(t *testing.T) {
	path := populatedDB(t)
	cases := []struct {
		args    []string
		code    int
		wantErr string
	}{
		{[]string{"images", "--filter", "colour=red"}, 2, `unknown filter key "colour" (allowed: activation_status, device_name, download_status, image_id, locked, name, s3_key, state)`},
		{[]string{"locks", "--filter", "image=x"}, 2, `allowed: image_id, locked_by)`},
		{[]string{"locks", "--filter", "stale=true"}, 2, `ls locks: unknown filter key "stale" (allowed: image_id, locked_by)`},
		{[]string{"chains", "--filter", "image_id=x"}, 2, `ls chains: unknown filter key "image_id" (allowed: chain_id, device_id, diff_id, parent_chain_id, used)`},
		{[]string{"chains", "--filter", "used=maybe"}, 2, `value must be one of true, false`},
		{[]string{"images", "--filter", "state=weird"}, 2, `value must be one of unpacked, active, failed`},
		{[]string{"images", "--filter", "state=downloaded"}, 2, `value must be one of unpacked, active, failed`},
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

// TestLsOlderSchema: listing a database the daemon has not migrated yet
// (the previous release's, schema 7) says so and what to run, instead of
// failing on a missing table or reading tables of another shape.
func TestLsOlderSchema(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "metadata", "testdata", "release-0007.db"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "old.db")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"images", "chains", "locks"} {
		code, out, errOut := runCommand(t, nil, "ls", kind, "--db", path)
		if code != 1 || !strings.Contains(errOut, "is at schema version 7") || !strings.Contains(errOut, "db migrate") {
			t.Errorf("ls %s on a schema-7 database: exit %d, %q %q; want 1 naming the version and db migrate", kind, code, out, errOut)
		}
	}
	after, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(after, src) {
		t.Errorf("ls changed the database it refused to list (%v)", err)
	}
}

// TestLsTablesEscapeRecordedText: a failure reason or a run's last error
// carries text the daemon did not write (an S3 server's error message, a
// program's), recorded as it came; the tables show its control and format
// characters escaped, as validate shows an archive's names, so that
// listing the records cannot rewrite the terminal or forge a line.
func TestLsTablesEscapeRecordedText(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	d, err := metadata.Open(ctx, metadata.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	hostile := "AccessDenied: \x1b]0;owned\x07\u202eok\u009b2J\rforged"
	if err := pipeline.RecordsOf(d).MarkImageFailed(ctx, "img-x", "s3://bkt/x.tar", "list s3://bkt/x.tar: "+hostile); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, _, err := fsm.NewSQLiteStore(d).CreateRun(ctx, fsm.RunRecord{ID: "run-x", FSM: "download-image", IdempotencyID: "sha256:x",
		Request: []byte(`{}`), Transition: "download", State: fsm.StatePending, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := fsm.NewSQLiteStore(d).Checkpoint(ctx, fsm.Checkpoint{RunID: "run-x", State: fsm.StateFailed, Transition: "download",
		Attempts: 1, LastError: hostile, At: now}); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"images", "runs"} {
		code, out, errOut := runCommand(t, nil, "ls", kind, "--db", path)
		if code != 0 {
			t.Fatalf("ls %s = %d, %q, %q", kind, code, out, errOut)
		}
		if i := strings.IndexFunc(out, func(r rune) bool { return r != '\n' && !strconv.IsPrint(r) }); i >= 0 {
			t.Errorf("ls %s prints %q raw:\n%q", kind, []rune(out[i:])[0], out)
		}
		if !strings.Contains(out, `\x1b]0;owned\a`) {
			t.Errorf("ls %s does not show the escape sequence escaped:\n%q", kind, out)
		}
	}
}
