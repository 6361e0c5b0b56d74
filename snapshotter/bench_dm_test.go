//go:build dm

package snapshotter

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/snapshots/devmapper"
)

// benchRounds is how many times BenchmarkVsDevmapper times each operation
// per snapshotter; `make test` runs 5 (testdata/vm-bench-args).
var benchRounds = flag.Int("flyio.vs-devmapper-rounds", 9, "BenchmarkVsDevmapper's rounds: timings of each operation per snapshotter")

var (
	benchOnce  sync.Once
	benchTable []benchRow
	benchErr   error
)

type benchRow struct {
	op           string
	ours, theirs time.Duration // medians
}

// timedOps runs the measured operations on sn rounds times and returns the
// latencies of each, by operation name. Prepare and Commit are measured on a
// child of a committed parent (both snapshotters do a create_snap and an
// activation); "prepare-noparent" is a parentless Prepare (a snapshot of our
// base device; containerd's devmapper runs mkfs for it); Remove removes a
// committed leaf.
func timedOps(ctx context.Context, sn snapshots.Snapshotter, tag string, rounds int) (map[string][]time.Duration, error) {
	lat := map[string][]time.Duration{}
	timed := func(op string, fn func() error) error {
		start := time.Now()
		err := fn()
		lat[op] = append(lat[op], time.Since(start))
		if err != nil {
			return fmt.Errorf("%s %s: %w", tag, op, err)
		}
		return nil
	}
	if _, err := sn.Prepare(ctx, tag+"-parent-a", ""); err != nil {
		return nil, err
	}
	if err := sn.Commit(ctx, tag+"-parent", tag+"-parent-a"); err != nil {
		return nil, err
	}
	for i := range rounds {
		key, name := fmt.Sprintf("%s-k%d", tag, i), fmt.Sprintf("%s-c%d", tag, i)
		if err := timed("prepare", func() error { _, err := sn.Prepare(ctx, key, tag+"-parent"); return err }); err != nil {
			return nil, err
		}
		if err := timed("commit", func() error { return sn.Commit(ctx, name, key) }); err != nil {
			return nil, err
		}
		if err := timed("remove", func() error { return sn.Remove(ctx, name) }); err != nil {
			return nil, err
		}
		np := fmt.Sprintf("%s-np%d", tag, i)
		if err := timed("prepare-noparent", func() error { _, err := sn.Prepare(ctx, np, ""); return err }); err != nil {
			return nil, err
		}
		if err := sn.Remove(ctx, np); err != nil {
			return nil, err
		}
		if c, ok := sn.(snapshots.Cleaner); ok {
			if err := c.Cleanup(ctx); err != nil {
				return nil, err
			}
		}
	}
	return lat, nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// BenchmarkVsDevmapper times Prepare, Commit and Remove of this snapshotter
// and of containerd's built-in devmapper snapshotter, each on its own pool
// made the same way (loop files in $VM_SCRATCH, 64 KiB blocks, 128 MiB ext4
// base, synchronous removal for both), in the same run, and reports the
// median of each and the ratio ours/devmapper (target: at most 0.5).
func BenchmarkVsDevmapper(b *testing.B) {
	benchOnce.Do(func() { benchTable, benchErr = runVsDevmapper(b) })
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	for range b.N {
		// The work is done once above; b.N iterations only keep the
		// framework's accounting consistent.
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-18s %12s %12s %8s\n", "operation", "ours", "devmapper", "ratio")
	for _, r := range benchTable {
		ratio := float64(r.ours) / float64(r.theirs)
		fmt.Fprintf(&sb, "%-18s %12v %12v %8.3f\n", r.op, r.ours.Round(10*time.Microsecond), r.theirs.Round(10*time.Microsecond), ratio)
		b.ReportMetric(ratio, r.op+"-ratio")
		b.ReportMetric(float64(r.ours.Microseconds()), r.op+"-ours-µs")
		b.ReportMetric(float64(r.theirs.Microseconds()), r.op+"-devmapper-µs")
	}
	b.Log(sb.String())
}

func runVsDevmapper(b *testing.B) ([]benchRow, error) {
	rounds := *benchRounds
	if rounds < 1 {
		return nil, fmt.Errorf("-flyio.vs-devmapper-rounds %d: want a positive count", rounds)
	}
	ctx := nsCtx("bench")

	ours := newTestEnv(b, "bo")
	s, err := New(ctx, ours.db, ours.pool, Config{BaseImageSize: testBaseSize})
	if err != nil {
		return nil, err
	}
	theirsEnv := newTestEnv(b, "bd")
	dmRoot := filepath.Join(theirsEnv.dir, "devmapper")
	dm, err := devmapper.NewSnapshotter(ctx, &devmapper.Config{
		RootPath:       dmRoot,
		PoolName:       theirsEnv.poolNm,
		BaseImageSize:  strconv.Itoa(testBaseSize),
		FileSystemType: "ext4",
	})
	if err != nil {
		return nil, fmt.Errorf("containerd devmapper snapshotter on pool %s: %w", theirsEnv.poolNm, err)
	}
	defer dm.Close()

	// Interleave: half the rounds each, alternating, so neither side gets a
	// systematically quieter machine.
	all := map[string][2][]time.Duration{}
	for half := range 2 {
		o, err := timedOps(ctx, s, fmt.Sprintf("o%d", half), (rounds+1)/2)
		if err != nil {
			return nil, err
		}
		d, err := timedOps(ctx, dm, fmt.Sprintf("d%d", half), (rounds+1)/2)
		if err != nil {
			return nil, err
		}
		for op := range o {
			cur := all[op]
			cur[0] = append(cur[0], o[op]...)
			cur[1] = append(cur[1], d[op]...)
			all[op] = cur
		}
	}
	var rows []benchRow
	for _, op := range []string{"prepare", "commit", "remove", "prepare-noparent"} {
		rows = append(rows, benchRow{op: op, ours: median(all[op][0]), theirs: median(all[op][1])})
	}
	// Async removal on both sides: the Remove call only.
	sa, err := New(ctx, ours.db, ours.pool, Config{BaseImageSize: testBaseSize, AsyncRemove: true})
	if err != nil {
		return nil, err
	}
	asyncEnv := newTestEnv(b, "ba") // devmapper allocates ids from its own store: a pool each
	dma, err := devmapper.NewSnapshotter(ctx, &devmapper.Config{
		RootPath: filepath.Join(asyncEnv.dir, "devmapper"), PoolName: asyncEnv.poolNm,
		BaseImageSize: strconv.Itoa(testBaseSize), FileSystemType: "ext4", AsyncRemove: true,
	})
	if err != nil {
		return nil, err
	}
	defer dma.Close()
	oa, err := timedOps(ctx, sa, "oa", (rounds+1)/2)
	if err != nil {
		return nil, err
	}
	da, err := timedOps(ctx, dma, "da", (rounds+1)/2)
	if err != nil {
		return nil, err
	}
	rows = append(rows, benchRow{op: "remove-async", ours: median(oa["remove"]), theirs: median(da["remove"])})
	return rows, nil
}
