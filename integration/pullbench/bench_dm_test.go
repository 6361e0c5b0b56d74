//go:build dm

package pullbench

import (
	"bufio"
	"bytes"
	stdgzip "compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/transfer/image"
	"github.com/containerd/containerd/v2/core/transfer/registry"
	"github.com/containerd/platforms"
	kgzip "github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// The full size is the default (see docs/benchmarks.md); testdata/
// vm-bench-args scales it down for make test.
var (
	flagImageA = flag.String("pullbench.image-a", "45,30,20,15", "image A's layer sizes in MB, lowest first (comma separated)")
	flagImageB = flag.Int("pullbench.image-b", 100, "image B's single layer size in MB")
	flagRounds = flag.Int("pullbench.rounds", 3, "rounds: each way pulls each image once per round")
	// With "builtin", and CONTAINERD_DISABLE_IGZIP=1 in the environment
	// for containerd, every pull inflates with Go's code, as before igzip.
	flagGzipCommand = flag.String("pullbench.gzip-command", "", "our daemon's daemon.gzip_command (empty: the default, auto)")
	// flagProfile names a folder for the daemon's CPU profile over one
	// more S3 pull of each image after the rounds (s3-<image>.pprof), read
	// with `go tool pprof BINARY FILE`. That pull stays out of the medians,
	// so the profiler's own signals never weigh on them.
	flagProfile        = flag.String("pullbench.cpuprofile", "", "folder for the daemon's CPU profiles of one more S3 pull of each image after the rounds, not in the medians (empty: none)")
	flagProfileSeconds = flag.Int("pullbench.cpuprofile-seconds", 60, "length of each CPU profile: longer than an S3 pull, which it waits for")
)

// The ways a round pulls an image, and the floor, in the order of the
// first round; each round starts one later, so none always runs first.
const (
	wayDevmapper = "devmapper"
	wayOverlay   = "overlayfs"
	wayFlyio     = "flyio"
	wayS3        = "s3"
	wayFloor     = "floor"
)

var ways = []string{wayDevmapper, wayOverlay, wayFlyio, wayS3, wayFloor}

// wayTitle is the table's name of a way.
var wayTitle = map[string]string{
	wayDevmapper: "registry pull into containerd's devmapper (anchor)",
	wayOverlay:   "registry pull into overlayfs",
	wayFlyio:     "registry pull into flyio (our daemon as proxy snapshotter and differ)",
	wayS3:        "`containerd-flyio-snapshotter pull s3://` from versitygw (the CLI binary)",
	wayFloor:     "floor: the slowest of (a), (b), (c) below",
}

// target is a way's speed target: at most maxDevmapper times the
// devmapper registry pull and at most maxFloor times the floor (0: none).
// The table prints them and whether this run met them; the benchmark does
// not fail on them.
type target struct{ maxDevmapper, maxFloor float64 }

var wayTarget = map[string]target{
	wayFlyio: {maxDevmapper: 0.8},
	wayS3:    {maxDevmapper: 0.5, maxFloor: 2},
}

// describe says the target and whether ratios rdm (to devmapper) and
// rfloor (to the floor) meet it.
func (t target) describe(rdm, rfloor float64) string {
	var parts []string
	met := true
	if t.maxDevmapper > 0 {
		parts = append(parts, fmt.Sprintf("<= %gx devmapper", t.maxDevmapper))
		met = met && rdm <= t.maxDevmapper
	}
	if t.maxFloor > 0 {
		parts = append(parts, fmt.Sprintf("<= %gx floor", t.maxFloor))
		met = met && rfloor <= t.maxFloor
	}
	if len(parts) == 0 {
		return ""
	}
	verdict := "met"
	if !met {
		verdict = "not met"
	}
	return strings.Join(parts, ", ") + ": " + verdict
}

// floorParts are one round's measures of the floor.
type floorParts struct {
	get, inflate, inflateStd, tar time.Duration
	// inflateCmd is igzip's time for (b), the inflater the daemon runs
	// when it is installed (daemon.gzip_command = "auto"); 0 without it.
	inflateCmd time.Duration
}

func (f floorParts) floor() time.Duration { return max(f.get, f.fastestInflate(), f.tar) }

// fastestInflate is part (b): the faster of klauspost/compress and igzip.
func (f floorParts) fastestInflate() time.Duration {
	if f.inflateCmd > 0 {
		return min(f.inflate, f.inflateCmd)
	}
	return f.inflate
}

// samples are one image's measures over the rounds.
type samples struct {
	pulls  map[string][]time.Duration
	floors []floorParts
	// breakdown is the last round's S3 pull, step by step.
	breakdown string
	// profiled is the S3 pull run under the CPU profiler after the rounds
	// (nil: none).
	profiled *s3PullRun
	// peakRSS is the daemon's highest VmHWM over the S3 pulls, in KiB.
	peakRSS int64
}

// warmSpec is the image warmUp pulls: one small layer.
var warmSpec = imageSpec{name: "warm", layersMB: []int{1}}

// warmUp runs every way once on e.warm, unmeasured: what the first use of
// a snapshotter, of containerd's transfer service or of the runtime costs
// once (our daemon formats its base device on first use; containerd
// starts its first shim) must not land on the first round's first ways.
func (e *env) warmUp(ctx context.Context) error {
	s := &samples{pulls: map[string][]time.Duration{}}
	for _, w := range ways {
		if err := e.measure(ctx, e.warm, w, s, false, false, false); err != nil {
			return fmt.Errorf("warm-up, %s: %w", w, err)
		}
	}
	return nil
}

func parseSpecs() ([]imageSpec, error) {
	var a []int
	for _, f := range strings.Split(*flagImageA, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-pullbench.image-a %q: want layer sizes in MB, each at least 1, comma separated", *flagImageA)
		}
		a = append(a, n)
	}
	if *flagImageB < 1 {
		return nil, fmt.Errorf("-pullbench.image-b %d: want a size in MB, at least 1", *flagImageB)
	}
	if *flagRounds < 1 {
		return nil, fmt.Errorf("-pullbench.rounds %d: want at least 1", *flagRounds)
	}
	return []imageSpec{{name: "a", layersMB: a}, {name: "b", layersMB: []int{*flagImageB}}}, nil
}

// BenchmarkPull pulls two generated gzip images (A: several layers of
// thousands of files, B: one large layer) cold, four ways, in alternating
// rounds: from a local registry into containerd's devmapper snapshotter,
// into overlayfs and into our daemon (flyio), and with our CLI's pull from
// versitygw; and it measures the hardware's floor for each image in the
// same rounds. Every pull is checked by running a container on it. It
// prints, per image, the median of each way with its ratios to the
// devmapper pull and to the floor, the floor's parts, where the time of
// one S3 pull goes, and the daemon's peak RSS during the S3 pulls of A.
// It runs its rounds once, whatever b.N.
func BenchmarkPull(b *testing.B) {
	specs, err := parseSpecs()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	start := time.Now()
	e, err := setup(ctx, specs, b.Logf)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := e.close(); err != nil {
			b.Errorf("teardown: %v", err)
		}
	}()
	if err := e.warmUp(ctx); err != nil {
		b.Fatal(err)
	}
	setupTime := time.Since(start)

	res := make([]*samples, len(e.images))
	for i := range res {
		res[i] = &samples{pulls: map[string][]time.Duration{}}
	}
	b.ResetTimer()
	for r := 0; r < *flagRounds; r++ {
		for i, img := range e.images {
			for k := range ways {
				w := ways[(k+r)%len(ways)]
				if err := dropCaches(); err != nil {
					b.Fatal(err)
				}
				last := r == *flagRounds-1
				t := time.Now()
				if err := e.measure(ctx, img, w, res[i], i == 0, last, false); err != nil {
					// What the rounds before measured is still worth
					// reading.
					fmt.Print(report(fmt.Sprintf("%d rounds of %d, the last cut short", r, *flagRounds), setupTime, e.images, res))
					b.Fatalf("round %d, image %s, %s: %v\ncontainerd log tail:\n%s\nour daemon's log tail:\n%s",
						r+1, img.spec.name, w, err, e.ctrd.LogTail(20), e.daemon.Proc.LogTail(20))
				}
				b.Logf("round %d, image %s, %s: measured, checked and removed in %s", r+1, img.spec.name, w, time.Since(t).Round(time.Millisecond))
			}
		}
		b.Logf("round %d done after %s", r+1, time.Since(start).Round(time.Second))
	}
	if *flagProfile != "" {
		for i, img := range e.images {
			if err := dropCaches(); err != nil {
				b.Fatal(err)
			}
			if err := e.measure(ctx, img, wayS3, res[i], false, false, true); err != nil {
				b.Fatalf("image %s, the profiled S3 pull: %v\nour daemon's log tail:\n%s", img.spec.name, err, e.daemon.Proc.LogTail(20))
			}
		}
	}
	b.StopTimer()

	fmt.Print(report(fmt.Sprintf("%d rounds", *flagRounds), setupTime, e.images, res))
	a := res[0]
	dm := median(a.pulls[wayDevmapper])
	b.ReportMetric(ratio(median(a.pulls[wayS3]), dm), "A-s3/devmapper")
	b.ReportMetric(ratio(median(a.pulls[wayS3]), medianFloor(a.floors)), "A-s3/floor")
	b.ReportMetric(ratio(median(a.pulls[wayFlyio]), dm), "A-flyio/devmapper")
	b.ReportMetric(float64(a.peakRSS)/1024, "A-s3-peak-RSS-MiB")
}

// measure runs way w once on img, cold, and records it in s; the S3 pull
// of the last round also records where its time went, and those of the
// multi-layer image the daemon's peak RSS. A profiled S3 pull (profile)
// writes the daemon's CPU profile and is recorded apart from the rounds.
func (e *env) measure(ctx context.Context, img *benchImage, w string, s *samples, multi, last, profile bool) error {
	switch w {
	case wayFloor:
		f, err := e.measureFloor(ctx, img)
		if err != nil {
			return err
		}
		s.floors = append(s.floors, f)
		return nil
	case wayS3:
		ref := "pullbench.local/s3/" + img.spec.name + ":v1"
		pid := e.daemon.Proc.Pid()
		if multi {
			// Writing 5 to clear_refs resets the peak RSS (VmHWM).
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
				return fmt.Errorf("reset the daemon's peak RSS: %w", err)
			}
		}
		var profiled chan error
		if profile {
			profiled = make(chan error, 1)
			go func() { profiled <- e.daemonProfile(ctx, filepath.Join(*flagProfile, "s3-"+img.spec.name+".pprof")) }()
		}
		p, err := e.s3Pull(ctx, img, ref)
		if profiled != nil {
			err = errors.Join(err, <-profiled)
		}
		if err != nil {
			return err
		}
		if profile {
			s.profiled = p
		} else {
			s.pulls[w] = append(s.pulls[w], p.took)
		}
		if multi {
			hwm, err := procStatusKiB(pid, "VmHWM")
			if err != nil {
				return err
			}
			s.peakRSS = max(s.peakRSS, hwm)
		}
		if last {
			runs, err := e.runsSince(ctx, p.start)
			if err != nil {
				return err
			}
			s.breakdown = breakdown(img, p, runs)
		}
		if err := e.runContainer(ctx, img, ref, "flyio"); err != nil {
			return err
		}
		if _, err := stack.Run(ctx, nil, e.cli, "rm", "--config", e.daemon.Config, ref); err != nil {
			return err
		}
		return e.checkCold(ctx, img, "flyio")
	default:
		ref := e.reg.Host + "/pullbench/" + img.spec.name + ":v1"
		took, err := e.registryPull(ctx, ref, w)
		if err != nil {
			return err
		}
		s.pulls[w] = append(s.pulls[w], took)
		if err := e.runContainer(ctx, img, ref, w); err != nil {
			return err
		}
		if err := e.removeImage(ctx, ref); err != nil {
			return err
		}
		return e.checkCold(ctx, img, w)
	}
}

// daemonProfile writes to file the daemon's CPU profile over the next
// -pullbench.cpuprofile-seconds.
func (e *env) daemonProfile(ctx context.Context, file string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", e.daemon.Debug, *flagProfileSeconds)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("daemon's CPU profile: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("daemon's CPU profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("daemon's CPU profile: %s", resp.Status)
	}
	prof, err := io.ReadAll(resp.Body) // a few tens of KiB
	if err != nil {
		return fmt.Errorf("daemon's CPU profile: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("daemon's CPU profile: %w", err)
	}
	if err := os.WriteFile(file, prof, 0o644); err != nil {
		return fmt.Errorf("daemon's CPU profile: %w", err)
	}
	return nil
}

// dropCaches writes the dirty pages out and drops the page cache, dentries
// and inodes, so no pull finds what the one before read.
func dropCaches() error {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return fmt.Errorf("drop caches: %w", err)
	}
	return nil
}

// registryPull is what `ctr image pull --plain-http --snapshotter sn REF`
// asks of containerd (its transfer service fetches and unpacks), sent by
// the run's long-lived client: a ctr process costs seconds per start under
// emulation.
func (e *env) registryPull(ctx context.Context, ref, sn string) (time.Duration, error) {
	start := time.Now()
	reg, err := registry.NewOCIRegistry(ctx, ref, registry.WithDefaultScheme("http"))
	if err != nil {
		return 0, err
	}
	p := platforms.DefaultSpec()
	is := image.NewStore(ref, image.WithPlatforms(p), image.WithUnpack(p, sn))
	if err := e.client.Transfer(nsCtx(ctx), reg, is); err != nil {
		return 0, fmt.Errorf("pull %s into %s: %w", ref, sn, err)
	}
	return time.Since(start), nil
}

// pullLine is a line of `pull --format json`: a progress event, the
// result, or an error.
type pullLine struct {
	Event *struct {
		FSM   string `json:"fsm"`
		State string `json:"state"`
		Layer int    `json:"layer"`
		Bytes int64  `json:"bytes"`
	} `json:"event"`
	Result *struct {
		Ref        string `json:"ref"`
		Downloaded int    `json:"downloaded"`
	} `json:"result"`
	Error string `json:"error"`
}

// timedEvent is a progress event with when the CLI printed it, from the
// CLI's start.
type timedEvent struct {
	at         time.Duration
	fsm, state string
	layer      int
	bytes      int64
}

// s3PullRun is one run of our CLI's pull.
type s3PullRun struct {
	start  time.Time
	took   time.Duration
	events []timedEvent
	cpu    cpuUse
}

// s3Pull runs `pull --format json --name REF s3://bucket/images/<name>/`
// with the CLI binary, timestamping its events as they arrive, and checks
// that every layer was downloaded (the pull was cold).
func (e *env) s3Pull(ctx context.Context, img *benchImage, ref string) (*s3PullRun, error) {
	src := "s3://" + bucket + "/images/" + img.spec.name + "/"
	cmd := exec.CommandContext(ctx, e.cli, "pull", "--config", e.daemon.Config, "--format", "json", "--name", ref, src)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	procs := []namedPID{{"our daemon", e.daemon.Proc.Pid()}, {"versitygw", e.s3.Proc.Pid()}, {"containerd", e.ctrd.Pid()}}
	cpu0, err := takeCPUSnapshot(procs)
	if err != nil {
		return nil, err
	}
	p := &s3PullRun{start: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pull %s: %w", src, err)
	}
	var last pullLine
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		at := time.Since(p.start)
		var l pullLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			continue // not ours to judge here; the result line decides
		}
		if ev := l.Event; ev != nil {
			p.events = append(p.events, timedEvent{at: at, fsm: ev.FSM, state: ev.State, layer: ev.Layer, bytes: ev.Bytes})
		}
		last = l
	}
	werr := cmd.Wait()
	p.took = time.Since(p.start)
	if werr != nil || last.Result == nil {
		return nil, fmt.Errorf("pull %s: %v %s: %s", src, werr, last.Error, strings.TrimSpace(stderr.String()))
	}
	cpu1, err := takeCPUSnapshot(procs)
	if err != nil {
		return nil, err
	}
	p.cpu = cpuBetween(cpu0, cpu1)
	p.cpu.procs = append(p.cpu.procs, namedCPU{"the CLI", cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()})
	if last.Result.Downloaded != len(img.layers) {
		return nil, fmt.Errorf("pull %s downloaded %d layers, want all %d (a cold pull)", src, last.Result.Downloaded, len(img.layers))
	}
	return p, nil
}

// procStatusKiB reads a "Key: N kB" line of /proc/<pid>/status.
func procStatusKiB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, key)
}

// runsSince lists the daemon's state-machine runs created at or after
// start, from its database (read-only, beside the running daemon).
func (e *env) runsSince(ctx context.Context, start time.Time) ([]fsm.RunRecord, error) {
	db, err := metadata.Open(ctx, metadata.Options{Path: filepath.Join(e.daemon.Root, "metadata.db"), ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	all, err := fsm.NewSQLiteStore(db).ListRuns(ctx, fsm.RunFilter{})
	if err != nil {
		return nil, err
	}
	var runs []fsm.RunRecord
	for _, r := range all {
		if !r.CreatedAt.Before(start) && !r.StartedAt.IsZero() {
			runs = append(runs, r)
		}
	}
	slices.SortFunc(runs, func(x, y fsm.RunRecord) int { return x.StartedAt.Compare(y.StartedAt) })
	return runs, nil
}

// measureFloor measures the floor's parts for img: (a) GET every layer
// object at once from versitygw, discarding the bytes; (b) inflate the
// largest layer on one core with klauspost/compress's gzip and with igzip
// when it is installed, the faster counting (and the standard library's,
// for reference); (c) `tar -x` of the uncompressed
// layers onto a fresh ext4 thin device (made before the clock), then sync.
func (e *env) measureFloor(ctx context.Context, img *benchImage) (floorParts, error) {
	var f floorParts
	var err error
	if f.get, err = e.getAll(ctx, img); err != nil {
		return f, err
	}
	largest := img.layers[0]
	for _, l := range img.layers {
		if l.tarSize > largest.tarSize {
			largest = l
		}
	}
	gz, err := os.ReadFile(largest.gzPath)
	if err != nil {
		return f, err
	}
	if f.inflate, err = inflate(gz, func(r io.Reader) (io.Reader, error) { return kgzip.NewReader(r) }); err != nil {
		return f, err
	}
	if f.inflateStd, err = inflate(gz, func(r io.Reader) (io.Reader, error) { return stdgzip.NewReader(r) }); err != nil {
		return f, err
	}
	if igzip, lerr := exec.LookPath("igzip"); lerr == nil {
		if f.inflateCmd, err = inflateCommand(ctx, igzip, largest.gzPath); err != nil {
			return f, err
		}
	}
	if f.tar, err = e.tarOntoThin(ctx, img); err != nil {
		return f, err
	}
	return f, nil
}

func (e *env) getAll(ctx context.Context, img *benchImage) (time.Duration, error) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(img.layers))
	for n := range img.layers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := e.s3.Endpoint + "/" + bucket + "/" + img.s3Key(n)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				errs[n] = err
				return
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs[n] = err
				return
			}
			defer resp.Body.Close()
			got, err := io.Copy(io.Discard, resp.Body)
			if err == nil && (resp.StatusCode != http.StatusOK || got != img.layers[n].gzSize) {
				err = fmt.Errorf("GET %s: %s, %d bytes, want %d", url, resp.Status, got, img.layers[n].gzSize)
			}
			errs[n] = err
		}()
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// inflateCommand is how long the program gzip takes to inflate the file
// gzPath to /dev/null.
func inflateCommand(ctx context.Context, gzip, gzPath string) (time.Duration, error) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	cmd := exec.CommandContext(ctx, gzip, "-d", "-c", gzPath)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = null, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s -d -c %s: %w: %s", gzip, gzPath, err, stderr.Bytes())
	}
	return time.Since(start), nil
}

func inflate(gz []byte, open func(io.Reader) (io.Reader, error)) (time.Duration, error) {
	start := time.Now()
	r, err := open(bytes.NewReader(gz))
	if err != nil {
		return 0, err
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// floorDevice is the thin device id of the floor's ext4 device (the floor
// pool holds nothing else).
const floorDevice = 1

func (e *env) tarOntoThin(ctx context.Context, img *benchImage) (took time.Duration, err error) {
	name := floorPool + "-ext4"
	size, err := plugin.ParseSize(baseImageSize)
	if err != nil {
		return 0, err
	}
	if err := e.floor.CreateThin(ctx, floorDevice); err != nil {
		return 0, err
	}
	path, err := e.floor.Activate(ctx, name, floorDevice, int64(size))
	if err == nil {
		err = thinpool.Mkfs(ctx, path, thinpool.FSExt4, nil)
	}
	dir := filepath.Join(e.scratch, "floor-mnt")
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		err = unix.Mount(path, dir, "ext4", 0, strings.Join(thinpool.MountOptions(thinpool.FSExt4, false), ","))
	}
	defer func() {
		_ = unix.Unmount(dir, 0)
		err = errors.Join(err, e.floor.Deactivate(ctx, name), e.floor.Delete(ctx, floorDevice))
	}()
	if err != nil {
		return 0, fmt.Errorf("the floor's ext4 device: %w", err)
	}
	if err := dropCaches(); err != nil {
		return 0, err
	}
	start := time.Now()
	for _, l := range img.layers {
		if _, err := stack.Run(ctx, nil, "tar", "-x", "-f", l.tarPath, "-C", dir); err != nil {
			return 0, err
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, err
	}
	err = unix.Syncfs(fd)
	unix.Close(fd)
	return time.Since(start), err
}
