//go:build !dm

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control/server"
)

var (
	startupCLI = flag.String("flyio.cli", "../../bin/containerd-flyio-snapshotter",
		"BenchmarkCLIStartup: the binary to time (make build writes the default)")
	startupCtl = flag.String("flyio.ctl", "../../bin/flyioctl",
		"BenchmarkCLIStartup: the light client to time beside it (make build writes the default)")
	startupBase = flag.String("flyio.cli-base", "",
		"BenchmarkCLIStartup: a second binary timed in the same run (e.g. main's build), for a before/after")
	startupRounds = flag.Int("flyio.startup-rounds", 100, "BenchmarkCLIStartup: runs of each command")
	startupWrap   = flag.String("flyio.startup-wrap", "",
		"BenchmarkCLIStartup: a command every timed program runs under, e.g. \"qemu-x86_64 -cpu max\" (user-mode TCG, a proxy for the VM's emulation)")
)

// stubPuller stands in for the daemon's pipelines behind the control
// socket: it answers every pull at once with an unchanged two-layer image
// (nothing downloaded or unpacked), as the daemon answers an idempotent
// re-pull from its records. What the daemon's own work costs is timed in
// the VM by BenchmarkPull; here only the CLI's side of the call is.
type stubPuller struct{}

func (stubPuller) Pull(_ context.Context, req api.PullRequest, progress func(api.Event)) (*api.PullResult, error) {
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	return &api.PullResult{Ref: req.Ref, Source: "s3://" + req.Bucket + "/" + req.Key, ImageID: id,
		Layers:     []api.Layer{{Key: req.Key + "01.tar"}, {Key: req.Key + "02.tar"}},
		TopChainID: "sha256:" + id,
		Snapshot: api.ActivateResponse{ImageID: id, SnapshotName: "snap-" + id, DeviceName: "flyio-pool-snap-7",
			DevicePath: "/dev/mapper/flyio-pool-snap-7", OriginDevice: 6, Active: true, Registered: true, Ref: req.Ref}}, nil
}

func (stubPuller) Activate(context.Context, string) (*api.ActivateResponse, error) {
	return nil, errors.New("stubPuller: activate is not timed")
}

// timedCmd is one command line of the table and what its runs took.
type timedCmd struct {
	label string
	args  []string
	want  string // in its standard output, checked on every run
	wall  []time.Duration
	cpu   []time.Duration // user + system time of the process
}

func (c *timedCmd) run(b *testing.B, wrap []string) {
	args := append(slices.Clone(wrap), c.args...)
	cmd := exec.Command(args[0], args[1:]...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if err != nil || !strings.Contains(out.String(), c.want) {
		b.Fatalf("%s: %v; stdout %q, stderr %q; want %q in stdout", strings.Join(args, " "), err, out.String(), errOut.String(), c.want)
	}
	c.wall = append(c.wall, took)
	c.cpu = append(c.cpu, cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkCLIStartup times the CLI's idempotent re-pull, whole process,
// against a control socket served in this process, beside the CLI's
// start-up alone (`version`) and two anchors: /bin/true and a static Go
// hello-world. Every command runs -flyio.startup-rounds times, the
// commands taking turns so that a load burst on the (shared) machine hits
// them alike; the table gives medians of wall time and of CPU time and
// their ratios to the hello-world. -flyio.cli-base adds the same rows for
// a second binary (before/after in one run); -flyio.startup-wrap runs
// every program under an emulator.
//
//	make build && go test -tags 'sqlite_omit_load_extension osusergo netgo' \
//	  ./cmd/containerd-flyio-snapshotter -run '^$' -bench CLIStartup -benchtime 1x
func BenchmarkCLIStartup(b *testing.B) {
	// The server logs every pull at info; the table is the output.
	if err := log.SetLevel("warn"); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	sock := filepath.Join(dir, "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- server.Serve(ctx, lis, stubPuller{}) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			b.Errorf("server.Serve: %v", err)
		}
	}()
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "[daemon]\ncontrol_socket = %q\n", sock), 0o644); err != nil {
		b.Fatal(err)
	}

	hello, err := helloWorld(dir)
	if err != nil {
		b.Fatal(err)
	}
	cmds := []*timedCmd{
		{label: "/bin/true", args: []string{"/bin/true"}},
		{label: "Go hello-world, static (anchor)", args: []string{hello}, want: "hello"},
	}
	const image = "s3://bench/images/app/"
	const result = "downloaded 0, unpacked 0"
	addCLI := func(name, bin string) {
		abs, err := filepath.Abs(bin)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := os.Stat(abs); err != nil {
			b.Fatalf("the CLI binary %s (run make build first, or pass -flyio.cli): %v", abs, err)
		}
		cmds = append(cmds,
			&timedCmd{label: name + " version", args: []string{abs, "version"}, want: " (commit "},
			&timedCmd{label: name + " pull --control-socket (re-pull)", args: []string{abs, "pull", "--control-socket", sock, image, "--name", "app"}, want: result},
			&timedCmd{label: name + " pull --config (re-pull)", args: []string{abs, "pull", "--config", cfg, image, "--name", "app"}, want: result})
	}
	if *startupBase != "" {
		addCLI("base:", *startupBase)
	}
	addCLI("cli:", *startupCLI)
	full := cmds[len(cmds)-3:]
	addCLI("flyioctl:", *startupCtl)
	light := cmds[len(cmds)-3:]

	wrap := strings.Fields(*startupWrap)
	for _, c := range cmds { // warm the page cache and the emulator's first run
		c.run(b, wrap)
		c.wall, c.cpu = nil, nil
	}
	for range *startupRounds {
		for _, c := range cmds {
			c.run(b, wrap)
		}
	}

	anchor := cmds[1]
	aw, ac := median(anchor.wall), median(anchor.cpu)
	w := os.Stdout
	fmt.Fprintf(w, "\nBenchmarkCLIStartup: %d runs of each command", *startupRounds)
	if len(wrap) > 0 {
		fmt.Fprintf(w, ", each under %q", *startupWrap)
	}
	fmt.Fprintf(w, "\n| command | wall (median) | ratio | CPU user+sys (median) | ratio |\n|---|---|---|---|---|\n")
	for _, c := range cmds {
		mw, mc := median(c.wall), median(c.cpu)
		fmt.Fprintf(w, "| %s | %s | %.2f | %s | %.2f |\n", c.label, mw.Round(10*time.Microsecond), float64(mw)/float64(aw),
			mc.Round(10*time.Microsecond), float64(mc)/float64(ac))
	}
	b.ReportMetric(float64(median(full[0].wall))/float64(aw), "version/hello")
	b.ReportMetric(float64(median(full[2].wall))/float64(aw), "repull/hello")
	b.ReportMetric(float64(median(full[2].wall).Microseconds())/1000, "repull-ms")
	b.ReportMetric(float64(median(light[2].wall))/float64(aw), "ctl-repull/hello")
	b.ReportMetric(float64(median(light[2].wall).Microseconds())/1000, "ctl-repull-ms")

	for _, c := range []*timedCmd{full[0], light[0]} {
		printInitCosts(b, w, wrap, c.args)
	}
}

// printInitCosts prints where the command args (a binary's version)
// spends its package initialisers, grouped by module.
func printInitCosts(b *testing.B, w io.Writer, wrap, args []string) {
	inits := initCosts(b, wrap, args, 9)
	fmt.Fprintf(w, "\nwhere `%s version` spends its package initialisers (GODEBUG=inittrace=1, median of 9 runs per package, grouped by module):\n", filepath.Base(args[0]))
	fmt.Fprintf(w, "| module | init clock | share |\n|---|---|---|\n")
	var total float64
	for _, c := range inits {
		total += c.ms
	}
	for i, c := range inits {
		if i == 15 {
			break
		}
		fmt.Fprintf(w, "| %s | %.2fms | %.0f%% |\n", c.module, c.ms, 100*c.ms/total)
	}
	fmt.Fprintf(w, "| all %d modules | %.2fms | 100%% |\n", len(inits), total)
}

// initCost is the start-up time the package initialisers of one module
// take.
type initCost struct {
	module string
	ms     float64
}

// initCosts runs args (a CLI command) runs times with GODEBUG=inittrace=1
// and returns, per module, the sum over its packages of each package's
// median init clock, most expensive first.
func initCosts(b *testing.B, wrap, args []string, runs int) []initCost {
	perPkg := map[string][]float64{}
	for range runs {
		all := append(slices.Clone(wrap), args...)
		cmd := exec.Command(all[0], all[1:]...)
		cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
		var trace strings.Builder
		cmd.Stderr = &trace
		if err := cmd.Run(); err != nil {
			b.Fatalf("%s with GODEBUG=inittrace=1: %v: %s", strings.Join(all, " "), err, trace.String())
		}
		// init PKG @T ms, C ms clock, B bytes, A allocs
		for _, line := range strings.Split(trace.String(), "\n") {
			var pkg, at string
			var clock float64
			if n, _ := fmt.Sscanf(line, "init %s %s ms, %g ms clock", &pkg, &at, &clock); n == 3 {
				perPkg[pkg] = append(perPkg[pkg], clock)
			}
		}
	}
	if len(perPkg) == 0 {
		b.Fatalf("%s printed no init trace", strings.Join(args, " "))
	}
	perModule := map[string]float64{}
	for pkg, clocks := range perPkg {
		slices.Sort(clocks)
		perModule[modulePrefix(pkg)] += clocks[len(clocks)/2]
	}
	var out []initCost
	for m, ms := range perModule {
		out = append(out, initCost{m, ms})
	}
	slices.SortFunc(out, func(x, y initCost) int {
		if x.ms != y.ms {
			if x.ms > y.ms {
				return -1
			}
			return 1
		}
		return strings.Compare(x.module, y.module)
	})
	return out
}

// modulePrefix names the module a package most likely belongs to from its
// path alone: "std" for the standard library, the first two elements under
// google.golang.org and go.opentelemetry.io, the first three elsewhere
// (github.com/OWNER/REPO, golang.org/x/REPO).
func modulePrefix(pkg string) string {
	parts := strings.Split(pkg, "/")
	if !strings.Contains(parts[0], ".") {
		return "std"
	}
	n := 3
	if parts[0] == "google.golang.org" || parts[0] == "go.opentelemetry.io" {
		n = 2
	}
	return strings.Join(parts[:min(n, len(parts))], "/")
}
