//go:build dm

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/inventory"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// gcPoolMB is the pool of TestGCKeepsPoolUnderThreshold: 1 GiB by default
// (the test's images are then about 200 MB each); `make test` runs it at a
// quarter of that (testdata/vm-test-args), every size scaled alike.
var gcPoolMB = flag.Int("flyio.gc-pool-mb", 1024, "TestGCKeepsPoolUnderThreshold's pool size in MiB (images scale with it)")

// gcPulls is how many images TestGCKeepsPoolUnderThreshold pulls one after
// the other: about three images fit in the pool, the two in use among
// them, so from the second pull on each one makes collection remove the
// one before it; `make test` runs fewer (testdata/vm-test-args).
var gcPulls = flag.Int("flyio.gc-pulls", 10, "TestGCKeepsPoolUnderThreshold's count of images pulled in turn (at least 4)")

// gcFileSize is the size of one bulk file of a test image; gcImageFiles of
// them make an image about 18.5% of the pool (190 MiB of 1 GiB).
const gcFileSize = 2 << 20

func gcImageFiles() int { return max(1, (*gcPoolMB*95+512)/1024) }

// gcScaleMB scales mb MiB of the 1 GiB test to the configured pool.
func gcScaleMB(mb int64) int64 { return mb * int64(*gcPoolMB) / 1024 }

// gcLayer is a one-layer image tarball of about 200 MB whose marker file
// makes it distinct (its own diff ID, chain and device); the bulk is body,
// random bytes shared by every image, which the pool stores again for each
// (a thin pool does not deduplicate).
func gcLayer(t *testing.T, name string, body []byte) []byte {
	t.Helper()
	return bulkLayer(t, name, body, gcImageFiles())
}

// bulkLayer is gcLayer with files copies of body.
func bulkLayer(t *testing.T, name string, body []byte, files int) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	put := func(h *tar.Header, data []byte) {
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc/", "usr/", "var/", name + "/"} {
		put(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}, nil)
	}
	put(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/os-release", Mode: 0o644, Size: 13}, []byte("ID=flyiotest\n"))
	put(&tar.Header{Typeflag: tar.TypeReg, Name: name + "/marker", Mode: 0o644, Size: int64(len(name))}, []byte(name))
	for i := 0; i < files; i++ {
		put(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%s/f%03d", name, i), Mode: 0o644, Size: int64(len(body))}, body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// scrapeGC reads the daemon's garbage-collection metrics: total seconds
// spent collecting and images removed, every trigger and cause summed.
func scrapeGC(t *testing.T, addr string) (seconds float64, removed int) {
	t.Helper()
	return scrapeSum(t, addr, "flyio_snapshotter_gc_duration_seconds_sum"),
		int(scrapeSum(t, addr, "flyio_snapshotter_gc_removed_images_total"))
}

// startContainerd starts a real containerd (integration/tools/build.sh's)
// with the daemon of c as its flyio proxy plugin, stopped when the test
// ends, and points c's [containerd] at it: the daemon registers its pulls
// there, in stack.Namespace.
func startContainerd(t *testing.T, c *plugin.Config) *stack.Containerd {
	t.Helper()
	repo, err := stack.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tools, err := stack.ToolsDir(repo)
	if err != nil {
		t.Fatal(err)
	}
	ctrd, err := stack.StartContainerd(context.Background(), tools, filepath.Join(t.TempDir(), "containerd"), c.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctrd.Stop() })
	c.Containerd.Address, c.Containerd.Namespace = ctrd.Socket, stack.Namespace
	return ctrd
}

// TestGCKeepsPoolUnderThreshold: on a 1 GiB pool with default [gc]
// settings, ten distinct images of about 200 MB pulled one after another
// all succeed; after each pull the pool is under the high threshold, the
// oldest unused images are gone (from `ls images`, the records and the
// pool), and a pinned image and an image with a container snapshot on it
// stay. `rm` refuses both with the reason. When the container then fills
// the pool, the next pull fails at once with the headroom error, leaving
// nothing behind and saying why in `ls images`.
func TestGCKeepsPoolUnderThreshold(t *testing.T) {
	if *gcPulls < 4 {
		t.Fatalf("-flyio.gc-pulls %d: the test needs at least 4 pulls for collection to have removed some", *gcPulls)
	}
	var ctrd *stack.Containerd
	e := newPullEnvTB(t, func(c *plugin.Config) {
		c.Pool.DataSize = plugin.Size(*gcPoolMB) << 20
		c.GC.Pinned = []string{"pinned"}
		c.Daemon.MetricsAddress = stack.AnyLoopbackPort
		ctrd = startContainerd(t, c)
	})
	ctx := context.Background()
	r := rand.New(rand.NewPCG(15, 15))
	body := make([]byte, gcFileSize)
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	usage := func() gc.Usage {
		t.Helper()
		st, err := e.pool.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return gc.UsageOf(st)
	}
	pull := func(name string) error {
		t.Helper()
		key := name + ".tar"
		e.srv.Put(t, key, gcLayer(t, name, body))
		_, err := e.pull(key, name)
		// The pulled tarball is on the daemon's disk now: free the fake
		// S3's copy (the VM's memory holds the pool and both).
		e.srv.Delete(t, key)
		return err
	}
	imageOf := func(name string) *gc.Image {
		t.Helper()
		db := e.db()
		id, err := pipeline.RecordsOf(db).ImageIDByName(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if id == "" {
			return nil
		}
		im, err := gc.ImageByID(ctx, db, id)
		if err != nil {
			t.Fatal(err)
		}
		return im
	}
	// ctrListed is what `ctr image ls` lists in the daemon's namespace.
	ctrListed := func() map[string]bool {
		t.Helper()
		out, err := ctrd.Ctr(ctx, "image", "ls", "-q")
		if err != nil {
			t.Fatalf("ctr image ls: %v: %s", err, out)
		}
		names := map[string]bool{}
		for _, n := range strings.Fields(out) {
			names[n] = true
		}
		return names
	}
	listed := func() map[string]inventory.Image {
		out := map[string]inventory.Image{}
		for _, im := range lsJSON[inventory.Image](t, "images", "--db", e.cfg.Metadata.Path, "--format", "json") {
			for _, n := range im.Names {
				out[n] = im
			}
		}
		return out
	}

	for _, name := range []string{"pinned", "container"} {
		if err := pull(name); err != nil {
			t.Fatalf("pull %s: %v", name, err)
		}
	}
	// The container's snapshot is made through containerd, as a
	// container's is, under a lease: containerd's collector removes from
	// its proxy plugins every snapshot its own records do not hold.
	lease, err := ctrd.Leased(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.End(ctx) })
	nctx := lease.Ctx
	sn := lease.Client.SnapshotService(e.cfg.Containerd.Snapshotter)
	held := imageOf("container")
	if held == nil {
		t.Fatal("image container not recorded after its pull")
	}
	mounts, err := sn.Prepare(nctx, "container-1", held.Chains[len(held.Chains)-1])
	if err != nil {
		t.Fatalf("prepare a container snapshot on the image: %v", err)
	}
	names := []string{}
	// keep checks that the images in use are recorded and that ls, what
	// `ls images` lists, and ctrLs, what `ctr image ls` lists, have them.
	keep := func(ls map[string]inventory.Image, ctrLs map[string]bool) {
		t.Helper()
		for _, name := range []string{"pinned", "container"} {
			if im := imageOf(name); im == nil {
				t.Fatalf("image %s (in use) was removed", name)
			}
			if _, ok := ls[name]; !ok {
				t.Fatalf("image %s (in use) is gone from ls images", name)
			}
			if !ctrLs[name] {
				t.Fatalf("image %s (in use) is gone from ctr image ls", name)
			}
		}
	}

	// agree checks that containerd and the pool agree: every name of
	// ctrLs, what `ctr image ls` lists in the daemon's namespace (the only
	// one the test uses), is unpacked in our snapshotter (its snapshots
	// are there), and no chain, activation or device is left that no kept
	// image holds.
	agree := func(when string, ctrLs map[string]bool) {
		t.Helper()
		for n := range ctrLs {
			img, err := lease.Client.GetImage(nctx, n)
			if err != nil {
				t.Fatalf("%s: ctr image ls lists %s, which containerd cannot get: %v", when, n, err)
			}
			if ok, err := img.IsUnpacked(nctx, e.cfg.Containerd.Snapshotter); err != nil || !ok {
				t.Errorf("%s: ctr image ls lists %s, whose snapshots are gone from the pool (unpacked %v, %v)", when, n, ok, err)
			}
		}
		db := e.db()
		chains, err := snapshotter.ReadRecords(db).Snapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{}
		for _, n := range append([]string{"pinned", "container"}, names...) {
			if im := imageOf(n); im != nil {
				want[pipeline.ActivationKey(im.ImageID)] = true
				for _, c := range im.Chains {
					want[c] = true
				}
			}
		}
		for _, s := range chains {
			// containerd names its snapshots in its proxy plugins
			// "<namespace>/<id>/<key>".
			if !want[s.Key] && !strings.HasSuffix(s.Key, "/container-1") {
				t.Errorf("%s: snapshot %s (%s) left, of no image kept", when, s.Key, s.Kind)
			}
		}
	}

	type row struct {
		name                string
		pull                time.Duration
		dataPct, metaPct    float64
		gcSeconds           float64
		removed, keptImages int
	}
	var rows []row
	lastSecs, lastRemoved := scrapeGC(t, e.d.metrics)
	for i := 1; i <= *gcPulls; i++ {
		name := fmt.Sprintf("img-%02d", i)
		names = append(names, name)
		start := time.Now()
		if err := pull(name); err != nil {
			t.Fatalf("pull %d (%s): %v", i, name, err)
		}
		took := time.Since(start)
		u := usage()
		secs, removed := scrapeGC(t, e.d.metrics)
		ls, inCtr := listed(), ctrListed()
		rows = append(rows, row{name: name, pull: took, dataPct: u.DataPercent(), metaPct: u.MetaPercent(),
			gcSeconds: secs - lastSecs, removed: removed - lastRemoved, keptImages: len(ls)})
		lastSecs, lastRemoved = secs, removed
		if u.DataPercent() >= gc.DefaultHighThreshold || u.MetaPercent() >= gc.DefaultHighThreshold {
			t.Errorf("after pull %d the pool is at %s: not under the %v%% threshold", i, u, gc.DefaultHighThreshold)
		}
		keep(ls, inCtr)
		// The images still there are the most recent ones: once one is
		// present, every later one is.
		present := false
		for _, n := range names {
			im := imageOf(n)
			_, inLs := ls[n]
			if present && im == nil {
				t.Errorf("after pull %d, %s is gone but an older image stayed", i, n)
			}
			if im != nil {
				present = true
			}
			if (im != nil) != inLs || inLs != inCtr[n] {
				t.Errorf("after pull %d, %s: recorded %v, listed by ls images %v, by ctr image ls %v", i, n, im != nil, inLs, inCtr[n])
			}
		}
		if imageOf(name) == nil {
			t.Fatalf("the image just pulled (%s) was removed", name)
		}
		e.checkClean()
		agree(fmt.Sprintf("after pull %d", i), inCtr)
	}
	t.Logf("pool usage after each pull (%d MiB pool, images of %d MiB, [gc] defaults: high %v%%, low %v%%):",
		*gcPoolMB, gcImageFiles()*gcFileSize>>20, gc.DefaultHighThreshold, gc.DefaultLowThreshold)
	t.Logf("%-8s %8s %7s %7s %8s %8s %7s", "image", "pull", "data%", "meta%", "gc", "removed", "images")
	gone := 0
	for _, r := range rows {
		t.Logf("%-8s %7.1fs %6.1f%% %6.1f%% %7.2fs %8d %7d", r.name, r.pull.Seconds(), r.dataPct, r.metaPct, r.gcSeconds, r.removed, r.keptImages)
		gone += r.removed
	}
	if gone < *gcPulls-3 {
		t.Errorf("only %d images were removed over %d pulls of %d MiB on a %d MiB pool", gone, *gcPulls, gcImageFiles()*gcFileSize>>20, *gcPoolMB)
	}
	agree("at the end", ctrListed())

	// rm refuses the images in use, with the reason.
	code, _, errOut := runCommand(t, nil, "rm", "--control-socket", e.cfg.Daemon.ControlSocket, "pinned", "container")
	if code != 1 || !strings.Contains(errOut, "pinned") || !strings.Contains(errOut, `/container-1" (a container's)`) {
		t.Errorf("rm pinned container = %d, %q", code, errOut)
	}
	keep(listed(), ctrListed())
	// rm removes the unused ones.
	var unused []string
	for _, n := range names {
		if imageOf(n) != nil {
			unused = append(unused, n)
		}
	}
	code, out, errOut := runCommand(t, nil, append([]string{"rm", "--control-socket", e.cfg.Daemon.ControlSocket, "--format", "json"}, unused...)...)
	var rmOut cli.RmOutput
	if err := json.Unmarshal([]byte(out), &rmOut); code != 0 || err != nil || len(rmOut.Removed) != len(unused) || rmOut.Error != "" {
		t.Fatalf("rm --format json %v = %d, %q, %q (%v); want every image in removed", unused, code, out, errOut, err)
	}
	for _, r := range rmOut.Removed {
		if r.ImageID == "" || !strings.HasPrefix(r.Source, "s3://") || r.Names == nil {
			t.Errorf("rm --format json: removed %+v; want its image id, source and names", r)
		}
	}
	inCtr := ctrListed()
	for _, n := range unused {
		if imageOf(n) != nil {
			t.Errorf("%s still recorded after rm", n)
		}
		if inCtr[n] {
			t.Errorf("%s still listed by ctr image ls after rm", n)
		}
	}
	e.checkClean()

	// The container fills the pool until a 200 MB layer cannot fit, even
	// with nothing left to collect.
	u := usage()
	fill := int64(u.DataFree()) - gcScaleMB(150)<<20
	if fill <= 0 {
		t.Fatalf("pool already too full to test headroom: %s", u)
	}
	dir := t.TempDir()
	if len(mounts) != 1 {
		t.Fatalf("container mounts %+v", mounts)
	}
	if out, err := exec.Command("mount", "-t", mounts[0].Type, "-o", strings.Join(mounts[0].Options, ","), mounts[0].Source, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount the container's snapshot: %v: %s", err, out)
	}
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(dir, "fill"), "bs=1M", fmt.Sprintf("count=%d", fill>>20), "conv=fsync").CombinedOutput(); err != nil {
		t.Fatalf("fill the container: %v: %s", err, out)
	}
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v: %s", err, out)
	}
	before := usage()
	err = pull("img-refused")
	if err == nil || !strings.Contains(err.Error(), "no room in the pool") || !strings.Contains(err.Error(), "free after garbage collection") ||
		!strings.Contains(err.Error(), "layer 1 (img-refused.tar") {
		t.Fatalf("pull on a pool the container filled: %v, want the headroom error with the free space and the layer", err)
	}
	t.Logf("pool at %s; the pull was refused: %v", before, err)
	keep(listed(), ctrListed())
	// A pull that failed recorded no name: ls images lists it by source.
	var failed *inventory.Image
	for _, im := range lsJSON[inventory.Image](t, "images", "--db", e.cfg.Metadata.Path, "--format", "json") {
		if im.S3Key == pipeline.S3URL(e.srv.Bucket, "img-refused.tar") {
			failed = &im
		}
	}
	if failed == nil || !strings.Contains(failed.FailureReason, "no room in the pool") || failed.State != inventory.ImageStateFailed {
		t.Errorf("ls images shows img-refused as %+v, want it failed with the headroom error", failed)
	}
	if im := imageOf("img-refused"); im != nil && len(im.Chains) != 0 {
		t.Errorf("the refused pull left chains: %v", im.Chains)
	}
	if n := e.srv.Requests("GET", "img-refused.tar"); n != 0 {
		t.Errorf("the refused pull downloaded the layer (%d GETs)", n)
	}
	e.checkClean()
}
