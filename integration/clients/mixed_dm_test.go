//go:build dm

package clients

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	"github.com/opencontainers/image-spec/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/containerd/ociimage"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

// mixedPoolMB is TestMixedPool's pool: 1 GiB by default, with images of
// about 150 MB, as garbage collection's acceptance asks. `make test` runs
// it at a quarter of that (testdata/vm-test-args), images scaled alike;
// the full size, by hand:
//
//	go test -c -tags 'dm sqlite_omit_load_extension osusergo netgo' -o /tmp/clients.test ./integration/clients
//	integration/vm/run.sh --mem 6144 --timeout 3600 -- /tmp/clients.test -test.v -test.run TestMixedPool -test.timeout 50m -flyio.mixed-pool-mb 1024
var mixedPoolMB = flag.Int("flyio.mixed-pool-mb", 1024, "TestMixedPool's pool size in MiB (its images are about 150 MB per GiB)")

// mixedRounds is how many times TestMixedPool pulls one image of each kind
// (ctr, nerdctl, S3): 12 images in all at the full size. `make test` runs
// 2 rounds (testdata/vm-test-args): 6 images still overfill its pool, and
// the test checks that collection removed some.
var mixedRounds = flag.Int("flyio.mixed-rounds", 4, "TestMixedPool's rounds: one image of each kind (ctr, nerdctl, S3) per round")

// mixedImageBytes is the payload of one TestMixedPool image: 150 MB per
// GiB of pool.
func mixedImageBytes() int64 { return int64(*mixedPoolMB) * 150_000_000 / 1024 }

// Namespaces of TestMixedPool, one per client.
const (
	mixedCtrNS     = "flyio-mixed-ctr"
	mixedNerdctlNS = "flyio-mixed-nerdctl"
	mixedS3NS      = "flyio-mixed-s3"
)

// mixedS3Layer is the top layer of a TestMixedPool S3 image: the folders
// the daemon's layout check wants, /etc/flyio-mixed naming the image, and
// size bytes of its own random content (a thin pool does not deduplicate,
// so each image takes its size).
func mixedS3Layer(name string, size int64) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mod := time.Unix(1700000000, 0)
	for _, d := range []string{"etc/", "usr/", "var/", "opt/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mod}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/flyio-mixed", Mode: 0o644, Size: int64(len(name)), ModTime: mod}); err != nil {
		return nil, err
	}
	if _, err := tw.Write([]byte(name)); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "opt/bulk", Mode: 0o644, Size: size, ModTime: mod}); err != nil {
		return nil, err
	}
	var seed [32]byte
	copy(seed[:], name)
	rng := rand.NewChaCha8(seed)
	block := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(block)) {
		rng.Read(block)
		if _, err := tw.Write(block[:min(left, int64(len(block)))]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// poolData is our pool's data usage in percent, from its device-mapper
// status line ("0 LEN thin-pool TRANS META_USED/TOTAL DATA_USED/TOTAL ...").
func poolData(ctx context.Context) (float64, error) {
	out, err := stack.Run(ctx, os.Environ(), "dmsetup", "status", pool)
	if err != nil {
		return 0, fmt.Errorf("dmsetup status %s: %w: %s", pool, err, out)
	}
	f := strings.Fields(out)
	if len(f) < 6 || f[2] != "thin-pool" {
		return 0, fmt.Errorf("dmsetup status %s: not a thin-pool status line: %q", pool, out)
	}
	used, total, ok := strings.Cut(f[5], "/")
	u, err1 := strconv.ParseFloat(used, 64)
	tot, err2 := strconv.ParseFloat(total, 64)
	if !ok || err1 != nil || err2 != nil || tot == 0 {
		return 0, fmt.Errorf("dmsetup status %s: data usage %q", pool, f[5])
	}
	return 100 * u / tot, nil
}

// collectionBegun is one collection the daemon's log says began removing
// images: when, and what set it off.
type collectionBegun struct {
	at      time.Time
	trigger string
}

// collectionsBegun returns the collections the daemon's log (text format)
// at path says began removing images between from and to, whatever set
// them off: while containerd writes a layer, the apply watch, the pool's
// low-water event and containerd's commit each may start the one that
// makes room for it, and the first to take the collector runs it.
func collectionsBegun(path string, from, to time.Time) ([]collectionBegun, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the daemon's log: %w", err)
	}
	var began []collectionBegun
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `msg="gc: pool usage past the high threshold`) {
			continue
		}
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("the daemon's log %s: a line without its time: %q", path, line)
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			return nil, fmt.Errorf("the daemon's log %s: %w", path, err)
		}
		if at.Before(from) || !at.Before(to) {
			continue
		}
		began = append(began, collectionBegun{at: at, trigger: logTrigger(line)})
	}
	return began, nil
}

// logTrigger is the trigger field of a collector's line of the daemon's
// text log, or "" when it has none.
func logTrigger(line string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "trigger="); ok {
			return v
		}
	}
	return ""
}

// logTime is the time of a line of the daemon's text log.
var logTime = regexp.MustCompile(`^time="([^"]+)"`)

// TestMixedPool: a small pool (1 GiB by default, a quarter in `make
// test`) fed, one after another, registry images pulled with `ctr pull
// --snapshotter flyio`, registry images pulled with nerdctl, and S3
// images, each about 150 MB per GiB of pool, 12 in all, each client in its
// own namespace; a container runs on the first image throughout. Right
// after each S3 pull returns, the pool's data usage is under the high
// threshold: the pull collected itself. Right after each registry pull
// returns, it is under the threshold, or the collection that brings it
// under began while containerd applied the layers (the daemon's log says
// when). Once any collection the pull woke is done: usage is under it;
// the container's image is still listed; every name `ctr image ls` and
// `nerdctl images` list in each namespace is unpacked in the pool, and
// every chain snapshot in the pool is held by an image listed. At the
// end, the newest image of each kind runs.
func TestMixedPool(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	e := setupPool(t, ctx, fmt.Sprintf("%dMiB", *mixedPoolMB))
	size := mixedImageBytes()
	host := platforms.DefaultSpec()

	// The busybox layer every image here starts with: the registry images'
	// own first layer, and the S3 images' first layer byte for byte.
	var base []byte
	{
		var buf bytes.Buffer
		if _, err := ociimage.Write(&buf, ociimage.Options{Name: e.imageRef, PayloadBytes: 1 << 20, Platform: host}); err != nil {
			t.Fatal(err)
		}
		layers, err := plainLayers(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		base = layers[0]
	}

	conn, err := grpc.NewClient("unix://"+e.daemon.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ours := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "flyio")

	// listed is what each client lists in its namespace.
	listed := func() (map[string][]string, error) {
		out := map[string][]string{}
		for _, ns := range []string{mixedCtrNS, mixedS3NS} {
			o, err := e.ctr(ctx, ns, "image", "ls", "-q")
			if err != nil {
				return nil, fmt.Errorf("ctr image ls in %s: %w: %s", ns, err, o)
			}
			out[ns] = strings.Fields(o)
		}
		o, err := stack.RunStdout(ctx, e.ctrdEnv, e.nerdctlArgv(mixedNerdctlNS, "images", "--format", "{{.Repository}}:{{.Tag}}")...)
		if err != nil {
			return nil, fmt.Errorf("nerdctl images: %w: %s", err, o)
		}
		out[mixedNerdctlNS] = strings.Fields(o)
		return out, nil
	}
	// disagree lists where the clients and the pool disagree: a name
	// listed whose snapshots are not unpacked in flyio, or a committed
	// snapshot in our pool that is a chain of no image listed.
	disagree := func(names map[string][]string) []string {
		t.Helper()
		var bad []string
		held := map[string]bool{}
		for ns, list := range names {
			nctx := namespaces.WithNamespace(ctx, ns)
			for _, n := range list {
				if err := e.unpackedInFlyio(ctx, ns, n); err != nil {
					bad = append(bad, fmt.Sprintf("listed in %s, but its snapshots are gone: %v", ns, err))
					continue
				}
				img, err := e.client.GetImage(nctx, n)
				if err != nil {
					bad = append(bad, fmt.Sprintf("listed in %s, but containerd cannot get %s: %v", ns, n, err))
					continue
				}
				diffIDs, err := img.RootFS(nctx)
				if err != nil {
					bad = append(bad, fmt.Sprintf("image %s in %s: %v", n, ns, err))
					continue
				}
				for _, c := range identity.ChainIDs(diffIDs) {
					held[c.String()] = true
				}
			}
		}
		err := ours.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if info.Kind != snapshots.KindCommitted {
				return nil // the running container's
			}
			chain := info.Labels[snapshots.LabelSnapshotRef]
			if chain == "" {
				chain = info.Name
			}
			if !held[chain] {
				bad = append(bad, fmt.Sprintf("snapshot %s (chain %s) is left in the pool, held by no image listed", info.Name, chain))
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walk our snapshots: %v", err)
		}
		return bad
	}
	// agree lists the images and checks that the clients and the pool
	// agree, asking again a few times first: a collection still going on
	// (under the high threshold, on its way to the low one) may remove an
	// image between the listing and the walk.
	agree := func(when string) map[string][]string {
		t.Helper()
		for try := 1; ; try++ {
			names, err := listed()
			if err != nil {
				t.Fatal(err)
			}
			bad := disagree(names)
			if len(bad) == 0 {
				return names
			}
			if try == 5 {
				t.Errorf("%s: the clients' lists and the pool disagree:\n%s", when, strings.Join(bad, "\n"))
				return names
			}
			time.Sleep(time.Second)
		}
	}
	// settle waits for the collection a pull set off, and returns the
	// pool's data usage then and how long it took to get under the high
	// threshold.
	settle := func(when string) (float64, time.Duration) {
		t.Helper()
		start := time.Now()
		for {
			pct, err := poolData(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if pct < gc.DefaultHighThreshold {
				return pct, time.Since(start)
			}
			if time.Since(start) > time.Minute {
				t.Fatalf("%s: the pool is at %.1f%%, past the %v%% high threshold, a minute after the pull", when, pct, gc.DefaultHighThreshold)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	type row struct {
		name, kind       string
		pull, settled    time.Duration
		after, collected float64
		images           int
	}
	var (
		rows               []row
		newest             = map[string]string{}
		containerImage, id = "", "mixed-running"
	)
	scratch := filepath.Join(e.scratch, "mixed")
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	pushRegistry := func(repo string) string {
		t.Helper()
		ref := e.reg.Host + "/" + repo + ":v1"
		var buf bytes.Buffer
		// A payload of its own seed makes each image's second layer, so
		// its chain and device, its own.
		e.timed(t, "build a registry image", func() error {
			_, err := ociimage.Write(&buf, ociimage.Options{Name: ref, PayloadBytes: size, PayloadSeed: repo, Platform: host})
			return err
		})
		e.timed(t, "push it", func() error {
			_, err := e.reg.PushOCIArchive(ctx, buf.Bytes(), repo, "v1")
			return err
		})
		return ref
	}
	for round := 1; round <= *mixedRounds; round++ {
		for _, kind := range []string{"ctr", "nerdctl", "s3"} {
			name := fmt.Sprintf("mixed-%s-%d", kind, round)
			var ref, ns string
			var pull func() error
			switch kind {
			case "ctr":
				ns, ref = mixedCtrNS, pushRegistry("flyio-it/"+name)
				pull = func() error { return e.ctrPull(ctx, ns, ref) }
			case "nerdctl":
				ns, ref = mixedNerdctlNS, pushRegistry("flyio-it/"+name)
				pull = func() error {
					out, err := e.nerdctlRun(ctx, ns, "pull", "--insecure-registry", ref)
					if err != nil {
						return fmt.Errorf("%w: %s", err, lastLines(out, 5))
					}
					return nil
				}
			case "s3":
				img := s3Image{prefix: name, suffix: ".tar"}
				ns, ref = mixedS3NS, img.defaultRef()
				var top []byte
				e.timed(t, "build an S3 image", func() (err error) {
					top, err = mixedS3Layer(name, size)
					return err
				})
				for i, l := range [][]byte{base, top} {
					f := filepath.Join(scratch, fmt.Sprintf("%d.tar", i+1))
					if err := os.WriteFile(f, l, 0o644); err != nil {
						t.Fatal(err)
					}
					if _, err := e.s3.Upload(ctx, fmt.Sprintf("images/%s/%d.tar", name, i+1), f); err != nil {
						t.Fatal(err)
					}
					os.Remove(f)
				}
				pull = func() error {
					_, err := e.pullS3(ctx, img.source(), "--namespace", ns)
					return err
				}
			}
			start := time.Now()
			if err := pull(); err != nil {
				t.Fatalf("pull %s (%s) into %s: %v", ref, kind, ns, err)
			}
			returned := time.Now()
			took := returned.Sub(start)
			after, err := poolData(ctx)
			if err != nil {
				t.Fatal(err)
			}
			when := "after pulling " + name
			switch {
			case after < gc.DefaultHighThreshold:
			case kind == "s3":
				// An S3 pull makes room before it makes a device.
				t.Errorf("%s: the pool is at %.1f%% right after the S3 pull returned, past the %v%% high threshold", when, after, gc.DefaultHighThreshold)
			default:
				// containerd commits a layer it applied under its
				// database's lock, which a removal needs too: the
				// collection made room while containerd wrote the layer
				// must have begun before the pull returned, and may end
				// just after it (settle bounds it).
				began, err := collectionsBegun(e.daemon.Proc.LogPath, start, returned)
				switch {
				case err != nil:
					t.Fatal(err)
				case len(began) == 0:
					t.Errorf("%s: the pool is at %.1f%% right after the pull returned, past the %v%% high threshold, and no collection began while containerd wrote the layer", when, after, gc.DefaultHighThreshold)
				default:
					t.Logf("%s: the pool is at %.1f%% right after the pull returned; the collection for it (trigger %s) began %s before", when, after, began[0].trigger, returned.Sub(began[0].at).Round(10*time.Millisecond))
				}
			}
			collected, settled := settle(when)
			newest[kind] = ref
			if containerImage == "" {
				// A container runs on the first image, to the end.
				containerImage = ref
				out, err := e.ctr(ctx, ns, "run", "-d", "--null-io", "--snapshotter", "flyio", ref, id, "/bin/sleep", "3600")
				if err != nil {
					t.Fatalf("ctr run -d on %s: %v: %s", ref, err, out)
				}
				t.Cleanup(func() {
					if out, err := e.ctr(context.Background(), mixedCtrNS, "task", "rm", "-f", id); err != nil {
						t.Logf("ctr task rm -f %s: %v: %s", id, err, out)
					}
					if out, err := e.ctr(context.Background(), mixedCtrNS, "container", "rm", id); err != nil {
						t.Logf("ctr container rm %s: %v: %s", id, err, out)
					}
				})
			}
			var names map[string][]string
			e.timed(t, "list the images and check them against the pool", func() error {
				names = agree(when)
				return nil
			})
			if !slices.Contains(names[mixedCtrNS], containerImage) {
				t.Errorf("%s: the running container's image %s is gone from ctr image ls (%v)", when, containerImage, names[mixedCtrNS])
			}
			if !slices.Contains(names[ns], ref) {
				t.Errorf("%s: the image just pulled is not listed in %s (%v)", when, ns, names[ns])
			}
			n := 0
			for _, l := range names {
				n += len(l)
			}
			rows = append(rows, row{name: name, kind: kind, pull: took, settled: settled, after: after, collected: collected, images: n})
		}
	}

	// The pool could not hold every image: collection must have removed some.
	if last := rows[len(rows)-1]; last.images >= len(rows) {
		t.Errorf("%d images pulled and %d still listed: no image was collected, so the pool was never filled (size the images up)", len(rows), last.images)
	}

	// The newest image of each kind runs.
	runs := map[string][]string{
		"ctr":     e.ctrArgv(mixedCtrNS, "run", "--rm", "--snapshotter", "flyio", newest["ctr"], "mixed-last-ctr", "/bin/cat", ociimage.MarkerPath),
		"nerdctl": e.nerdctlArgv(mixedNerdctlNS, "run", "--rm", "--net", "none", newest["nerdctl"], "/bin/cat", ociimage.MarkerPath),
		"s3":      e.ctrArgv(mixedS3NS, "run", "--rm", "--snapshotter", "flyio", newest["s3"], "mixed-last-s3", "/bin/cat", "/etc/flyio-mixed"),
	}
	for _, kind := range []string{"ctr", "nerdctl", "s3"} {
		start := time.Now()
		out, err := e.containerOutput(ctx, runs[kind])
		e.timings = append(e.timings, timing{"run the newest image of a kind", time.Since(start)})
		want := ociimage.MarkerContent
		if kind == "s3" {
			want = fmt.Sprintf("mixed-s3-%d", *mixedRounds)
		}
		if err != nil || out != want {
			t.Errorf("the newest %s image %s: run printed %q, %v; want %q", kind, newest[kind], out, err, want)
		}
	}
	if out, err := e.ctr(ctx, mixedCtrNS, "task", "ls"); err != nil || !strings.Contains(out, id) || !strings.Contains(out, "RUNNING") {
		t.Errorf("the container on the first image is not running at the end: %v: %s", err, out)
	}

	// What set off the daemon's collections (its log), to tell the
	// collections made while containerd applied a layer (apply) from
	// those after its commits (commit) and the S3 pulls' own.
	if b, err := os.ReadFile(e.daemon.Proc.LogPath); err != nil {
		t.Logf("the daemon's log: %v", err)
	} else {
		triggers := map[string]int{}
		for _, line := range strings.Split(string(b), "\n") {
			if tr := logTrigger(line); tr != "" && strings.Contains(line, "gc: collection done") {
				triggers[tr]++
			}
		}
		t.Logf("collections by trigger: %v", triggers)
	}
	t.Logf("%d MiB pool, images of %d MB, [gc] defaults (high %v%%, low %v%%); data usage right after each pull, then once collected:",
		*mixedPoolMB, size/1_000_000, gc.DefaultHighThreshold, gc.DefaultLowThreshold)
	t.Logf("| image | client | pull | data after pull | collected to | waited | images listed |")
	for _, r := range rows {
		t.Logf("| %s | %s | %.1fs | %.1f%% | %.1f%% | %.1fs | %d |", r.name, r.kind, r.pull.Seconds(), r.after, r.collected, r.settled.Seconds(), r.images)
	}
	sums, counts := map[string]time.Duration{}, map[string]int{}
	var order []string
	for _, tm := range e.timings {
		if counts[tm.what] == 0 {
			order = append(order, tm.what)
		}
		sums[tm.what] += tm.took
		counts[tm.what]++
	}
	t.Logf("wall times (TCG VM), summed:")
	for _, w := range order {
		t.Logf("| %s | %d× | %s |", w, counts[w], sums[w].Round(100*time.Millisecond))
	}
}
