//go:build dm

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// benchLayers is the image of BenchmarkPull: two layers of random files,
// about 500 MB in all.
var benchLayers = []struct {
	key   string
	dir   string
	files int
	size  int
	base  bool
}{
	{"big/01.tar", "l1", 2048, 128 << 10, true}, // 256 MiB
	{"big/02.tar", "l2", 3840, 64 << 10, false}, // 240 MiB
}

// benchMB scales BenchmarkPull's image to about that many MB (0: about
// 500 MB); the FLYIO_BENCH_MB environment variable wins over it.
var benchMB = flag.Int("flyio.bench-mb", 0, "BenchmarkPull's image size in MB (0: about 500)")

// anchorGetTar is the plain way: GET each object and pipe it into
// `tar -x` on a fresh, formatted, mounted thin device (made before the
// clock starts), then sync. It returns the time of GETs + tar + sync.
func anchorGetTar(b *testing.B, e *pullEnv) time.Duration {
	ctx := context.Background()
	const id = 0xfffff0
	name := e.cfg.Pool.Name + "-anchor"
	if err := e.pool.CreateThin(ctx, id); err != nil {
		b.Fatal(err)
	}
	path, err := e.pool.Activate(ctx, name, id, 1<<30)
	if err != nil {
		b.Fatal(err)
	}
	if err := thinpool.Mkfs(ctx, path, thinpool.FSExt4, nil); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if out, err := exec.Command("mount", path, dir).CombinedOutput(); err != nil {
		b.Fatalf("mount: %v: %s", err, out)
	}
	defer func() {
		exec.Command("umount", dir).Run()
		e.pool.Deactivate(ctx, name)
		e.pool.Delete(ctx, id)
	}()
	start := time.Now()
	for _, l := range benchLayers {
		resp, err := http.Get(e.srv.URL + "/" + e.srv.Bucket + "/" + l.key)
		if err != nil {
			b.Fatal(err)
		}
		tar := exec.Command("tar", "-x", "-C", dir)
		tar.Stdin = resp.Body
		out, err := tar.CombinedOutput()
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatalf("tar -x of %s: %v: %s", l.key, err, out)
		}
	}
	if out, err := exec.Command("sync", "-f", dir).CombinedOutput(); err != nil {
		b.Fatalf("sync: %v: %s", err, out)
	}
	return time.Since(start)
}

// BenchmarkPull measures, in one run: a pull of a ~500 MB two-layer image
// to an active snapshot through the CLI and the daemon, against a plain GET
// of the same objects plus tar -x into a fresh thin device (target: at most
// 1.1x); and the idempotent re-pull through the light client flyioctl
// (target: under 50 ms) and through the full binary, each against its
// start-up alone (`version`), and a static Go hello-world.
func BenchmarkPull(b *testing.B) {
	e := newPullEnvTB(b)
	// FLYIO_BENCH_MB, or else -flyio.bench-mb (testdata/vm-bench-args:
	// what `make test` runs), scales the image (default: about 500 MB).
	mb := *benchMB
	if v, err := strconv.Atoi(os.Getenv("FLYIO_BENCH_MB")); err == nil && v > 0 {
		mb = v
	}
	if mb > 0 {
		for i := range benchLayers {
			benchLayers[i].files = max(1, benchLayers[i].files*mb/496)
		}
	}
	var total int64
	for i, l := range benchLayers {
		data := genLayer(b, uint64(100+i), l.dir, l.files, l.size, l.base)
		total += int64(len(data))
		e.srv.Put(b, l.key, data)
	}
	runtime.GC()
	debug.FreeOSMemory()

	// The anchor runs before and after the pull; the pull is compared to
	// their mean, so a load burst on the (shared) machine hits both sides.
	anchor1 := anchorGetTar(b, e)
	start := time.Now()
	code, out, errOut := runCommand(b, nil, "pull", "--config", e.cfgPath, "s3://"+e.srv.Bucket+"/big/", "--name", "big")
	pull := time.Since(start)
	if code != 0 {
		b.Fatalf("pull: exit %d: %s %s", code, out, errOut)
	}
	phases := pullPhases(b, e, start)
	anchor2 := anchorGetTar(b, e)
	anchor := (anchor1 + anchor2) / 2

	// The re-pulls and their anchors run the real binaries (`make
	// build`), as an operator would, from a local file system: the
	// repository is shared into the VM over 9p, where every exec reads
	// the whole binary again.
	local := func(name string) string {
		built, err := os.ReadFile("../../bin/" + name)
		if err != nil {
			b.Fatalf("the binary %s (run make build first): %v", name, err)
		}
		p := filepath.Join(b.TempDir(), name)
		if err := os.WriteFile(p, built, 0o755); err != nil {
			b.Fatal(err)
		}
		return p
	}
	cli, ctl := local("containerd-flyio-snapshotter"), local("flyioctl")
	// The anchor of the start-up rows: a static Go hello-world, built
	// here (the VM sees the host's toolchain and build cache). Without a
	// toolchain the rows go without it rather than failing the pull's
	// figures.
	hello, helloErr := helloWorld(b.TempDir())
	timed := func(bin string, args ...string) (time.Duration, string) {
		s := time.Now()
		out, err := exec.Command(bin, args...).CombinedOutput()
		took := time.Since(s)
		if err != nil {
			b.Fatalf("%s %s: %v: %s", bin, strings.Join(args, " "), err, out)
		}
		return took, string(out)
	}
	repull := []string{"pull", "--config", e.cfgPath, "s3://" + e.srv.Bucket + "/big/", "--name", "big"}
	var repulls, versions, ctlRepulls, ctlVersions, calls, hellos []time.Duration
	// The daemon's share of a re-pull: the same request from this
	// process's control client, with no process to start.
	ctlClient := control.NewClient(e.cfg.Daemon.ControlSocket)
	call := func() time.Duration {
		s := time.Now()
		res, err := ctlClient.Pull(context.Background(), api.PullRequest{Bucket: e.srv.Bucket, Key: "big/", Ref: "big"}, nil)
		took := time.Since(s)
		if err != nil || res.Downloaded != 0 || res.Unpacked != 0 {
			b.Fatalf("re-pull over the control socket: %+v, %v", res, err)
		}
		return took
	}
	// The commands take turns, so that a load burst on the (shared)
	// machine hits them alike.
	for range 9 {
		for _, c := range []struct {
			bin  string
			args []string
			into *[]time.Duration
		}{{cli, repull, &repulls}, {cli, []string{"version"}, &versions}, {ctl, repull, &ctlRepulls}, {ctl, []string{"version"}, &ctlVersions}} {
			took, out := timed(c.bin, c.args...)
			if c.args[0] == "pull" && !strings.Contains(out, "downloaded 0, unpacked 0") {
				b.Fatalf("re-pull with %s: %s", c.bin, out)
			}
			*c.into = append(*c.into, took)
		}
		calls = append(calls, call())
		if helloErr == nil {
			took, _ := timed(hello)
			hellos = append(hellos, took)
		}
	}
	for _, d := range [][]time.Duration{repulls, versions, ctlRepulls, ctlVersions, calls, hellos} {
		slices.Sort(d)
	}
	med := func(d []time.Duration) time.Duration { return d[len(d)/2] }
	// toHello is a start-up row's ratio to the hello-world's median.
	toHello := func(d time.Duration) string {
		if len(hellos) == 0 {
			return ""
		}
		return fmt.Sprintf("%.2f", float64(d)/float64(med(hellos)))
	}

	w := os.Stdout
	fmt.Fprintf(w, "\nBenchmarkPull: image of %d layers, %.0f MiB of tar\n", len(benchLayers), float64(total)/(1<<20))
	fmt.Fprintf(w, "| measure | time | ratio | target |\n|---|---|---|---|\n")
	fmt.Fprintf(w, "| GET + tar -x + sync into a fresh thin device (anchor, mean of before %s and after %s) | %s | 1.00 | |\n",
		anchor1.Round(time.Millisecond), anchor2.Round(time.Millisecond), anchor.Round(time.Millisecond))
	fmt.Fprintf(w, "| pull -> active snapshot (CLI, daemon: download+SHA-256+validate+unpack+activate) | %s | %.2f | <= 1.10 |\n", pull.Round(time.Millisecond), float64(pull)/float64(anchor))
	for _, r := range []struct {
		name              string
		repulls, versions []time.Duration
		target            string
	}{{"flyioctl", ctlRepulls, ctlVersions, "< 50ms"}, {"containerd-flyio-snapshotter", repulls, versions, ""}} {
		fmt.Fprintf(w, "| idempotent re-pull, whole `%s pull` call (median of %d; ratio to the hello-world) | %s | %s | %s |\n", r.name, len(r.repulls), med(r.repulls).Round(time.Microsecond), toHello(med(r.repulls)), r.target)
		fmt.Fprintf(w, "| `%s version`: its start-up alone (median of %d; ratio to the hello-world) | %s | %s | |\n", r.name, len(r.versions), med(r.versions).Round(time.Microsecond), toHello(med(r.versions)))
		fmt.Fprintf(w, "| %s: re-pull minus start-up | %s | | |\n", r.name, (med(r.repulls) - med(r.versions)).Round(time.Microsecond))
	}
	fmt.Fprintf(w, "| the daemon's share: the same re-pull over the control socket from the benchmark's process (median of %d) | %s | | |\n", len(calls), med(calls).Round(time.Microsecond))
	if helloErr != nil {
		fmt.Fprintf(w, "| static Go hello-world (start-up anchor) | not built: %v | | |\n", helloErr)
	} else {
		fmt.Fprintf(w, "| static Go hello-world (start-up anchor, median of %d) | %s | 1.00 | |\n", len(hellos), med(hellos).Round(time.Microsecond))
	}
	fmt.Fprintf(w, "\nwhere the pull's time went (from the CLI's start):\n%s", phases)
	b.ReportMetric(float64(pull)/float64(anchor), "pull/anchor")
	b.ReportMetric(float64(med(ctlRepulls).Microseconds())/1000, "repull-ms")
	b.ReportMetric(float64(med(repulls).Microseconds())/1000, "full-cli-repull-ms")
	if len(hellos) > 0 {
		b.ReportMetric(float64(med(ctlRepulls))/float64(med(hellos)), "repull/hello")
	}
}

// pullPhases lists the runs the pull started after start, each with its
// start and end relative to start (from the database's run records).
func pullPhases(b *testing.B, e *pullEnv, start time.Time) string {
	runs, err := fsm.NewSQLiteStore(e.db()).ListRuns(context.Background(), fsm.RunFilter{})
	if err != nil {
		b.Fatal(err)
	}
	slices.SortFunc(runs, func(x, y fsm.RunRecord) int { return x.StartedAt.Compare(y.StartedAt) })
	var sb strings.Builder
	for _, r := range runs {
		if r.CreatedAt.Before(start) || r.StartedAt.IsZero() {
			continue
		}
		fmt.Fprintf(&sb, "  %-9s %-40.40s %7.2fs -> %7.2fs (%.2fs) %s\n", r.FSM, r.IdempotencyID,
			r.StartedAt.Sub(start).Seconds(), r.FinishedAt.Sub(start).Seconds(), r.FinishedAt.Sub(r.StartedAt).Seconds(), r.State)
	}
	return sb.String()
}
