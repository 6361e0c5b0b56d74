// Command powerloss-guest is one boot of the power-loss test
// (integration/powerloss/run.sh drives the rounds from the host). It runs in
// the VM harness with a persistent disk ($VM_DISK): it starts the daemon's
// service (database, loop-file pool and pipelines, all on that disk) the way
// `serve` does, which reconciles whatever the previous boot left, then checks
// that every operation the log of earlier boots says was acknowledged is
// still there, that the pool's devices are the database's devices plus the
// quarantine, and that nothing an acknowledged operation made is
// quarantined. Then it runs a workload (Prepare with a file written into the
// mount, Commit, Remove, Cleanup through containerd's proxy snapshotter
// client, and S3 pulls through the control socket from an S3 server in this
// process) until, after -crash-after, it resets the machine with
// `echo b > /proc/sysrq-trigger`, which loses what the guest had not written
// to its disk.
//
// Every operation is announced on stdout before it starts ("PL" line with
// "t":"begin") and confirmed once it returned ("t":"ack"); the check of the
// next boot adds "t":"settled" for the one the crash cut when its effect is
// there, so that later boots count it as done. stdout is a
// virtio serial port whose writes the host has taken before write returns,
// so the host's record outlives the crash. -log is that record of the
// earlier boots.
//
//	powerloss-guest -round N -log FILE -sync full|normal -crash-after DURATION
//
// The boot's verdict is a line "PL-CHECK key=value..." with the counts,
// followed by a PL-LOST line per lost operation and a PL-VIOLATION line per
// broken invariant; the exit status is 1 when a check that holds whatever
// the synchronous setting failed, or when, with -sync full, an acknowledged
// operation was lost.
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

const (
	namespace = "powerloss"
	bucket    = "images"
	// pullsPerRound bounds the S3 images a round can pull; each boot
	// uploads the images of this round and the one before, so that a pull
	// the crash interrupted resumes after the reboot.
	pullsPerRound = 40
	// pullEvery is how many Prepare/Commit/Remove iterations come between
	// two pulls.
	pullEvery = 3
)

// event is one "PL" line: an operation announced (T "begin"),
// acknowledged (T "ack"), or, for the one a crash cut, found done by the
// next boot's check (T "settled").
type event struct {
	T      string `json:"t"`
	Seq    string `json:"seq"` // round#n, the same on begin and ack
	Op     string `json:"op"`  // prepare, write, commit, remove, pull
	Key    string `json:"key,omitempty"`
	Parent string `json:"parent,omitempty"` // prepare: the parent
	Name   string `json:"name,omitempty"`   // commit target
	Data   string `json:"data,omitempty"`   // write: the file's content
	Image  string `json:"image,omitempty"`  // pull: image id
	Dev    uint32 `json:"dev,omitempty"`    // ack: thin id of what the op made
	Src    string `json:"source,omitempty"` // pull: S3 source
}

// markerFile is the file each write puts in a snapshot.
const markerFile = "powerloss.txt"

type guest struct {
	ctx   context.Context
	svc   *plugin.Service
	sn    snapshots.Snapshotter
	ctl   *control.Client
	round int
	seq   int
}

func main() {
	round := flag.Int("round", 0, "this boot's round number (keys and images carry it)")
	logPath := flag.String("log", "", "the PL lines of earlier boots (missing: first boot)")
	syncMode := flag.String("sync", string(metadata.DefaultSynchronous), "the database's [metadata] synchronous setting")
	crashAfter := flag.Duration("crash-after", 0, "reset the machine this long after the workload starts; 0: check only and exit")
	flag.Parse()
	if err := run(*round, *logPath, *syncMode, *crashAfter); err != nil {
		fmt.Fprintf(os.Stderr, "powerloss-guest: %v\n", err)
		os.Exit(1)
	}
}

func run(round int, logPath, syncMode string, crashAfter time.Duration) error {
	if round < 1 {
		return fmt.Errorf("-round must be at least 1, got %d", round)
	}
	disk := os.Getenv("VM_DISK")
	if disk == "" {
		return errors.New("VM_DISK is not set: run through integration/vm/run.sh --disk")
	}
	// The daemon runs on a plain context, as serve does: the pipelines keep
	// the pulled images in [containerd] namespace, apart from the
	// workload's namespace.
	daemonCtx := context.Background()
	ctx := namespaces.WithNamespace(daemonCtx, namespace)
	if err := log.SetLevel("warn"); err != nil {
		return err
	}
	prior, err := readLog(logPath)
	if err != nil {
		return err
	}

	// The VM boots without a network: the S3 server needs loopback up.
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set lo up: %v: %s", err, out)
	}
	s3url, err := serveS3(round)
	if err != nil {
		return err
	}

	root := filepath.Join(disk, "root")
	cfg := plugin.DefaultConfig()
	cfg.Daemon.RootDir = root
	cfg.Daemon.Socket = "/run/powerloss/snap.sock"
	cfg.Daemon.ControlSocket = "/run/powerloss/control.sock"
	cfg.Metadata.Path = filepath.Join(root, "metadata.db")
	cfg.Metadata.Synchronous = metadata.Synchronous(syncMode)
	cfg.Pool.RootDir = filepath.Join(root, "pool")
	cfg.Pipeline.DownloadDir = filepath.Join(root, "images")
	cfg.Pool.Name = "powerloss"
	cfg.Pool.DataSize = 1 << 30
	cfg.Pool.MetadataSize = 16 << 20
	cfg.Pool.BaseImageSize = 64 << 20
	cfg.S3.Region, cfg.S3.Endpoint, cfg.S3.PathStyle, cfg.S3.Anonymous = "us-east-1", s3url, true, true
	if err := cfg.Validate(); err != nil {
		return err
	}

	t0 := time.Now()
	svc, err := plugin.Open(daemonCtx, cfg)
	if err != nil {
		return fmt.Errorf("daemon start: %w", err)
	}
	stop, err := svc.StartFetcher(daemonCtx)
	if err != nil {
		return fmt.Errorf("daemon start: %w", err)
	}
	defer stop()
	serveCtx, stopServe := context.WithCancel(daemonCtx)
	defer stopServe()
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- svc.Serve(serveCtx, func() { close(ready) }, nil) }()
	select {
	case <-ready:
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	}
	conn, err := grpc.NewClient("unix://"+cfg.Daemon.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	g := &guest{ctx: ctx, svc: svc, sn: proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "flyio"),
		ctl: control.NewClient(cfg.Daemon.ControlSocket), round: round}
	// Runs a crash interrupted resume in StartFetcher: wait for them, so
	// that the check sees what they settle on.
	if err := g.waitRuns(3 * time.Minute); err != nil {
		return err
	}
	startup := time.Since(t0)

	rep, err := g.check(prior)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	rep.Round, rep.Sync, rep.StartupSeconds = round, syncMode, startup.Seconds()
	rep.print()
	failed := len(rep.Violations) > 0 || (syncMode == string(metadata.SynchronousFull) && rep.Lost > 0)
	if crashAfter <= 0 {
		if failed {
			return errors.New("checks failed (see PL-CHECK)")
		}
		return nil
	}

	if err := g.removeAll(); err != nil {
		return fmt.Errorf("removing the earlier rounds' snapshots: %w", err)
	}
	time.AfterFunc(crashAfter, func() {
		// Writing 'b' resets the machine at once: no sync, no unmount.
		_ = os.WriteFile("/proc/sysrq-trigger", []byte("b"), 0)
	})
	if err := g.workload(); err != nil {
		return fmt.Errorf("workload: %w", err)
	}
	return errors.New("the workload ended before the crash")
}

// emit writes one PL line in one write.
func emit(e event) {
	b, _ := json.Marshal(e)
	os.Stdout.Write(append([]byte("PL "), append(b, '\n')...))
}

// do announces op, runs fn and acknowledges it with what fn filled in.
func (g *guest) do(e event, fn func(e *event) error) error {
	g.seq++
	e.Seq = fmt.Sprintf("%d#%d", g.round, g.seq)
	e.T = "begin"
	emit(e)
	if err := fn(&e); err != nil {
		return fmt.Errorf("%s %s%s: %w", e.Op, e.Key, e.Src, err)
	}
	e.T = "ack"
	emit(e)
	return nil
}

// devOf is the thin id of snapshot key, or 0 when the snapshotter does
// not know it.
func (g *guest) devOf(key string) uint32 {
	_, _, id, err := g.svc.Snapshotter.DeviceOf(g.ctx, key)
	if err != nil {
		return 0
	}
	return id
}

func (g *guest) prepare(key, parent string) error {
	return g.do(event{Op: "prepare", Key: key, Parent: parent}, func(e *event) error {
		if _, err := g.sn.Prepare(g.ctx, key, parent); err != nil {
			return err
		}
		e.Dev = g.devOf(key)
		return nil
	})
}

// write puts markerFile with data into the active snapshot key and
// fsyncs it before the mount goes.
func (g *guest) write(key, data string) error {
	return g.do(event{Op: "write", Key: key, Data: data}, func(*event) error {
		mounts, err := g.sn.Mounts(g.ctx, key)
		if err != nil {
			return err
		}
		return mount.WithTempMount(g.ctx, mounts, func(root string) error {
			f, err := os.Create(filepath.Join(root, markerFile))
			if err != nil {
				return err
			}
			if _, err := f.WriteString(data); err != nil {
				f.Close()
				return err
			}
			if err := f.Sync(); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		})
	})
}

func (g *guest) commit(key, name string) error {
	return g.do(event{Op: "commit", Key: key, Name: name}, func(e *event) error {
		if err := g.sn.Commit(g.ctx, name, key); err != nil {
			return err
		}
		e.Dev = g.devOf(name)
		return nil
	})
}

func (g *guest) remove(key string) error {
	return g.do(event{Op: "remove", Key: key}, func(*event) error {
		if err := g.sn.Remove(g.ctx, key); err != nil {
			return err
		}
		// containerd's collector calls Cleanup after removing: the
		// device goes then.
		return g.sn.(snapshots.Cleaner).Cleanup(g.ctx)
	})
}

func (g *guest) pull(n int) error {
	key := imageKey(g.round, n)
	return g.do(event{Op: "pull", Src: "s3://" + bucket + "/" + key}, func(e *event) error {
		res, err := g.ctl.Pull(g.ctx, api.PullRequest{Bucket: bucket, Key: key}, nil)
		if err != nil {
			return err
		}
		e.Image = res.ImageID
		e.Key = res.Snapshot.SnapshotName
		e.Dev = res.Snapshot.OriginDevice
		return nil
	})
}

// workload loops until the crash: each iteration prepares a on the base,
// writes into it, commits it as a-c, prepares b on a-c (a snapshot of a
// snapshot), writes, removes b and the previous iteration's a-c; every
// pullEvery iterations it pulls a new image.
func (g *guest) workload() error {
	prevCommitted := ""
	for i := 0; ; i++ {
		a := fmt.Sprintf("r%d-a%d", g.round, i)
		b := fmt.Sprintf("r%d-b%d", g.round, i)
		steps := []func() error{
			func() error { return g.prepare(a, "") },
			func() error { return g.write(a, "round "+a) },
			func() error { return g.commit(a, a+"-c") },
			func() error { return g.prepare(b, a+"-c") },
			func() error { return g.write(b, "round "+b) },
			func() error { return g.remove(b) },
		}
		if prevCommitted != "" {
			p := prevCommitted
			steps = append(steps, func() error { return g.remove(p) })
		}
		if i%pullEvery == 0 && i/pullEvery < pullsPerRound {
			n := i / pullEvery
			steps = append(steps, func() error { return g.pull(n) })
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return err
			}
		}
		prevCommitted = a + "-c"
	}
}

// removeAll removes every snapshot of the namespace, children first, so
// that each round starts from the base and the pulled images.
func (g *guest) removeAll() error {
	for {
		infos, err := g.walk()
		if err != nil {
			return err
		}
		if len(infos) == 0 {
			return nil
		}
		parents := map[string]bool{}
		for _, in := range infos {
			if in.Parent != "" {
				parents[in.Parent] = true
			}
		}
		for _, in := range infos {
			if !parents[in.Name] {
				if err := g.remove(in.Name); err != nil {
					return err
				}
			}
		}
	}
}

// workloadKey matches the keys the workload makes (r<round>-a<i>,
// r<round>-a<i>-c, r<round>-b<i>); the pulled images' layer snapshots are
// the pipelines', listed too.
var workloadKey = regexp.MustCompile(`^r[0-9]+-[ab][0-9]+(-c)?$`)

// walk lists the workload's snapshots.
func (g *guest) walk() ([]snapshots.Info, error) {
	var out []snapshots.Info
	err := g.sn.Walk(g.ctx, func(_ context.Context, in snapshots.Info) error {
		if workloadKey.MatchString(in.Name) {
			out = append(out, in)
		}
		return nil
	})
	return out, err
}

func (g *guest) waitRuns(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		n, err := pipeline.RecordsOf(g.svc.DB).LiveRuns(g.ctx)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d state-machine runs still live %s after start-up", n, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// report is the verdict of one boot's checks.
type report struct {
	Round          int      `json:"round"`
	Sync           string   `json:"sync"`
	StartupSeconds float64  `json:"startup_s"`
	Acked          int      `json:"acked"`       // acknowledged operations in the log
	InFlight       string   `json:"in_flight"`   // the operation the crash cut, if any
	Lost           int      `json:"lost"`        // acknowledged operations whose effect is missing
	LostOps        []string `json:"lost_ops"`    // what they were
	Quarantined    int      `json:"quarantined"` // quarantined thin ids in all
	QuarantinedAck int      `json:"quarantined_acked"`
	PoolDevices    int      `json:"pool_devices"`
	Violations     []string `json:"violations"` // broken invariants: pool vs records, stray snapshots
}

// print writes the verdict for the host: one PL-CHECK line of counts, a
// PL-LOST line per lost operation and a PL-VIOLATION line per broken
// invariant.
func (r *report) print() {
	var b strings.Builder
	inflight := strings.ReplaceAll(r.InFlight, " ", ":")
	if inflight == "" {
		inflight = "-"
	}
	fmt.Fprintf(&b, "PL-CHECK round=%d sync=%s acked=%d in_flight=%s lost=%d quarantined=%d quarantined_acked=%d pool_devices=%d startup_s=%.2f violations=%d\n",
		r.Round, r.Sync, r.Acked, inflight, r.Lost, r.Quarantined, r.QuarantinedAck, r.PoolDevices, r.StartupSeconds, len(r.Violations))
	for _, l := range r.LostOps {
		fmt.Fprintf(&b, "PL-LOST round=%d %s\n", r.Round, l)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "PL-VIOLATION round=%d %s\n", r.Round, v)
	}
	os.Stdout.WriteString(b.String())
}

// readLog reads the PL events of earlier boots.
func readLog(path string) ([]event, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "PL ")
		if !ok {
			continue
		}
		var e event
		if err := json.Unmarshal([]byte(rest), &e); err != nil {
			return nil, fmt.Errorf("%s: bad line %q: %w", path, sc.Text(), err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// expected is what the acknowledged operations add up to: snapshot key →
// kind ("active" or "committed") and, for those written, the content of
// markerFile; plus the images pulled and the thin ids made by operations
// not undone since.
type expected struct {
	snaps  map[string]string
	files  map[string]string
	images map[string]string // image id → the ack's description
	devs   map[uint32]string // thin id → the ack's description
}

func newExpected() *expected {
	return &expected{snaps: map[string]string{}, files: map[string]string{}, images: map[string]string{}, devs: map[uint32]string{}}
}

func (x *expected) apply(e event) {
	switch e.Op {
	case "prepare":
		x.snaps[e.Key] = "active"
		if e.Dev != 0 {
			x.devs[e.Dev] = "prepare " + e.Key
		}
	case "write":
		x.files[e.Key] = e.Data
	case "commit":
		delete(x.snaps, e.Key)
		x.snaps[e.Name] = "committed"
		if d, ok := x.files[e.Key]; ok {
			x.files[e.Name] = d
			delete(x.files, e.Key)
		}
		if e.Dev != 0 {
			x.devs[e.Dev] = "commit " + e.Name
		}
	case "remove":
		delete(x.snaps, e.Key)
		delete(x.files, e.Key)
		for id, what := range x.devs {
			if what == "prepare "+e.Key || what == "commit "+e.Key {
				delete(x.devs, id)
			}
		}
	case "pull":
		x.images[e.Image] = e.Src
		if e.Dev != 0 {
			x.devs[e.Dev] = "pull " + e.Src
		}
	}
}

func (x *expected) clone() *expected {
	c := newExpected()
	for k, v := range x.snaps {
		c.snaps[k] = v
	}
	for k, v := range x.files {
		c.files[k] = v
	}
	for k, v := range x.images {
		c.images[k] = v
	}
	for k, v := range x.devs {
		c.devs[k] = v
	}
	return c
}

// check compares the service after start-up with the acknowledged events.
// The one operation announced and not acknowledged (the crash cut it) may
// have happened or not: the snapshots must match one of the two.
func (g *guest) check(prior []event) (*report, error) {
	rep := &report{LostOps: []string{}, Violations: []string{}}
	acked := map[string]bool{}
	for _, e := range prior {
		switch e.T {
		case "ack":
			acked[e.Seq] = true
			rep.Acked++
		case "settled":
			acked[e.Seq] = true
		}
	}
	x := newExpected()
	var inflight *event
	for i, e := range prior {
		switch {
		case e.T == "ack" || e.T == "settled":
			x.apply(e)
		case e.T == "begin" && !acked[e.Seq]:
			inflight = &prior[i]
		}
	}
	alternatives := []*expected{x}
	if inflight != nil {
		rep.InFlight = strings.TrimSpace(strings.Join([]string{inflight.Op, inflight.Key, inflight.Name, inflight.Src}, " "))
		after := x.clone()
		after.apply(*inflight)
		alternatives = append(alternatives, after)
	}

	infos, err := g.walk()
	if err != nil {
		return nil, err
	}
	have := map[string]string{}
	for _, in := range infos {
		have[in.Name] = strings.ToLower(in.Kind.String())
	}
	// The alternative that explains the most of what is there is the one
	// the crash left; what it lacks is lost, what it does not expect is a
	// stray snapshot.
	best, bestLost, bestStray := x, []string(nil), []string(nil)
	for i, alt := range alternatives {
		var lost, stray []string
		for k, kind := range alt.snaps {
			if have[k] != kind {
				lost = append(lost, fmt.Sprintf("%s snapshot %s (found %q)", kind, k, have[k]))
			}
		}
		for k := range have {
			if _, ok := alt.snaps[k]; !ok {
				stray = append(stray, fmt.Sprintf("snapshot %s (%s) that no acknowledged operation left", k, have[k]))
			}
		}
		if i == 0 || len(lost)+len(stray) < len(bestLost)+len(bestStray) {
			best, bestLost, bestStray = alt, lost, stray
		}
	}
	if inflight != nil && best != x {
		// The cut operation took effect: later boots replay it as done.
		settled := *inflight
		settled.T = "settled"
		emit(settled)
	}
	rep.LostOps = append(rep.LostOps, bestLost...)
	// A stray snapshot is what a lost Remove leaves: count it as lost too.
	rep.LostOps = append(rep.LostOps, bestStray...)

	for key, data := range best.files {
		if have[key] == "" {
			continue // already counted as lost
		}
		got, err := g.readMarker(key, have[key] == "committed")
		if err != nil || got != data {
			rep.LostOps = append(rep.LostOps, fmt.Sprintf("write into %s: file %q, err %v; want %q", key, got, err, data))
		}
	}
	for id, src := range best.images {
		img, err := pipeline.RecordsOf(g.svc.DB).GetImage(g.ctx, id)
		if err != nil || img == nil || img.PulledAt.IsZero() || img.FailureReason != "" {
			rep.LostOps = append(rep.LostOps, fmt.Sprintf("pull %s (image %s): %+v, %v", src, id, img, err))
		}
	}
	rep.Lost = len(rep.LostOps)

	// The pool holds exactly the recorded devices and the quarantined ones
	// start-up left in place; no intent is left.
	reads := snapshotter.ReadRecords(g.svc.DB)
	ids, err := g.svc.Pool.ThinIDs(g.ctx)
	if err != nil {
		return nil, err
	}
	devs, err := reads.ThinDevices(g.ctx, "")
	if err != nil {
		return nil, err
	}
	qs, err := reads.QuarantinedIDs(g.ctx)
	if err != nil {
		return nil, err
	}
	var want []uint32
	for _, d := range devs {
		want = append(want, d.ID)
	}
	for _, q := range qs {
		if !q.Deleted {
			want = append(want, q.DeviceID)
		}
		if what, ok := best.devs[q.DeviceID]; ok {
			rep.QuarantinedAck++
			rep.LostOps = append(rep.LostOps, fmt.Sprintf("thin id %d of acknowledged %s quarantined: %s", q.DeviceID, what, q.Reason))
		}
	}
	rep.Quarantined = len(qs)
	rep.PoolDevices = len(ids)
	rep.Lost = len(rep.LostOps)
	slices.Sort(want)
	want = slices.Compact(want)
	got := slices.Clone(ids)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		rep.Violations = append(rep.Violations, fmt.Sprintf("pool thin ids %v != database devices + quarantine %v", got, want))
	}
	ins, err := reads.Intents(g.ctx)
	if err != nil {
		return nil, err
	}
	if len(ins) != 0 {
		rep.Violations = append(rep.Violations, fmt.Sprintf("%d intent rows left after start-up: %+v", len(ins), ins))
	}
	sort.Strings(rep.LostOps)
	return rep, nil
}

// readMarker reads markerFile of snapshot key (through a view when it is
// committed).
func (g *guest) readMarker(key string, committed bool) (string, error) {
	var mounts []mount.Mount
	var err error
	if committed {
		view := key + "-view"
		if mounts, err = g.sn.View(g.ctx, view, key); err != nil {
			return "", err
		}
		defer g.sn.Remove(g.ctx, view)
	} else if mounts, err = g.sn.Mounts(g.ctx, key); err != nil {
		return "", err
	}
	var data []byte
	err = mount.WithReadonlyTempMount(g.ctx, mounts, func(root string) error {
		var rerr error
		data, rerr = os.ReadFile(filepath.Join(root, markerFile))
		return rerr
	})
	return string(data), err
}

// imageKey is the S3 key of image n of a round.
func imageKey(round, n int) string { return fmt.Sprintf("pl/r%03d-%02d.tar", round, n) }

// serveS3 starts an S3 server on loopback holding the images of this round
// and the one before (whose pull the crash may have cut, to resume now),
// and returns its URL.
func serveS3(round int) (string, error) {
	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		return "", err
	}
	for r := max(1, round-1); r <= round; r++ {
		for n := 0; n < pullsPerRound; n++ {
			data, err := imageTar(r, n)
			if err != nil {
				return "", err
			}
			if _, err := backend.PutObject(bucket, imageKey(r, n), map[string]string{}, bytes.NewReader(data), int64(len(data)), nil); err != nil {
				return "", err
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog())).Server(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return "http://" + l.Addr().String(), nil
}

// imageTar is a one-layer image with the layout a pull requires and a file
// naming the image, plus some random bytes so that no two images share a
// layer (each pull downloads and unpacks).
func imageTar(round, n int) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	for _, d := range []string{"etc", "usr", "var"} {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
			return nil, err
		}
	}
	rng := rand.New(rand.NewPCG(uint64(round), uint64(n)))
	body := make([]byte, 8<<10)
	for i := range body {
		body[i] = byte(rng.UintN(256))
	}
	files := map[string][]byte{"etc/powerloss-image": []byte(imageKey(round, n)), "usr/payload": body}
	for _, name := range []string{"etc/powerloss-image", "usr/payload"} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[name])), ModTime: mtime}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[name]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
