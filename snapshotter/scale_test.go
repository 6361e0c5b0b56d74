package snapshotter

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
)

var scaleSizes = flag.String("flyio.scale-sizes", "100,1000,10000", "snapshot counts BenchmarkScale measures at (the first is the anchor of the ratios)")

// scaleSamples is how many calls each per-call row times at each size.
const scaleSamples = 200

// scaleImageDepth is how many snapshots one image holds in the scale
// population: its committed layers, each with containerd's snapshot.ref
// label, and a container's active snapshot on top.
const scaleImageDepth = 5

// scaleGCImages is how many images BenchmarkScale collects at each size
// (a quarter of the smallest population).
const scaleGCImages = 5

// maxPerCallRatio is the most a per-call row's p50 may grow from the
// anchor size to any larger one.
const maxPerCallRatio = 1.5

// startupRow names the start-up reconciliation row.
const startupRow = "start-up reconciliation"

// scaleRow is one measured operation at one size.
type scaleRow struct {
	name     string
	perCall  bool
	p50, p99 time.Duration
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func timed(samples []time.Duration, fn func()) []time.Duration {
	t0 := time.Now()
	fn()
	return append(samples, time.Since(t0))
}

// scaleKey names snapshot layer of image i the way containerd's metadata
// store names its backend keys.
func scaleKey(i, layer int) string {
	return fmt.Sprintf("default/%d/sha256:%064x", i*scaleImageDepth+layer, i*scaleImageDepth+layer)
}

// populate records n committed snapshots (n/scaleImageDepth images of
// scaleImageDepth layers) in one transaction, each a thin snapshot made in
// pool, as if containerd had unpacked them.
func populate(b *testing.B, s *Snapshotter, pool DevicePool, n int) {
	b.Helper()
	ctx := context.Background()
	base, err := s.ensureBase(ctx)
	if err != nil {
		b.Fatal(err)
	}
	next := uint32(1)
	err = s.db.WithTx(ctx, func(tx *sql.Tx) error {
		q := RecordsTx(tx)
		for i := 0; i < n/scaleImageDepth; i++ {
			var parent int64
			origin := base.ID
			for l := 0; l < scaleImageDepth; l++ {
				if next++; next == base.ID {
					next++
				}
				id := next
				if err := pool.CreateSnap(ctx, id, origin); err != nil {
					return err
				}
				if err := q.InsertThinDevice(ctx, ThinDevice{ID: id, Name: deviceName(pool.Name(), id), OriginID: origin,
					Role: ThinRoleSnapshot, State: ThinStateInactive, SizeBytes: base.SizeBytes, FSType: base.FSType, CreatedNs: 1, UpdatedNs: 1}); err != nil {
					return err
				}
				rid, err := q.InsertSnapshot(ctx, CDSnapshot{Key: scaleKey(i, l), Kind: SnapKindCommitted,
					ParentID: parent, DeviceID: id, Labels: map[string]string{snapshots.LabelSnapshotRef: scaleKey(i, l)}, CreatedNs: 1, UpdatedNs: 1})
				if err != nil {
					return err
				}
				parent, origin = rid, id
			}
		}
		return nil
	})
	if err != nil {
		b.Fatalf("populate %d snapshots: %v", n, err)
	}
}

// scaleEnv is one population BenchmarkScale measures: n snapshots on s,
// over pool, and the per-call samples taken so far.
type scaleEnv struct {
	n                                  int
	s                                  *Snapshotter
	pool                               DevicePool
	prep, commit, remove, stat, lookup []time.Duration
}

// sample times one of each per-call operation on e (sample i).
func (e *scaleEnv) sample(b *testing.B, i int) {
	ctx, s := context.Background(), e.s
	images := e.n / scaleImageDepth
	parent := scaleKey(i%images, scaleImageDepth-1)
	key := fmt.Sprintf("default/bench/extract-%d", i)
	name := fmt.Sprintf("sha256:bench-%d", i)
	ref := snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: name})
	var err error
	e.prep = timed(e.prep, func() { _, err = s.Prepare(ctx, key, parent, ref) })
	if err != nil {
		b.Fatal(err)
	}
	e.commit = timed(e.commit, func() { err = s.Commit(ctx, name, key, ref) })
	if err != nil {
		b.Fatal(err)
	}
	e.stat = timed(e.stat, func() { _, err = s.Stat(ctx, scaleKey((i*7919)%images, i%scaleImageDepth)) })
	if err != nil {
		b.Fatal(err)
	}
	e.remove = timed(e.remove, func() { err = s.Remove(ctx, name) })
	if err != nil {
		b.Fatal(err)
	}
	// containerd's lookup of a layer another Prepare found already there:
	// a walk filtered on its snapshot.ref label and parent.
	img, l := (i*7919)%images, 1+i%(scaleImageDepth-1)
	filter := fmt.Sprintf(`labels.%q==%s,parent==%q`, snapshots.LabelSnapshotRef, scaleKey(img, l), scaleKey(img, l-1))
	found := 0
	e.lookup = timed(e.lookup, func() {
		err = s.Walk(ctx, func(context.Context, snapshots.Info) error { found++; return nil }, filter)
	})
	if err != nil || found != 1 {
		b.Fatalf("walk %s: %d found, %v", filter, found, err)
	}
}

// measureScale fills every env with its snapshots and times the calls
// containerd makes. The per-call samples go round the sizes one at a time,
// so that a burst of load from elsewhere on the machine falls on every size
// alike instead of on whichever was being measured.
func measureScale(b *testing.B, envs []*scaleEnv) [][]scaleRow {
	ctx := context.Background()
	for _, e := range envs {
		populate(b, e.s, e.pool, e.n)
	}
	for i := 0; i < scaleSamples; i++ {
		for _, e := range envs {
			e.sample(b, i)
		}
	}
	row := func(name string, perCall bool, ds []time.Duration) scaleRow {
		return scaleRow{name: name, perCall: perCall, p50: percentile(ds, 0.5), p99: percentile(ds, 0.99)}
	}
	out := make([][]scaleRow, 0, len(envs))
	for _, e := range envs {
		s, images := e.s, e.n/scaleImageDepth
		var startup []time.Duration
		for range 5 {
			var err error
			startup = timed(startup, func() { _, err = New(ctx, s.db, e.pool, s.cfg) })
			if err != nil {
				b.Fatal(err)
			}
		}
		// One image's garbage collection the way containerd's collector
		// does it: a Walk of every backend snapshot, the removals top
		// first, then Cleanup.
		var gc []time.Duration
		for i := 0; i < min(scaleGCImages, images); i++ {
			img := images - 1 - i
			var err error
			gc = timed(gc, func() {
				seen := 0
				if err = s.Walk(ctx, func(context.Context, snapshots.Info) error { seen++; return nil }); err != nil {
					return
				}
				for l := scaleImageDepth - 1; l >= 0 && err == nil; l-- {
					err = s.Remove(ctx, scaleKey(img, l))
				}
				if err == nil {
					err = s.Cleanup(ctx)
				}
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		out = append(out, []scaleRow{
			row("Prepare", true, e.prep), row("Commit", true, e.commit), row("Remove", true, e.remove), row("Stat", true, e.stat),
			row("Walk by ref label and parent", true, e.lookup),
			row("GC of one image (Walk, Remove x5, Cleanup)", false, gc), row(startupRow, false, startup),
		})
	}
	return out
}

// BenchmarkScale times Prepare, Commit, Remove, Stat, one image's garbage
// collection and start-up reconciliation with 100, 1,000 and 10,000
// snapshots recorded (-flyio.scale-sizes), on a real database and the
// in-memory thinpooltest.FakePool, and prints p50 and p99 with each row's
// ratio to the first size. It fails when a per-call row's p50 grows more than
// maxPerCallRatio. It measures once, whatever b.N.
func BenchmarkScale(b *testing.B) {
	sizes := scaleSizeList(b)
	var envs []*scaleEnv
	for _, n := range sizes {
		s, pool := newFakeSnapshotter(b, Config{})
		envs = append(envs, &scaleEnv{n: n, s: s, pool: pool})
	}
	reportScale(b, sizes, measureScale(b, envs))
	for b.Loop() {
	}
}

// scaleSizeList parses -flyio.scale-sizes.
func scaleSizeList(b *testing.B) []int {
	var sizes []int
	for _, f := range strings.Split(*scaleSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < scaleImageDepth*scaleGCImages*2 {
			b.Fatalf("-flyio.scale-sizes: %q is not a count of at least %d snapshots", f, scaleImageDepth*scaleGCImages*2)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// reportScale prints the table of results (one slice of rows per size)
// and fails b when a per-call row's p50 grows more than maxPerCallRatio.
func reportScale(b *testing.B, sizes []int, results [][]scaleRow) {
	var out strings.Builder
	fmt.Fprintf(&out, "\n%-44s %8s %12s %12s %8s %8s\n", "operation", "snaps", "p50", "p99", "p50 x", "p99 x")
	for r := range results[0] {
		anchor := results[0][r]
		for i, n := range sizes {
			row := results[i][r]
			r50 := float64(row.p50) / float64(anchor.p50)
			r99 := float64(row.p99) / float64(anchor.p99)
			fmt.Fprintf(&out, "%-44s %8d %12s %12s %8.2f %8.2f\n", row.name, n, row.p50.Round(time.Microsecond), row.p99.Round(time.Microsecond), r50, r99)
			if row.perCall && r50 > maxPerCallRatio {
				b.Errorf("%s at %d snapshots: p50 %s is %.2f times the %d-snapshot figure (at most %.1f)", row.name, n, row.p50, r50, sizes[0], maxPerCallRatio)
			}
		}
	}
	fmt.Print(out.String())
}
