//go:build dm

package pullbench

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
)

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	c := slices.Clone(d)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

// medianParts is the median of each floor part over the rounds.
func medianParts(fs []floorParts) floorParts {
	pick := func(f func(floorParts) time.Duration) time.Duration {
		var d []time.Duration
		for _, p := range fs {
			d = append(d, f(p))
		}
		return median(d)
	}
	return floorParts{
		get:        pick(func(p floorParts) time.Duration { return p.get }),
		inflate:    pick(func(p floorParts) time.Duration { return p.inflate }),
		inflateStd: pick(func(p floorParts) time.Duration { return p.inflateStd }),
		inflateCmd: pick(func(p floorParts) time.Duration { return p.inflateCmd }),
		tar:        pick(func(p floorParts) time.Duration { return p.tar }),
	}
}

// medianFloor is the median over the rounds of each round's floor (the
// slowest of its parts).
func medianFloor(fs []floorParts) time.Duration {
	var d []time.Duration
	for _, p := range fs {
		d = append(d, p.floor())
	}
	return median(d)
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// report is the benchmark's output: a heading naming the rounds run, then
// each image's table.
func report(rounds string, setup time.Duration, imgs []*benchImage, res []*samples) string {
	var out strings.Builder
	fmt.Fprintf(&out, "\nBenchmarkPull: %s, ways alternating; set-up (images, registry, versitygw, daemon, containerd, a warm-up pull each way) %s; TCG VM\n",
		rounds, setup.Round(time.Second))
	for i, img := range imgs {
		writeTable(&out, img, res[i])
	}
	return out.String()
}

// writeTable writes one image's table, its floor's parts, where the time
// of its last S3 pull went, and the daemon's peak RSS.
func writeTable(out *strings.Builder, img *benchImage, s *samples) {
	var sizes []string
	for _, l := range img.layers {
		sizes = append(sizes, fmt.Sprintf("%s (%s gzip, %d files)", mb(l.tarSize), mb(l.gzSize), l.files))
	}
	fmt.Fprintf(out, "\n### image %s: %d layer(s), %s unpacked in %d files, %s gzip\n\nlayers: %s\n\n",
		strings.ToUpper(img.spec.name), len(img.layers), mb(img.tarBytes()), img.files(), mb(img.gzBytes()), strings.Join(sizes, "; "))
	dm, floor := median(s.pulls[wayDevmapper]), medianFloor(s.floors)
	fmt.Fprintf(out, "| way | median | samples | ratio to devmapper registry pull | ratio to floor | target |\n|---|---|---|---|---|---|\n")
	for _, w := range ways {
		var d time.Duration
		var all []time.Duration
		if w == wayFloor {
			d = floor
			for _, f := range s.floors {
				all = append(all, f.floor())
			}
		} else {
			all = s.pulls[w]
			d = median(all)
		}
		var each []string
		for _, x := range all {
			each = append(each, secs(x))
		}
		rdm, rfloor := ratio(d, dm), ratio(d, floor)
		fmt.Fprintf(out, "| %s | %s | %s | %.2f | %.2f | %s |\n", wayTitle[w], secs(d), strings.Join(each, " "), rdm, rfloor, wayTarget[w].describe(rdm, rfloor))
	}
	p := medianParts(s.floors)
	igzip := "not installed"
	if p.inflateCmd > 0 {
		igzip = secs(p.inflateCmd)
	}
	fmt.Fprintf(out, "\nfloor parts (medians): (a) GET of all %d objects at once, bytes discarded: %s; (b) inflating the largest layer on one core, the faster of klauspost/compress gzip: %s and igzip: %s (standard library, for reference: %s); (c) `tar -x` of the %d uncompressed layers onto a fresh ext4 thin device, then sync: %s\n",
		len(img.layers), secs(p.get), secs(p.inflate), igzip, secs(p.inflateStd), len(img.layers), secs(p.tar))
	fmt.Fprintf(out, "registry pulls: one long-lived containerd Go client asks containerd's transfer service what `ctr image pull --plain-http --snapshotter X` asks (a ctr start costs seconds under emulation); every pull is cold (image, content, snapshots and devices removed, page cache dropped) and checked by running a container on it\n")
	if s.peakRSS > 0 {
		fmt.Fprintf(out, "\nour daemon's peak RSS (VmHWM, reset before each) during the S3 pulls of this image: %.1f MiB (target: <= 64 MiB plus the parts in flight)\n", float64(s.peakRSS)/1024)
	}
	if s.breakdown != "" {
		fmt.Fprintf(out, "\n%s", s.breakdown)
	}
	if p := s.profiled; p != nil {
		fmt.Fprintf(out, "\none more S3 pull, under our daemon's CPU profiler, after the rounds (not in the medians): %s; %s\n", secs(p.took), p.cpu)
	}
}

// stepGroup is the events of one state machine for one layer (0: the
// whole image, as Activate's).
type stepGroup struct {
	fsm   string
	layer int
	steps []step
	last  time.Duration // the group's last event
}

type step struct {
	state string
	from  time.Duration
	bytes int64 // the step's last event's byte count
}

// breakdown lists where the time of one S3 pull went: the daemon's runs
// from its database (queued, started, finished, relative to the CLI's
// start) and, within each run, its steps from the CLI's progress events
// (timestamped as they arrived), each lasting until the next step of the
// same run began, the last until the run finished.
func breakdown(img *benchImage, p *s3PullRun, runs []fsm.RunRecord) string {
	var b strings.Builder
	rel := func(t time.Time) time.Duration { return t.Sub(p.start) }
	// A run's layer is the one whose object key its request names; a run
	// naming several (Activate's) is the whole image's.
	layerOf := func(r fsm.RunRecord) int {
		layer := 0
		for n := range img.layers {
			if strings.Contains(string(r.Request), img.s3Key(n)) {
				if layer != 0 {
					return 0
				}
				layer = n + 1
			}
		}
		return layer
	}
	fmt.Fprintf(&b, "where the time goes, last round's S3 pull of image %s: %s from the CLI's start to its exit; first event at %s, last at %s\n\n",
		strings.ToUpper(img.spec.name), secs(p.took), firstAt(p.events), lastAt(p.events))
	fmt.Fprintf(&b, "%s\n\n", p.cpu)
	fmt.Fprintf(&b, "| layer | machine | run queued | started | finished | run took | state |\n|---|---|---|---|---|---|---|\n")
	// finished is when each machine's run for a layer finished, and
	// finishedFSM when a machine's only run did: the events of a
	// one-layer image may name layer 1 where the run names the image.
	finished := map[[2]string]time.Duration{}
	finishedFSM := map[string][]time.Duration{}
	for _, r := range runs {
		l := layerOf(r)
		if !r.FinishedAt.IsZero() {
			if key := [2]string{r.FSM, fmt.Sprint(l)}; finished[key] == 0 {
				finished[key] = rel(r.FinishedAt)
			}
			finishedFSM[r.FSM] = append(finishedFSM[r.FSM], rel(r.FinishedAt))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", layerName(l), r.FSM, secs(rel(r.CreatedAt)), secs(rel(r.StartedAt)),
			secs(rel(r.FinishedAt)), secs(r.FinishedAt.Sub(r.StartedAt)), r.State)
	}
	var groups []*stepGroup
	byKey := map[[2]string]*stepGroup{}
	for _, ev := range p.events {
		key := [2]string{ev.fsm, fmt.Sprint(ev.layer)}
		g := byKey[key]
		if g == nil {
			g = &stepGroup{fsm: ev.fsm, layer: ev.layer}
			byKey[key] = g
			groups = append(groups, g)
		}
		if n := len(g.steps); n == 0 || g.steps[n-1].state != ev.state {
			g.steps = append(g.steps, step{state: ev.state, from: ev.at})
		}
		g.steps[len(g.steps)-1].bytes = ev.bytes
		g.last = ev.at
	}
	fmt.Fprintf(&b, "\n| layer | machine | step | from | took | bytes |\n|---|---|---|---|---|---|\n")
	for _, g := range groups {
		end, ok := finished[[2]string{g.fsm, fmt.Sprint(g.layer)}]
		if f := finishedFSM[g.fsm]; !ok && len(f) == 1 {
			end, ok = f[0], true
		}
		if !ok || end < g.last {
			end = g.last
		}
		for i, s := range g.steps {
			to := end
			if i+1 < len(g.steps) {
				to = g.steps[i+1].from
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d |\n", layerName(g.layer), g.fsm, s.state, secs(s.from), secs(to-s.from), s.bytes)
		}
	}
	return b.String()
}

func layerName(n int) string {
	if n == 0 {
		return "image"
	}
	return fmt.Sprint(n)
}

func firstAt(ev []timedEvent) string {
	if len(ev) == 0 {
		return "-"
	}
	return secs(ev[0].at)
}

func lastAt(ev []timedEvent) string {
	if len(ev) == 0 {
		return "-"
	}
	return secs(ev[len(ev)-1].at)
}
