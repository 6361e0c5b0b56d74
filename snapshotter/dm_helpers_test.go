//go:build dm

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
)

// testBaseSize keeps mkfs and the pool small under emulation.
const testBaseSize = 128 << 20

var poolSeq atomic.Int64

// scratchDir is where loop files and mounts go: $VM_SCRATCH (tmpfs, set by
// integration/vm/run.sh), never 9p.
func scratchDir(t testing.TB) string {
	t.Helper()
	return scratch.Dir(t, "snapshotter-")
}

// testEnv is one pool and one database in a scratch directory.
type testEnv struct {
	dir    string
	poolNm string
	pool   *thinpool.Pool
	db     *metadata.DB
}

func poolConfig(dir, name string) thinpool.Config {
	return thinpool.Config{Name: name, RootDir: filepath.Join(dir, "pool"), DataSize: 4 << 30, MetadataSize: 64 << 20}
}

// newTestEnv makes a fresh pool named after the test and opens a database;
// both are torn down when the test ends (devices deactivated, pool removed).
func newTestEnv(t testing.TB, prefix string) *testEnv {
	t.Helper()
	ctx := context.Background()
	dir := scratchDir(t)
	name := fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), poolSeq.Add(1))
	pool, err := thinpool.Open(ctx, poolConfig(dir, name))
	if err != nil {
		t.Fatalf("open pool %s: %v", name, err)
	}
	db, err := metadata.Open(ctx, metadata.Options{Path: filepath.Join(dir, "meta.db")})
	if err != nil {
		t.Fatalf("open database: %v", err)
	}
	e := &testEnv{dir: dir, poolNm: name, pool: pool, db: db}
	t.Cleanup(func() { e.teardown(t) })
	return e
}

// reopen closes and reopens the pool handle and the database, as a restart
// would.
func (e *testEnv) reopen(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	e.db.Close()
	e.pool.Close()
	pool, err := thinpool.Open(ctx, poolConfig(e.dir, e.poolNm))
	if err != nil {
		t.Fatalf("reopen pool %s: %v", e.poolNm, err)
	}
	db, err := metadata.Open(ctx, metadata.Options{Path: filepath.Join(e.dir, "meta.db")})
	if err != nil {
		t.Fatalf("reopen database: %v", err)
	}
	e.pool, e.db = pool, db
}

func (e *testEnv) teardown(t testing.TB) {
	ctx := context.Background()
	if devs, err := e.pool.ActiveDevices(ctx); err == nil {
		for _, d := range devs {
			exec.Command("umount", "-l", thinpool.DevicePath(d.Name)).Run()
			if err := e.pool.Deactivate(ctx, d.Name); err != nil {
				t.Logf("teardown: deactivate %s: %v", d.Name, err)
			}
		}
	}
	e.db.Close()
	e.pool.Close()
	// No thinpool API removes a pool; the loop devices auto-clear with it.
	if out, err := exec.Command("dmsetup", "remove", e.poolNm).CombinedOutput(); err != nil {
		t.Logf("teardown: dmsetup remove %s: %v: %s", e.poolNm, err, out)
	}
	os.RemoveAll(e.dir)
}

func (e *testEnv) newSnapshotter(t testing.TB, cfg Config) *Snapshotter {
	t.Helper()
	if cfg.BaseImageSize == 0 {
		cfg.BaseImageSize = testBaseSize
	}
	s, err := New(context.Background(), e.db, e.pool, cfg)
	if err != nil {
		t.Fatalf("new snapshotter: %v", err)
	}
	return s
}

func nsCtx(ns string) context.Context {
	return namespaces.WithNamespace(context.Background(), ns)
}

// checkPoolMatchesDB asserts the pool's thin ids equal the recorded device
// ids plus the quarantined ids, and that no intent is left.
func checkPoolMatchesDB(t testing.TB, s *Snapshotter) {
	t.Helper()
	ctx := context.Background()
	ids, err := s.pool.ThinIDs(ctx)
	if err != nil {
		t.Fatalf("pool thin ids: %v", err)
	}
	devs, err := s.reads().ThinDevices(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	qs, err := s.reads().QuarantinedIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []uint32
	for _, d := range devs {
		want = append(want, d.ID)
	}
	for _, q := range qs {
		if !q.Deleted {
			want = append(want, q.DeviceID)
		}
	}
	slices.Sort(want)
	want = slices.Compact(want)
	got := slices.Clone(ids)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("pool thin ids %v != database device ids + quarantine %v (devices %+v, quarantine %+v)", got, want, devs, qs)
	}
	ins, err := s.reads().Intents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) != 0 {
		t.Fatalf("intents left after reconciliation: %+v", ins)
	}
}
