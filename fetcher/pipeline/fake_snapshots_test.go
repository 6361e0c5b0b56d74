package pipeline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/filters"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// fakeSnapshots is a fake of the pipeline's Snapshots, for host tests that
// have no device-mapper. Its records are real: the snapshotter's rows in
// the metadata database (cd_snapshots and thin_devices, written through
// snapshotter.RecordsTx as package snapshotter writes them), so the
// pipeline's queries over them (the re-pull's state, pruning, the views)
// read what they would in production, and RemoveIf runs its guard in a real
// transaction. Only the thin pool is fake: each thin device is a directory
// (a snapshot's device starts as a copy of its origin's, as a thin
// snapshot shares its origin's blocks), its mounts are bind mounts of that
// directory, and a device can be deleted behind the records' back
// (deleteDevice), as `dmsetup message POOL 0 "delete ID"` would: ThinExists
// then says it is gone.
type fakeSnapshots struct {
	db   *metadata.DB
	root string // the devices' directories

	mu     sync.Mutex
	devs   map[uint32]string // thin id → directory, for the devices in the pool
	mapped map[string]bool   // dm names of the active (mapped) devices
	next   uint32
	calls  map[string]int // method → calls

	// prepareErr, when set, is asked before every Prepare; a non-nil error
	// fails it (nothing made).
	prepareErr func(key, parent string) error
	// mountsErr, when set, is asked before every Mounts.
	mountsErr func(key string) error
	// beforeRemoveIf, when set, runs when RemoveIf is called, before its
	// transaction (what another process may do meanwhile).
	beforeRemoveIf func(key string)
}

func newFakeSnapshots(t testing.TB, db *metadata.DB) *fakeSnapshots {
	t.Helper()
	f := &fakeSnapshots{db: db, root: t.TempDir(), devs: map[uint32]string{}, mapped: map[string]bool{},
		calls: map[string]int{}}
	return f
}

var (
	_ Snapshots         = (*fakeSnapshots)(nil)
	_ snapshots.Cleaner = (*fakeSnapshots)(nil)
)

func (f *fakeSnapshots) call(name string) {
	f.mu.Lock()
	f.calls[name]++
	f.mu.Unlock()
}

// totalCalls is how many calls the pipeline made, every method together.
func (f *fakeSnapshots) totalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

func fakeDevName(id uint32) string { return fmt.Sprintf("fake-snap-%d", id) }

func (f *fakeSnapshots) withTx(ctx context.Context, fn func(q snapshotter.Records) error) error {
	return f.db.WithTx(ctx, func(tx *sql.Tx) error { return fn(snapshotter.RecordsTx(tx)) })
}

func (f *fakeSnapshots) get(ctx context.Context, key string) (snapshotter.CDSnapshot, error) {
	r, ok, err := snapshotter.ReadRecords(f.db).Snapshot(ctx, key)
	if err != nil {
		return r, err
	}
	if !ok {
		return r, fmt.Errorf("snapshot %q: %w", key, errdefs.ErrNotFound)
	}
	return r, nil
}

func (f *fakeSnapshots) Stat(ctx context.Context, key string) (snapshots.Info, error) {
	f.call("Stat")
	r, err := f.get(ctx, key)
	if err != nil {
		return snapshots.Info{}, err
	}
	return snapshotter.InfoOf(r), nil
}

// Update replaces the labels (all of them, or those named labels.<key>).
func (f *fakeSnapshots) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (snapshots.Info, error) {
	f.call("Update")
	var out snapshots.Info
	err := f.withTx(ctx, func(q snapshotter.Records) error {
		r, ok, err := q.Snapshot(ctx, info.Name)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("update %q: %w", info.Name, errdefs.ErrNotFound)
		}
		l := maps.Clone(r.Labels)
		if l == nil {
			l = map[string]string{}
		}
		if len(fieldpaths) == 0 {
			l = maps.Clone(info.Labels)
		}
		for _, fp := range fieldpaths {
			k, ok := strings.CutPrefix(fp, "labels.")
			if !ok {
				return fmt.Errorf("update %q: field %q: %w", info.Name, fp, errdefs.ErrInvalidArgument)
			}
			if v := info.Labels[k]; v != "" {
				l[k] = v
			} else {
				delete(l, k)
			}
		}
		if err := q.UpdateSnapshotLabels(ctx, r.ID, l, time.Now().UnixNano()); err != nil {
			return err
		}
		r.Labels = l
		out = snapshotter.InfoOf(r)
		return nil
	})
	return out, err
}

func (f *fakeSnapshots) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	f.call("Usage")
	if _, err := f.get(ctx, key); err != nil {
		return snapshots.Usage{}, err
	}
	return snapshots.Usage{}, nil
}

// deviceDir is the directory of thin id id, or an error when the device is
// not in the pool.
func (f *fakeSnapshots) deviceDir(id uint32) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir, ok := f.devs[id]
	if !ok {
		return "", fmt.Errorf("thin device %d is not in the pool", id)
	}
	return dir, nil
}

func (f *fakeSnapshots) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	f.call("Mounts")
	if f.mountsErr != nil {
		if err := f.mountsErr(key); err != nil {
			return nil, err
		}
	}
	r, err := f.get(ctx, key)
	if err != nil {
		return nil, err
	}
	if r.Kind == snapshotter.SnapKindCommitted {
		return nil, fmt.Errorf("mounts of %q: committed: %w", key, errdefs.ErrFailedPrecondition)
	}
	dir, err := f.deviceDir(r.DeviceID)
	if err != nil {
		return nil, fmt.Errorf("mounts of %q: activate %s: %w", key, r.DeviceName, err)
	}
	f.mu.Lock()
	f.mapped[r.DeviceName] = true
	f.mu.Unlock()
	return bindMounts(dir, r.Kind == snapshotter.SnapKindView), nil
}

func bindMounts(dir string, ro bool) []mount.Mount {
	opt := "rw"
	if ro {
		opt = "ro"
	}
	return []mount.Mount{{Type: "bind", Source: dir, Options: []string{"rbind", opt}}}
}

func (f *fakeSnapshots) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	f.call("Prepare")
	if f.prepareErr != nil {
		if err := f.prepareErr(key, parent); err != nil {
			return nil, err
		}
	}
	return f.create(ctx, snapshotter.SnapKindActive, key, parent, opts)
}

func (f *fakeSnapshots) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	f.call("View")
	return f.create(ctx, snapshotter.SnapKindView, key, parent, opts)
}

func (f *fakeSnapshots) create(ctx context.Context, kind, key, parent string, opts []snapshots.Opt) ([]mount.Mount, error) {
	var base snapshots.Info
	for _, o := range opts {
		if err := o(&base); err != nil {
			return nil, err
		}
	}
	if key == "" {
		return nil, fmt.Errorf("create: empty key: %w", errdefs.ErrInvalidArgument)
	}
	f.mu.Lock()
	f.next++
	id := f.next
	f.mu.Unlock()
	dir := filepath.Join(f.root, fmt.Sprint(id))
	err := f.withTx(ctx, func(q snapshotter.Records) error {
		if target := base.Labels[snapshots.LabelSnapshotRef]; target != "" && kind == snapshotter.SnapKindActive {
			found, err := q.RefTarget(ctx, snapshots.LabelSnapshotRef, target, parent)
			if err != nil {
				return err
			}
			if found != "" {
				return fmt.Errorf("target %q (committed as %q): %w", target, found, errdefs.ErrAlreadyExists)
			}
		}
		if _, ok, err := q.Snapshot(ctx, key); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("snapshot %q: %w", key, errdefs.ErrAlreadyExists)
		}
		var parentID int64
		var origin uint32
		if parent != "" {
			p, ok, err := q.Snapshot(ctx, parent)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("parent %q of %q: %w", parent, key, errdefs.ErrNotFound)
			}
			if p.Kind != snapshotter.SnapKindCommitted {
				return fmt.Errorf("parent %q of %q is %s: %w", parent, key, p.Kind, errdefs.ErrInvalidArgument)
			}
			parentID, origin = p.ID, p.DeviceID
		}
		// create_snap of the origin: the new device holds its content.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if origin != 0 {
			src, err := f.deviceDir(origin)
			if err != nil {
				return fmt.Errorf("create_snap %d of %d: %w", id, origin, err)
			}
			if err := copyTree(src, dir); err != nil {
				return err
			}
		}
		now := time.Now().UnixNano()
		if err := q.InsertThinDevice(ctx, snapshotter.ThinDevice{ID: id, Name: fakeDevName(id), OriginID: origin, Role: snapshotter.ThinRoleSnapshot,
			State: snapshotter.ThinStateActive, SizeBytes: 1 << 30, FSType: "bind", CreatedNs: now, UpdatedNs: now}); err != nil {
			return err
		}
		_, err := q.InsertSnapshot(ctx, snapshotter.CDSnapshot{Key: key, Kind: kind, ParentID: parentID,
			DeviceID: id, Labels: base.Labels, CreatedNs: now, UpdatedNs: now})
		return err
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	f.mu.Lock()
	f.devs[id] = dir
	f.mapped[fakeDevName(id)] = true
	f.mu.Unlock()
	return bindMounts(dir, kind == snapshotter.SnapKindView), nil
}

func (f *fakeSnapshots) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	f.call("Commit")
	var base snapshots.Info
	for _, o := range opts {
		if err := o(&base); err != nil {
			return err
		}
	}
	var dev string
	err := f.withTx(ctx, func(q snapshotter.Records) error {
		r, ok, err := q.Snapshot(ctx, key)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("commit %q as %q: %w", key, name, errdefs.ErrNotFound)
		}
		if r.Kind != snapshotter.SnapKindActive {
			return fmt.Errorf("commit %q as %q: %s: %w", key, name, r.Kind, errdefs.ErrFailedPrecondition)
		}
		if _, ok, err := q.Snapshot(ctx, name); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("commit %q as %q: %w", key, name, errdefs.ErrAlreadyExists)
		}
		dev = r.DeviceName
		now := time.Now().UnixNano()
		if err := q.CommitSnapshot(ctx, r.ID, name, base.Labels, now, 0, 0); err != nil {
			return err
		}
		return q.SetThinDeviceState(ctx, r.DeviceID, snapshotter.ThinStateInactive, now)
	})
	if err == nil {
		f.mu.Lock()
		delete(f.mapped, dev)
		f.mu.Unlock()
	}
	return err
}

func (f *fakeSnapshots) Remove(ctx context.Context, key string) error {
	f.call("Remove")
	return f.removeIf(ctx, key, nil)
}

func (f *fakeSnapshots) RemoveIf(ctx context.Context, key string, guard snapshotter.RemoveGuard) error {
	f.call("RemoveIf")
	if f.beforeRemoveIf != nil {
		f.beforeRemoveIf(key)
	}
	return f.removeIf(ctx, key, guard)
}

func (f *fakeSnapshots) removeIf(ctx context.Context, key string, guard snapshotter.RemoveGuard) error {
	return f.db.WithTx(ctx, func(tx *sql.Tx) error {
		if guard != nil {
			if err := guard(ctx, tx); err != nil {
				return err
			}
		}
		_, children, found, err := snapshotter.RecordsTx(tx).RemoveSnapshot(ctx, key, time.Now().UnixNano())
		switch {
		case err != nil:
			return err
		case !found:
			return fmt.Errorf("remove %q: %w", key, errdefs.ErrNotFound)
		case children > 0:
			return fmt.Errorf("remove %q: %d children: %w", key, children, errdefs.ErrFailedPrecondition)
		}
		return nil
	})
}

// Cleanup deletes the devices of removed snapshots from the pool.
func (f *fakeSnapshots) Cleanup(ctx context.Context) error {
	f.call("Cleanup")
	devs, err := snapshotter.ReadRecords(f.db).ThinDevices(ctx, snapshotter.ThinStateRemoved)
	if err != nil {
		return err
	}
	for _, d := range devs {
		f.mu.Lock()
		dir := f.devs[d.ID]
		delete(f.devs, d.ID)
		delete(f.mapped, d.Name)
		f.mu.Unlock()
		if dir != "" {
			if err := os.RemoveAll(dir); err != nil {
				return fmt.Errorf("delete device %s (still mounted?): %w", d.Name, err)
			}
		}
		if err := f.withTx(ctx, func(q snapshotter.Records) error { return q.DeleteThinDevice(ctx, d.ID) }); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeSnapshots) Walk(ctx context.Context, fn snapshots.WalkFunc, fs ...string) error {
	f.call("Walk")
	filter, err := filters.ParseAll(fs...)
	if err != nil {
		return fmt.Errorf("walk: filters %q: %w", fs, err)
	}
	rows, err := snapshotter.ReadRecords(f.db).Snapshots(ctx)
	if err != nil {
		return err
	}
	for _, r := range rows {
		info := snapshotter.InfoOf(r)
		if !filter.Match(snapshotter.FilterAdaptor(info)) {
			continue
		}
		if err := fn(ctx, info); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeSnapshots) Close() error { return nil }

func (f *fakeSnapshots) DeviceOf(ctx context.Context, key string) (name, path string, id uint32, err error) {
	f.call("DeviceOf")
	r, err := f.get(ctx, key)
	if err != nil {
		return "", "", 0, err
	}
	return r.DeviceName, "/dev/mapper/" + r.DeviceName, r.DeviceID, nil
}

func (f *fakeSnapshots) Exists(ctx context.Context, key string) (bool, error) {
	f.call("Exists")
	_, ok, err := snapshotter.ReadRecords(f.db).Snapshot(ctx, key)
	return ok, err
}

// Recommit puts key's device in place of committed name's lost one, as the
// snapshotter does: the snapshots on name keep their devices.
func (f *fakeSnapshots) Recommit(ctx context.Context, name, key string) error {
	f.call("Recommit")
	old, err := f.get(ctx, name)
	if err != nil {
		return err
	}
	r, err := f.get(ctx, key)
	if err != nil {
		return err
	}
	if old.Kind != snapshotter.SnapKindCommitted || r.Kind != snapshotter.SnapKindActive || old.ParentKey != r.ParentKey {
		return fmt.Errorf("recommit %q as %q: %w", key, name, errdefs.ErrFailedPrecondition)
	}
	if ok, _ := f.ThinExists(ctx, old.DeviceID); ok {
		return fmt.Errorf("recommit %q as %q: device %d still in the pool: %w", key, name, old.DeviceID, errdefs.ErrFailedPrecondition)
	}
	err = f.withTx(ctx, func(q snapshotter.Records) error {
		now := time.Now().UnixNano()
		if err := q.DeleteSnapshot(ctx, r.ID); err != nil {
			return err
		}
		if err := q.MoveDevice(ctx, old.ID, r.DeviceID, 0, now); err != nil {
			return err
		}
		if err := q.SetThinDeviceState(ctx, r.DeviceID, snapshotter.ThinStateInactive, now); err != nil {
			return err
		}
		return q.DeleteThinDevice(ctx, old.DeviceID)
	})
	if err == nil {
		f.mu.Lock()
		delete(f.mapped, r.DeviceName)
		f.mu.Unlock()
	}
	return err
}

// ThinExists is Options.ThinExists over the fake pool.
func (f *fakeSnapshots) ThinExists(_ context.Context, id uint32) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.devs[id]
	return ok, nil
}

// deviceLive stands for Pipelines.deviceLive: a /dev/mapper path is live
// while the fake's device is mapped.
func (f *fakeSnapshots) deviceLive(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.mapped[filepath.Base(path)] {
		return fmt.Errorf("activation device %s: not mapped", path)
	}
	return nil
}

// deleteDevice deletes key's thin device from the pool behind the records'
// back.
func (f *fakeSnapshots) deleteDevice(t testing.TB, key string) {
	t.Helper()
	r, err := f.get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	dir := f.devs[r.DeviceID]
	delete(f.devs, r.DeviceID)
	delete(f.mapped, r.DeviceName)
	f.mu.Unlock()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
}

// unmap removes the mapping of key's device (dmsetup remove): the thin
// device stays in the pool.
func (f *fakeSnapshots) unmap(t testing.TB, key string) {
	t.Helper()
	r, err := f.get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	delete(f.mapped, r.DeviceName)
	f.mu.Unlock()
}

// readFile reads path in the device of snapshot key.
func (f *fakeSnapshots) readFile(t testing.TB, key, path string) string {
	t.Helper()
	r, err := f.get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := f.deviceDir(r.DeviceID)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, path))
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return string(b)
}

// writeFile writes path in the device of snapshot key (what a container
// does in its active snapshot).
func (f *fakeSnapshots) writeFile(t testing.TB, key, path, data string) {
	t.Helper()
	r, err := f.get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := f.deviceDir(r.DeviceID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, path), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// list returns every snapshot record by key.
func (f *fakeSnapshots) list(t testing.TB) map[string]snapshotter.CDSnapshot {
	t.Helper()
	rows, err := snapshotter.ReadRecords(f.db).Snapshots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]snapshotter.CDSnapshot{}
	for _, r := range rows {
		out[r.Key] = r
	}
	return out
}

// extractions lists the extraction snapshots.
func (f *fakeSnapshots) extractions(t testing.TB) []string {
	t.Helper()
	var out []string
	for k := range f.list(t) {
		if strings.HasPrefix(k, extractPrefix) {
			out = append(out, k)
		}
	}
	return out
}

// copyTree copies the tree at src into dst (directories, regular files,
// symlinks), keeping modes.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			if err := os.MkdirAll(to, 0o755); err != nil {
				return err
			}
			return os.Chmod(to, fi.Mode().Perm())
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case fi.Mode().IsRegular():
			in, err := os.Open(path)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		}
		return errors.New("copy " + path + ": unsupported file type")
	})
}

// TestFakeSnapshotsSemantics: the fake answers as the snapshotter does
// where the pipeline relies on it.
func TestFakeSnapshotsSemantics(t *testing.T) {
	ctx := context.Background()
	db := metadatatest.Open(t)
	f := newFakeSnapshots(t, db)
	if _, err := f.Prepare(ctx, "a", "missing"); !errdefs.IsNotFound(err) {
		t.Errorf("prepare on a missing parent: %v", err)
	}
	ms, err := f.Prepare(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Type != "bind" {
		t.Fatalf("mounts %+v", ms)
	}
	if _, err := f.Prepare(ctx, "a", ""); !errdefs.IsAlreadyExists(err) {
		t.Errorf("prepare of an existing key: %v", err)
	}
	f.writeFile(t, "a", "f", "data")
	if err := f.Commit(ctx, "c", "a", snapshots.WithLabels(map[string]string{"l": "v", snapshots.LabelSnapshotRef: "c"})); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mounts(ctx, "c"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("mounts of a committed snapshot: %v", err)
	}
	if _, err := f.Prepare(ctx, "x", "", snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: "c"})); !errdefs.IsAlreadyExists(err) {
		t.Errorf("prepare naming a committed ref: %v", err)
	}
	if _, err := f.Prepare(ctx, "child", "c", snapshots.WithLabels(map[string]string{"k": "v"})); err != nil {
		t.Fatal(err)
	}
	if got := f.readFile(t, "child", "f"); got != "data" {
		t.Errorf("a snapshot starts with its parent's content: %q", got)
	}
	if err := f.Remove(ctx, "c"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("remove of a parent: %v", err)
	}
	if err := f.Remove(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("remove of a missing key: %v", err)
	}
	var names []string
	if err := f.Walk(ctx, func(_ context.Context, i snapshots.Info) error { names = append(names, i.Name); return nil },
		`parent=="c"`, `labels."l"==v`); err != nil {
		t.Fatal(err)
	}
	if slices.Sort(names); !slices.Equal(names, []string{"c", "child"}) {
		t.Errorf("walk with filters: %v", names)
	}
	_, _, id, err := f.DeviceOf(ctx, "child")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(ctx, "child"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := f.ThinExists(ctx, id); !ok {
		t.Error("a removed snapshot's device is deleted before Cleanup")
	}
	if err := f.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := f.ThinExists(ctx, id); ok {
		t.Error("Cleanup left a removed snapshot's device")
	}
}
