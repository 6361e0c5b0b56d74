//go:build dm

package containerdtest

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	tarchive "github.com/containerd/containerd/v2/core/transfer/archive"
	timage "github.com/containerd/containerd/v2/core/transfer/image"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/platforms"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/containerd/ociimage"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

// importImage imports the OCI archive at path the way `ctr image import
// --snapshotter sn` does: through containerd's transfer service, named by
// the archive's image name annotation (which must be under imageRepo),
// unpacked for linux/amd64 into snapshotter sn.
func importImage(ctx context.Context, c *client.Client, path, sn string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("import %s: %w", path, err)
	}
	defer f.Close()
	p := platforms.MustParse("linux/amd64")
	src := tarchive.NewImageImportStream(f, "")
	dst := timage.NewStore("",
		timage.WithNamedPrefix(imageRepo, false),
		timage.WithPlatforms(p),
		timage.WithUnpack(p, sn))
	if err := c.Transfer(ctx, src, dst); err != nil {
		return fmt.Errorf("import %s with snapshotter %s: %w", path, sn, err)
	}
	return nil
}

// writeArchive writes the test image under name into the scratch folder.
func writeArchive(t testing.TB, e *env, name string) string {
	t.Helper()
	var buf bytes.Buffer
	if _, err := ociimage.Write(&buf, ociimage.Options{Name: name, PayloadBytes: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(e.scratch, strings.NewReplacer("/", "_", ":", "_").Replace(name)+".tar")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// removeImage deletes the image and lets containerd's garbage collector
// run synchronously, as `ctr image rm --sync` does.
func removeImage(ctx context.Context, c *client.Client, name string) error {
	if err := c.ImageService().Delete(ctx, name, images.SynchronousDelete()); err != nil {
		return fmt.Errorf("delete image %s: %w", name, err)
	}
	return nil
}

// snapshotKeys lists the snapshots containerd's snapshots service shows
// for sn in our namespace.
func snapshotKeys(ctx context.Context, c *client.Client, sn string) ([]string, error) {
	var keys []string
	err := c.SnapshotService(sn).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		keys = append(keys, info.Name)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk snapshotter %s: %w", sn, err)
	}
	sort.Strings(keys)
	return keys, nil
}

// waitNoSnapshots polls until sn shows no snapshot (garbage collection
// removes them from the snapshotter after the metadata).
func waitNoSnapshots(ctx context.Context, c *client.Client, sn string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		keys, err := snapshotKeys(ctx, c, sn)
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("snapshotter %s still has %d snapshots %v %s after the image was removed", sn, len(keys), keys, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The container's script: a line on stdout, a file in its writable layer,
// and what it sees of the image's second layer.
const (
	writtenPath = "/root/written-by-container"
	script      = `echo "hello from $SNAPSHOTTER"; ` +
		`echo "container wrote this on $SNAPSHOTTER" > ` + writtenPath + ` && sync; ` +
		`cat ` + ociimage.MarkerPath + `; ` +
		`if test -e ` + ociimage.WhiteoutVictim + `; then echo whiteout-ignored; else echo whiteout-honoured; fi`
)

// TestContainerdRun is the end-to-end check with real containerd:
// import the test image with the snapshotter, run a container from it that
// prints and writes a file, check both, remove the container and the image,
// and after garbage collection nothing of the image is left in the
// snapshotter (for ours: no thin device other than the pool's base).
func TestContainerdRun(t *testing.T) {
	e := getEnv(t)
	t.Logf("environment ready in %s (containerd %s)", e.setupTime.Round(time.Millisecond), filepath.Base(e.tools))
	for _, sn := range snapshotters() {
		t.Run(sn, func(t *testing.T) { testRun(t, e, sn) })
	}
}

func testRun(t *testing.T, e *env, sn string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := e.client
	name := imageRepo + ":run-" + sn
	archive := writeArchive(t, e, name)

	start := time.Now()
	if err := importImage(ctx, c, archive, sn); err != nil {
		t.Fatalf("%v\ncontainerd log tail:\n%s", err, e.ctrd.LogTail(30))
	}
	t.Logf("import with %s: %s", sn, time.Since(start).Round(time.Millisecond))
	img, err := c.GetImage(ctx, name)
	if err != nil {
		t.Fatalf("imported image %s not found: %v", name, err)
	}
	if ok, err := img.IsUnpacked(ctx, sn); err != nil || !ok {
		t.Fatalf("image %s not unpacked into %s after import (unpacked=%v, err=%v)", name, sn, ok, err)
	}
	keys, err := snapshotKeys(ctx, c, sn)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(e.image.ChainIDs) {
		t.Errorf("snapshotter %s holds %v after import, want the %d layer snapshots", sn, keys, len(e.image.ChainIDs))
	}

	id := "run-" + sn
	ctr, err := c.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithSnapshotter(sn),
		client.WithNewSnapshot(id, img),
		client.WithNewSpec(oci.WithImageConfig(img),
			oci.WithEnv([]string{"SNAPSHOTTER=" + sn}),
			oci.WithProcessArgs("/bin/sh", "-c", script)))
	if err != nil {
		t.Fatalf("create container on %s: %v", sn, err)
	}
	containerGone := false
	defer func() {
		if !containerGone {
			_ = ctr.Delete(context.Background(), client.WithSnapshotCleanup)
		}
	}()

	var stdout, stderr stack.LockedBuffer
	fifos := filepath.Join(e.scratch, "fifo")
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr), cio.WithFIFODir(fifos)))
	if err != nil {
		t.Fatalf("create task on %s: %v\ncontainerd log tail:\n%s", sn, err, e.ctrd.LogTail(30))
	}
	exitC, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	runStart := time.Now()
	if err := task.Start(ctx); err != nil {
		_, _ = task.Delete(ctx)
		t.Fatalf("start task on %s: %v\ncontainerd log tail:\n%s", sn, err, e.ctrd.LogTail(30))
	}
	var code uint32
	select {
	case st := <-exitC:
		code, _, err = st.Result()
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("container on %s did not exit: %v", sn, ctx.Err())
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatalf("delete task: %v", err)
	}
	t.Logf("container on %s ran in %s, exit %d", sn, time.Since(runStart).Round(time.Millisecond), code)
	want := fmt.Sprintf("hello from %s\n%swhiteout-honoured\n", sn, ociimage.MarkerContent)
	if code != 0 || stdout.String() != want {
		t.Fatalf("container on %s: exit %d, stdout %q, stderr %q; want exit 0 and stdout %q", sn, code, stdout.String(), stderr.String(), want)
	}

	// The file the container wrote is in its snapshot: mount it and read.
	mounts, err := c.SnapshotService(sn).Mounts(ctx, id)
	if err != nil {
		t.Fatalf("mounts of container snapshot %s on %s: %v", id, sn, err)
	}
	got, err := readFromMounts(mounts, filepath.Join(e.scratch, "check-"+sn), writtenPath)
	if err != nil {
		t.Fatal(err)
	}
	if wantFile := "container wrote this on " + sn + "\n"; got != wantFile {
		t.Errorf("%s in the container's snapshot on %s is %q, want %q", writtenPath, sn, got, wantFile)
	}

	var devicesBefore []uint32
	if sn == "flyio" {
		devicesBefore, err = e.ours.thinIDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		t.Fatalf("delete container: %v", err)
	}
	containerGone = true
	if err := removeImage(ctx, c, name); err != nil {
		t.Fatal(err)
	}
	if err := waitNoSnapshots(ctx, c, sn, time.Minute); err != nil {
		t.Fatal(err)
	}
	if sn == "flyio" {
		after, err := e.ours.waitThinIDs(ctx, 1, time.Minute)
		if err != nil {
			t.Fatalf("%v\n%s", err, e.diagnostics())
		}
		t.Logf("our pool's thin devices: %v with the image and container, %v after removal and GC", devicesBefore, after)
		if len(devicesBefore) < len(e.image.ChainIDs)+1 {
			t.Errorf("our pool had only thin devices %v with %d layers and a container on it", devicesBefore, len(e.image.ChainIDs))
		}
	}
}

// diagnostics returns the tails of the daemons' logs and our pool listing.
func (e *env) diagnostics() string {
	var b strings.Builder
	fmt.Fprintf(&b, "---- containerd log tail:\n%s\n", e.ctrd.LogTail(60))
	if e.ours != nil {
		fmt.Fprintf(&b, "---- our daemon log tail:\n%s\n", e.ours.p.LogTail(60))
		out, err := stack.Run(context.Background(), nil, e.ours.bin, "pool", "ls", "--config", e.ours.config)
		fmt.Fprintf(&b, "---- pool ls (err=%v):\n%s\n", err, out)
	}
	return b.String()
}

// readFromMounts mounts mounts read-only at dir, reads file, unmounts.
func readFromMounts(mounts []mount.Mount, dir, file string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	ro := make([]mount.Mount, len(mounts))
	for i, m := range mounts {
		m.Options = append(append([]string(nil), m.Options...), "ro")
		ro[i] = m
	}
	if err := mount.All(ro, dir); err != nil {
		return "", fmt.Errorf("mount %+v at %s: %w", ro, dir, err)
	}
	b, rerr := os.ReadFile(filepath.Join(dir, file))
	if err := mount.UnmountAll(dir, 0); err != nil {
		return "", fmt.Errorf("unmount %s: %w", dir, err)
	}
	if rerr != nil {
		return "", fmt.Errorf("read %s from the snapshot: %w", file, rerr)
	}
	return string(b), nil
}

// importRounds is how many times BenchmarkImport imports the image with
// each snapshotter; `make test` runs 3 (testdata/vm-bench-args).
var importRounds = flag.Int("flyio.import-rounds", 5, "BenchmarkImport's rounds: imports of the image with each snapshotter")

// BenchmarkImport is the import benchmark: the same image imported
// (content ingest + unpack) with our snapshotter and with containerd's
// built-in devmapper snapshotter on the same pool settings, alternating,
// the image removed and garbage collected after each import. It reports
// the median import time of each and their ratio. At least
// -flyio.import-rounds rounds run, whatever b.N is.
func BenchmarkImport(b *testing.B) {
	e := getEnv(b)
	ctx := context.Background()
	if *importRounds < 1 {
		b.Fatalf("-flyio.import-rounds %d: want a positive count", *importRounds)
	}
	rounds := max(*importRounds, b.N)
	sns := snapshotters()
	archives := map[string]string{}
	for _, sn := range sns {
		archives[sn] = writeArchive(b, e, imageRepo+":bench-"+sn)
	}
	samples := map[string][]time.Duration{}
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		for i := range sns {
			// Alternate which snapshotter goes first.
			sn := sns[(i+r)%len(sns)]
			name := imageRepo + ":bench-" + sn
			start := time.Now()
			if err := importImage(ctx, e.client, archives[sn], sn); err != nil {
				b.Fatalf("round %d: %v\ncontainerd log tail:\n%s", r, err, e.ctrd.LogTail(30))
			}
			samples[sn] = append(samples[sn], time.Since(start))
			if err := removeImage(ctx, e.client, name); err != nil {
				b.Fatal(err)
			}
			if err := waitNoSnapshots(ctx, e.client, sn, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	med := map[string]time.Duration{}
	for sn, s := range samples {
		med[sn] = median(s)
	}
	var tb strings.Builder
	fmt.Fprintf(&tb, "image import (8 MiB payload, 2 layers), median of %d, same VM run:\n", rounds)
	fmt.Fprintf(&tb, "| snapshotter | median | min | max | ratio to devmapper |\n|---|---|---|---|---|\n")
	for _, sn := range sns {
		ratio := "-"
		if d, ok := med["devmapper"]; ok && d > 0 {
			ratio = fmt.Sprintf("%.2f", float64(med[sn])/float64(d))
		}
		lo, hi := minMax(samples[sn])
		fmt.Fprintf(&tb, "| %s | %s | %s | %s | %s |\n", sn, med[sn].Round(time.Millisecond), lo.Round(time.Millisecond), hi.Round(time.Millisecond), ratio)
	}
	fmt.Print(tb.String())
	for _, sn := range sns {
		b.ReportMetric(float64(med[sn].Milliseconds()), "ms-median-"+sn)
	}
	if d, ok := med["devmapper"]; ok && d > 0 && med["flyio"] > 0 {
		b.ReportMetric(float64(med["flyio"])/float64(d), "flyio/devmapper")
	}
}

func median(s []time.Duration) time.Duration {
	c := append([]time.Duration(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	if len(c) == 0 {
		return 0
	}
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

func minMax(s []time.Duration) (time.Duration, time.Duration) {
	if len(s) == 0 {
		return 0, 0
	}
	lo, hi := s[0], s[0]
	for _, d := range s {
		lo, hi = min(lo, d), max(hi, d)
	}
	return lo, hi
}
