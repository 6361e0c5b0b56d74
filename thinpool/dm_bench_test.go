//go:build dm

package thinpool

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// Latency of our ioctl path against dmsetup (one fork+exec of the
// libdevmapper tool per operation, as containerd's devmapper snapshotter
// does), measured in the same run on the same pool, interleaved so both
// see the same machine. Reported as medians and ratios, never asserted.

var benchOps = []string{"create_thin", "create_snap", "activate", "deactivate", "delete"}

// benchTargets are the ratios the project aims at (ours / dmsetup).
var benchTargets = map[string]float64{
	"create_thin": 0.07, "create_snap": 0.07, "delete": 0.07,
	"activate": 0.45, "deactivate": 0.45,
}

type latencies map[string][]time.Duration

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// measureVsDmsetup runs each operation runs times through the package and
// through dmsetup and returns the timings of both.
func measureVsDmsetup(tb testing.TB, p *Pool, runs int) (ours, tool latencies) {
	tb.Helper()
	if _, err := exec.LookPath("dmsetup"); err != nil {
		tb.Fatalf("dmsetup is needed as the anchor: %v", err)
	}
	ctx := context.Background()
	ours, tool = latencies{}, latencies{}
	const size = 64 << 20
	sectors := strconv.Itoa(size / 512)
	env := append(os.Environ(), "DM_DISABLE_UDEV=1")
	dmsetup := func(args ...string) time.Duration {
		tb.Helper()
		cmd := exec.Command("dmsetup", args...)
		cmd.Env = env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(start)
		if err != nil {
			tb.Fatalf("dmsetup %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return d
	}
	timed := func(op string, f func() error) {
		tb.Helper()
		start := time.Now()
		err := f()
		ours[op] = append(ours[op], time.Since(start))
		if err != nil {
			tb.Fatalf("%s: %v", op, err)
		}
	}
	msg := func(m string) []string { return []string{"message", p.name, "0", m} }
	// Each operation runs ours then dmsetup's back to back, so a burst of
	// load on the (shared, emulated) machine hits both sides alike.
	for i := 0; i < runs; i++ {
		a, b := uint32(10*i+1), uint32(10*i+2) // ours
		c, d := 10*i+3, 10*i+4                 // dmsetup's
		name := fmt.Sprintf("%s-bo%d", p.name, i)
		dname := fmt.Sprintf("%s-bd%d", p.name, i)

		timed("create_thin", func() error { return p.CreateThin(ctx, a) })
		tool["create_thin"] = append(tool["create_thin"], dmsetup(msg(fmt.Sprintf("create_thin %d", c))...))

		timed("create_snap", func() error { return p.CreateSnap(ctx, b, a) })
		tool["create_snap"] = append(tool["create_snap"], dmsetup(msg(fmt.Sprintf("create_snap %d %d", d, c))...))

		timed("activate", func() error { _, err := p.Activate(ctx, name, a, size); return err })
		tool["activate"] = append(tool["activate"], dmsetup("create", dname, "--table", fmt.Sprintf("0 %s thin %s %d", sectors, p.devStr, c)))

		timed("deactivate", func() error { return p.Deactivate(ctx, name) })
		tool["deactivate"] = append(tool["deactivate"], dmsetup("remove", dname))

		timed("delete", func() error { return p.Delete(ctx, b) })
		tool["delete"] = append(tool["delete"], dmsetup(msg(fmt.Sprintf("delete %d", d))...))

		if err := p.Delete(ctx, a); err != nil {
			tb.Fatal(err)
		}
		dmsetup(msg(fmt.Sprintf("delete %d", c))...)
	}
	return ours, tool
}

func ratioTable(ours, tool latencies, runs int) (string, map[string]float64) {
	var b strings.Builder
	ratios := map[string]float64{}
	fmt.Fprintf(&b, "median of %d runs, thinpool (ioctl) vs dmsetup (exec), same pool, same run\n", runs)
	fmt.Fprintf(&b, "%-12s %12s %12s %8s %8s\n", "operation", "thinpool", "dmsetup", "ratio", "target")
	for _, op := range benchOps {
		o, d := median(ours[op]), median(tool[op])
		r := float64(o) / float64(d)
		ratios[op] = r
		mark := "ok"
		switch {
		case runs < 5:
			mark = "(warm-up, too few runs to judge)"
		case r > benchTargets[op]:
			mark = "MISSED"
		}
		fmt.Fprintf(&b, "%-12s %10.2fms %10.2fms %7.3fx %6.2fx %s\n", op,
			float64(o)/float64(time.Millisecond), float64(d)/float64(time.Millisecond), r, benchTargets[op], mark)
	}
	return b.String(), ratios
}

// BenchmarkVsDmsetup runs b.N rounds of every operation both ways, logs the
// ratio table and reports each operation's ratio (ours/dmsetup) and our
// median latency. The VM suite runs it with testdata/vm-bench-args:
//
//	thinpool.test -test.run '^$' -test.bench VsDmsetup -test.benchtime 11x -test.v
//
// Targets are reported (ok / MISSED in the table), never asserted.
func BenchmarkVsDmsetup(b *testing.B) {
	p, _ := testPool(b, 1<<30)
	b.ResetTimer()
	ours, tool := measureVsDmsetup(b, p, b.N)
	b.StopTimer()
	table, ratios := ratioTable(ours, tool, b.N)
	for _, op := range benchOps {
		b.ReportMetric(ratios[op], op+"-ratio")
		b.ReportMetric(float64(median(ours[op]))/float64(time.Millisecond), op+"-ms")
	}
	b.Logf("\n%s", table)
}

// BenchmarkReserveCheck measures what refusing new devices under the
// reserve costs a create: the check (creatable: one DM_TABLE_STATUS
// without a flush, the metadata threshold and the reserve) against the
// create_snap it guards, interleaved on the same pool. The reserve itself
// adds no ioctl (it reads the status line the metadata threshold already
// read); the ratio says what the whole check is worth, reported, never
// asserted.
//
//	thinpool.test -test.run '^$' -test.bench ReserveCheck -test.benchtime 200x -test.v
func BenchmarkReserveCheck(b *testing.B) {
	p, _ := testPool(b, 256<<20)
	p.cfg.MinFreeSpace = conf.Pct(DefaultMinFreePercent)
	ctx := context.Background()
	if err := p.CreateThin(ctx, 1); err != nil {
		b.Fatal(err)
	}
	var check, snap []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := p.creatable(); err != nil {
			b.Fatal(err)
		}
		check = append(check, time.Since(start))
		start = time.Now()
		if err := p.CreateSnap(ctx, 2, 1); err != nil {
			b.Fatal(err)
		}
		snap = append(snap, time.Since(start))
		if err := p.Delete(ctx, 2); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	c, s := median(check), median(snap)
	b.ReportMetric(float64(c)/float64(time.Microsecond), "check-us")
	b.ReportMetric(float64(s)/float64(time.Microsecond), "create_snap-us")
	b.ReportMetric(float64(c)/float64(s), "check/create_snap")
	b.Logf("median of %d: reserve check (status, no flush) %v, create_snap with it %v, ratio %.3f", b.N, c, s, float64(c)/float64(s))
}
