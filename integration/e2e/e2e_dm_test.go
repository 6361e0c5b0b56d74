//go:build dm

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"

	vmscratch "github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
)

// chainRow is what this test reads of `ls chains --format json`.
type chainRow struct {
	ChainID  string `json:"chain_id"`
	DeviceID uint32 `json:"device_id"`
}

// inputs returns the image folder and the versitygw binary that
// integration/e2e/prepare.sh made on the host (the VM has no network) and
// recorded in .cache/e2e/inputs (lines "images=DIR" and "versitygw=BIN").
func inputs(t *testing.T, repo string) (images, vgw string) {
	t.Helper()
	path := filepath.Join(repo, ".cache/e2e/inputs")
	in, err := stack.ReadInputs(path, "integration/e2e/prepare.sh")
	if err != nil {
		t.Fatalf("the end-to-end inputs are not prepared: %v", err)
	}
	images, vgw = in["images"], in["versitygw"]
	for what, p := range map[string]string{"images": images, "versitygw": vgw} {
		if _, err := os.Stat(p); p == "" || err != nil {
			t.Fatalf("%s: %s=%q is missing (run integration/e2e/prepare.sh on the host again): %v", path, what, p, err)
		}
	}
	return images, vgw
}

// layerDigests maps each family to the SHA-256 of its layer tarballs, in
// key order, as mkimage.sh recorded them in SHA256SUMS (hashing 700 MiB
// again under emulation would take minutes).
func layerDigests(t *testing.T, images string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(images, "SHA256SUMS"))
	if err != nil {
		t.Fatalf("layer digests: %v", err)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line) // DIGEST images/FAMILY/N.tar, sorted
		if len(f) != 2 {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		parts := strings.Split(f[1], "/")
		if len(parts) != 3 {
			t.Fatalf("SHA256SUMS name %q is not images/FAMILY/N.tar", f[1])
		}
		m[parts[1]] = append(m[parts[1]], f[0])
	}
	for _, f := range stack.Families {
		if len(m[f]) == 0 {
			t.Fatalf("no layers of family %s in %s/SHA256SUMS", f, images)
		}
	}
	return m
}

// TestEndToEnd is the README's demo, checked: every family pulled from a
// SigV4 S3 server through its public-read policy, identical layers stored
// once, containers run with `ctr run --snapshotter flyio` seeing the
// whiteouts of their top layers, and after the images are removed and
// containerd's garbage collection ran, no device or row of ours left.
func TestEndToEnd(t *testing.T) {
	scratch, err := vmscratch.Root()
	if err != nil {
		t.Fatal(err)
	}
	repo, err := stack.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	images, vgw := inputs(t, repo)
	digests := layerDigests(t, images)
	if digests["debian"][0] != digests["debian-dev"][0] || digests["debian"][1] != digests["debian-dev"][1] {
		t.Fatalf("debian and debian-dev must share layers 1 and 2 byte for byte: %v", digests)
	}
	distinct := map[string]bool{}
	for _, ds := range digests {
		for _, d := range ds {
			distinct[d] = true
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 38*time.Minute)
	defer cancel()
	const pool = "flyio-e2e-pool"
	poolDir := filepath.Join(scratch, "flyio", "pool")
	e, err := stack.Up(ctx, stack.Options{Repo: repo, Scratch: scratch, ImageDir: images, Versitygw: vgw, PoolName: pool, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Down(); err != nil {
			t.Errorf("stop: %v", err)
		}
		if err := stack.DestroyPool(context.Background(), pool, poolDir); err != nil {
			t.Errorf("remove pool: %v", err)
		}
		if t.Failed() {
			for name, path := range e.Logs() {
				t.Logf("%s log tail (%s):\n%s", name, path, stack.FileTail(path, 40))
			}
		}
	})

	for _, f := range stack.Families {
		start := time.Now()
		out, err := e.Pull(ctx, f)
		if err != nil {
			t.Fatalf("pull %s: %v", f, err)
		}
		t.Logf("pull %s (%s): %s", f, time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	}

	// Identical layers are stored once: one chain (one device) per
	// distinct layer digest, no device shared by two chains.
	out, err := e.Daemon.CLI(ctx, []string{"ls", "chains"}, "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []chainRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("ls chains --format json: %v: %s", err, out)
	}
	devs := map[uint32]bool{}
	for _, r := range rows {
		if devs[r.DeviceID] {
			t.Errorf("device %d listed twice by ls chains: %s", r.DeviceID, out)
		}
		devs[r.DeviceID] = true
	}
	if len(rows) != len(distinct) {
		t.Errorf("ls chains lists %d chains, want %d (one per distinct layer of %d tarballs):\n%s",
			len(rows), len(distinct), countLayers(digests), out)
	}
	wantMetric(t, ctx, e, "flyio_snapshotter_pipeline_unpacked", len(distinct))
	wantMetric(t, ctx, e, "flyio_snapshotter_pipeline_blobs", len(distinct))
	// The S3 counters saw the pulls: requests, bytes and durations.
	s3lines, err := e.Metrics(ctx, "flyio_snapshotter_s3_", "flyio_snapshotter_pull_duration_seconds_count", "flyio_snapshotter_layers_rejected")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("metrics page, S3 and pull counters:\n%s", strings.Join(s3lines, "\n"))
	for _, prefix := range []string{
		`flyio_snapshotter_s3_requests_total{operation="GetObject",outcome="ok"} `,
		`flyio_snapshotter_s3_requests_total{operation="ListObjectsV2",outcome="ok"} `,
		`flyio_snapshotter_s3_downloaded_bytes_total `,
		`flyio_snapshotter_pull_duration_seconds_count{outcome="ok"} `,
	} {
		var found bool
		for _, l := range s3lines {
			if v, ok := strings.CutPrefix(l, prefix); ok && v != "0" {
				found = true
			}
		}
		if !found {
			t.Errorf("metrics page has no non-zero %s", strings.TrimSpace(prefix))
		}
	}

	// `ctr run` must find each pulled image unpacked in containerd (else it
	// unpacks by itself and fails: no layer blobs): pull's registrar made
	// containerd adopt the chain.
	for _, f := range stack.Families {
		ok, err := e.Unpacked(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("after pull, containerd does not see %s as unpacked in flyio: the registrar did not adopt its chain", f)
		}
	}

	// The container sees the image the layers make, whiteouts applied.
	for _, c := range []struct {
		family string
		want   []string
	}{
		{"debian", []string{
			"absent:  /etc/motd",                   // etc/.wh.motd over layer 1
			"absent:  /usr/share/man",              // usr/share/.wh.man over layer 2
			"absent:  /usr/share/doc/apt",          // usr/share/doc/.wh.apt
			"present: /usr/share/doc/bash",         // its sibling stays
			"absent:  /usr/share/info/sed.info.gz", // opaque usr/share/info
			"present: /usr/share/info/flyio.info",
			"present: /etc/issue.net",
		}},
		{"debian-dev", []string{
			"present: /etc/motd", "present: /usr/share/man", "present: /usr/share/doc/apt",
			"absent:  /etc/issue.net", "absent:  /usr/share/info/sed.info.gz", "absent:  /usr/share/info/flyio.info",
		}},
		{"debian-rootfs", []string{
			"absent:  /etc/motd", "present: /etc/issue.net", "absent:  /usr/share/doc/bash",
		}},
	} {
		out, err := e.RunContainer(ctx, c.family, "e2e-"+c.family, "/usr/local/bin/flyio-hello")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s container printed:\n%s", c.family, out)
		wantLines(t, c.family, out, append([]string{"hello from Debian GNU/Linux 12 (bookworm), family " + c.family}, c.want...)...)
	}

	// A second name for the same layers is registered and runnable, and so
	// is a name again after `ctr image rm` removed it from containerd.
	second := "flyio.local/e2e/debian-second:latest"
	if out, err := e.Daemon.CLI(ctx, []string{"pull"}, "--name", second, stack.S3URL("debian")); err != nil {
		t.Fatalf("pull debian under a second name: %v: %s", err, out)
	}
	if out, err := e.Ctrd.Ctr(ctx, "image", "rm", stack.Ref("debian")); err != nil {
		t.Fatalf("ctr image rm %s: %v: %s", stack.Ref("debian"), err, out)
	}
	if out, err := e.Pull(ctx, "debian"); err != nil {
		t.Fatalf("re-pull of debian after ctr image rm: %v: %s", err, out)
	}
	listed, err := e.Ctrd.Ctr(ctx, "image", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{second, stack.Ref("debian")} {
		if !strings.Contains(listed, ref) {
			t.Errorf("ctr image ls does not list %s:\n%s", ref, listed)
		}
		out, err := e.Ctrd.Ctr(ctx, "run", "--rm", "--snapshotter", "flyio", ref, "e2e-names", "/usr/local/bin/flyio-hello")
		if err != nil {
			t.Fatalf("ctr run %s: %v: %s", ref, err, out)
		}
		wantLines(t, ref, out, "hello from Debian GNU/Linux 12 (bookworm), family debian")
	}
	if out, err := e.Ctrd.Ctr(ctx, "image", "rm", "--sync", second); err != nil {
		t.Fatalf("ctr image rm %s: %v: %s", second, err, out)
	}

	// Remove the images; containerd's GC removes their snapshots through
	// our proxy plugin, and nothing of ours may stay.
	usedBefore := metricSum(t, ctx, e, "flyio_snapshotter_pool_data_used_bytes{")
	fileBefore := metricSum(t, ctx, e, "flyio_snapshotter_pool_loop_files_allocated_bytes{")
	if out, err := e.RemoveImages(ctx); err != nil {
		t.Fatalf("remove images: %v: %s", err, out)
	}
	// pool.discard_blocks (the default) gives the removed devices' blocks
	// back to the filesystem under the loop files, not only to the pool.
	freedPool := usedBefore - metricSum(t, ctx, e, "flyio_snapshotter_pool_data_used_bytes{")
	freedFile := fileBefore - metricSum(t, ctx, e, "flyio_snapshotter_pool_loop_files_allocated_bytes{")
	t.Logf("image removal freed %.1f MiB of the pool's data and %.1f MiB of its loop files", freedPool/(1<<20), freedFile/(1<<20))
	if freedPool <= 0 || freedFile < freedPool/2 {
		status, _ := e.Daemon.CLI(ctx, []string{"pool", "status"})
		t.Errorf("image removal freed %.0f bytes of the pool's data but %.0f of its loop files: the removed devices' blocks were not discarded\npool status:\n%s\ndaemon log tail:\n%s",
			freedPool, freedFile, status, e.Daemon.Proc.LogTail(80))
	}
	for _, kind := range []string{"unpacked", "chains", "images", "snapshots"} {
		out, err := e.Daemon.CLI(ctx, []string{"ls", kind}, "--format", "json")
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimSpace(out); s != "[]" && s != "null" {
			t.Errorf("after image removal and GC, ls %s still lists:\n%s", kind, s)
		}
	}
	// The downloaded tarballs went with the records.
	wantMetric(t, ctx, e, "flyio_snapshotter_pipeline_unpacked", 0)
	wantMetric(t, ctx, e, "flyio_snapshotter_pipeline_blobs", 0)
	wantMetric(t, ctx, e, "flyio_snapshotter_pipeline_activations", 0)
	names, err := stack.DMDevices(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != pool {
		t.Errorf("after image removal and GC, device-mapper devices of ours: %v, want only the pool %s", names, pool)
	}
	out, err = e.Daemon.CLI(ctx, []string{"pool", "ls"}, "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pool ls after GC: %s", strings.TrimSpace(out))
}

// wantMetric fails the test unless the daemon's metrics endpoint reports
// the unlabelled gauge name at want.
func wantMetric(t *testing.T, ctx context.Context, e *stack.E2E, name string, want int) {
	t.Helper()
	lines, err := e.Metrics(ctx, name+" ")
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 1 || lines[0] != fmt.Sprintf("%s %d", name, want) {
		t.Errorf("metrics endpoint: %q, want %s %d", lines, name, want)
	}
}

// metricSum is the sum of the samples of the daemon's metrics whose
// series starts with prefix; it fails the test when there is none.
func metricSum(t *testing.T, ctx context.Context, e *stack.E2E, prefix string) float64 {
	t.Helper()
	sum, n, err := stack.MetricSum(ctx, e.Daemon.Metrics, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatalf("metrics endpoint: no %s sample", prefix)
	}
	return sum
}

func countLayers(m map[string][]string) int {
	n := 0
	for _, ds := range m {
		n += len(ds)
	}
	return n
}

// wantLines fails the test for each wanted line missing from out.
func wantLines(t *testing.T, what, out string, want ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		have[strings.TrimRight(l, "\r ")] = true
	}
	for _, w := range want {
		if !have[strings.TrimRight(w, " ")] {
			t.Errorf("container from %s did not print %q; it printed:\n%s", what, w, out)
		}
	}
}
