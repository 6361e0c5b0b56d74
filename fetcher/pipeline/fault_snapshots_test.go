package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter/snapshottertest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

// faultSnapshots is the pipeline's Snapshots for host tests: the real
// Snapshotter, its records in the test's database, over a fake thin pool
// whose devices are directories (thinpooltest.NewFakePoolAt), wrapped in a
// fault injector. The wrapper counts the pipeline's calls and, at the
// boundaries the tests break (prepareErr, viewErr, mountsErr, removeErr,
// beforeRemoveIf), fails or interleaves a call before delegating it;
// everything else is the snapshotter's. attach makes pipelines mount the fake devices' mounts as
// bind mounts of their directories and probe the pool for a device's node.
type faultSnapshots struct {
	*snapshotter.Snapshotter
	pool *thinpooltest.FakePool
	db   *metadata.DB

	mu    sync.Mutex
	calls map[string]int // method → calls

	// prepareErr, when set, is asked before every Prepare; a non-nil error
	// fails it (nothing made).
	prepareErr func(key, parent string) error
	// viewErr, when set, is asked before every View; a non-nil error
	// fails it (nothing made).
	viewErr func(key, parent string) error
	// mountsErr, when set, is asked before every Mounts; a non-nil error
	// fails it.
	mountsErr func(key string) error
	// removeErr, when set, is asked before every Remove; a non-nil error
	// fails it (nothing removed).
	removeErr func(key string) error
	// beforeRemoveIf, when set, runs when RemoveIf is called, before the
	// snapshotter's transaction (what another process may do meanwhile).
	beforeRemoveIf func(key string)
}

var _ Snapshots = (*faultSnapshots)(nil)

func newFaultSnapshots(t testing.TB, db *metadata.DB) *faultSnapshots {
	t.Helper()
	pool, err := thinpooltest.NewFakePoolAt(filepath.Join(t.TempDir(), "pool"))
	if err != nil {
		t.Fatal(err)
	}
	s := snapshottertest.NewOn(t, db, pool, snapshotter.DefaultConfig())
	return &faultSnapshots{Snapshotter: s, pool: pool, db: db, calls: map[string]int{}}
}

// attach makes p mount through the fake pool (mount) and probe its
// mappings (deviceLive).
func (f *faultSnapshots) attach(p *Pipelines) {
	p.deviceLive, p.mountAt = f.deviceLive, f.mount
}

func (f *faultSnapshots) call(name string) {
	f.mu.Lock()
	f.calls[name]++
	f.mu.Unlock()
}

// totalCalls is how many calls the pipeline made, every method together.
func (f *faultSnapshots) totalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

func (f *faultSnapshots) Stat(ctx context.Context, key string) (snapshots.Info, error) {
	f.call("Stat")
	return f.Snapshotter.Stat(ctx, key)
}

func (f *faultSnapshots) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (snapshots.Info, error) {
	f.call("Update")
	return f.Snapshotter.Update(ctx, info, fieldpaths...)
}

func (f *faultSnapshots) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	f.call("Usage")
	return f.Snapshotter.Usage(ctx, key)
}

func (f *faultSnapshots) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	f.call("Mounts")
	if f.mountsErr != nil {
		if err := f.mountsErr(key); err != nil {
			return nil, err
		}
	}
	return f.Snapshotter.Mounts(ctx, key)
}

func (f *faultSnapshots) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	f.call("Prepare")
	if f.prepareErr != nil {
		if err := f.prepareErr(key, parent); err != nil {
			return nil, err
		}
	}
	return f.Snapshotter.Prepare(ctx, key, parent, opts...)
}

func (f *faultSnapshots) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	f.call("View")
	if f.viewErr != nil {
		if err := f.viewErr(key, parent); err != nil {
			return nil, err
		}
	}
	return f.Snapshotter.View(ctx, key, parent, opts...)
}

func (f *faultSnapshots) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	f.call("Commit")
	return f.Snapshotter.Commit(ctx, name, key, opts...)
}

func (f *faultSnapshots) Remove(ctx context.Context, key string) error {
	f.call("Remove")
	if f.removeErr != nil {
		if err := f.removeErr(key); err != nil {
			return err
		}
	}
	return f.Snapshotter.Remove(ctx, key)
}

func (f *faultSnapshots) RemoveIf(ctx context.Context, key string, guard snapshotter.RemoveGuard) error {
	f.call("RemoveIf")
	if f.beforeRemoveIf != nil {
		f.beforeRemoveIf(key)
	}
	return f.Snapshotter.RemoveIf(ctx, key, guard)
}

func (f *faultSnapshots) Cleanup(ctx context.Context) error {
	f.call("Cleanup")
	return f.Snapshotter.Cleanup(ctx)
}

func (f *faultSnapshots) Walk(ctx context.Context, fn snapshots.WalkFunc, fs ...string) error {
	f.call("Walk")
	return f.Snapshotter.Walk(ctx, fn, fs...)
}

func (f *faultSnapshots) DeviceOf(ctx context.Context, key string) (name, path string, id uint32, err error) {
	f.call("DeviceOf")
	return f.Snapshotter.DeviceOf(ctx, key)
}

func (f *faultSnapshots) Exists(ctx context.Context, key string) (bool, error) {
	f.call("Exists")
	return f.Snapshotter.Exists(ctx, key)
}

func (f *faultSnapshots) Recommit(ctx context.Context, name, key string) error {
	f.call("Recommit")
	return f.Snapshotter.Recommit(ctx, name, key)
}

// ThinExists is Options.ThinExists over the fake pool.
func (f *faultSnapshots) ThinExists(ctx context.Context, id uint32) (bool, error) {
	return f.pool.ThinExists(ctx, id)
}

// deviceLive stands for Pipelines.deviceLive: a device path is live while
// the fake pool maps a device there.
func (f *faultSnapshots) deviceLive(path string) error {
	if !f.pool.Mapped(path) {
		return fmt.Errorf("activation device %s: not mapped", path)
	}
	return nil
}

// mount stands for mountAll: each of ms, a mount of a device of the fake
// pool, is mounted as a bind mount of the device's directory, read-only
// when the mount is. A device not mapped fails, as its node would be
// missing.
func (f *faultSnapshots) mount(ms []mount.Mount, dir string) (func() error, error) {
	binds := make([]mount.Mount, 0, len(ms))
	for _, m := range ms {
		src, err := f.pool.MappedDir(m.Source)
		if err != nil {
			return nil, fmt.Errorf("mount %s at %s: %w", m.Source, dir, err)
		}
		opt := "rw"
		if slices.Contains(m.Options, "ro") {
			opt = "ro"
		}
		binds = append(binds, mount.Mount{Type: "bind", Source: src, Options: []string{"rbind", opt}})
	}
	return mountAll(binds, dir)
}

// record is the snapshot record of key.
func (f *faultSnapshots) record(t testing.TB, key string) snapshotter.CDSnapshot {
	t.Helper()
	r, ok, err := snapshotter.ReadRecords(f.db).Snapshot(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("snapshot %q: no record", key)
	}
	return r
}

// deleteDevice deletes key's thin device from the pool behind the records'
// back, as `dmsetup remove` and `dmsetup message POOL 0 "delete ID"` would.
func (f *faultSnapshots) deleteDevice(t testing.TB, key string) {
	t.Helper()
	r := f.record(t, key)
	ctx := context.Background()
	if err := f.pool.Deactivate(ctx, r.DeviceName); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.Delete(ctx, r.DeviceID); err != nil {
		t.Fatal(err)
	}
}

// unmap removes the mapping of key's device (dmsetup remove): the thin
// device stays in the pool.
func (f *faultSnapshots) unmap(t testing.TB, key string) {
	t.Helper()
	if err := f.pool.Deactivate(context.Background(), f.record(t, key).DeviceName); err != nil {
		t.Fatal(err)
	}
}

// devicePath is the path of file path in the device of snapshot key.
func (f *faultSnapshots) devicePath(t testing.TB, key, path string) string {
	t.Helper()
	dir, err := f.pool.ThinDir(f.record(t, key).DeviceID)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return filepath.Join(dir, path)
}

// readFile reads path in the device of snapshot key.
func (f *faultSnapshots) readFile(t testing.TB, key, path string) string {
	t.Helper()
	b, err := os.ReadFile(f.devicePath(t, key, path))
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return string(b)
}

// writeFile writes path in the device of snapshot key (what a container
// does in its active snapshot).
func (f *faultSnapshots) writeFile(t testing.TB, key, path, data string) {
	t.Helper()
	full := f.devicePath(t, key, path)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
}

// list returns every snapshot record by key.
func (f *faultSnapshots) list(t testing.TB) map[string]snapshotter.CDSnapshot {
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
func (f *faultSnapshots) extractions(t testing.TB) []string {
	t.Helper()
	var out []string
	for k := range f.list(t) {
		if strings.HasPrefix(k, extractPrefix) {
			out = append(out, k)
		}
	}
	return out
}
