//go:build dm

package clients

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/containerd/ociimage"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

const (
	// pool is the dm name of our daemon's pool in this run.
	pool = "flyio-cl-pool"
	// imageRepo and pauseRepo are the repositories the test pushes to the
	// local registry: a busybox image and the pods' sandbox image.
	imageRepo = "flyio-it/busybox"
	// specialsRepo holds an image whose upper layer carries a device node
	// and a hard link to a lower layer's file (ociimage.Options.Specials).
	specialsRepo = "flyio-it/specials"
	pauseRepo    = "flyio-it/pause"
	// criNamespace is where containerd's CRI plugin keeps Kubernetes'
	// images and containers.
	criNamespace = "k8s.io"
)

// env is one registry, our daemon and one containerd with the CRI plugin
// on, shared by the subtests of TestClients.
type env struct {
	repo, scratch string
	tools         string // containerd, containerd-shim-runc-v2, ctr
	nerdctl       string
	reg           *stack.Registry
	daemon        *stack.Daemon
	ctrd          *stack.Proc
	socket        string // containerd's
	ctrdEnv       []string
	client        *client.Client
	image         ociimage.Image
	imageRef      string // the busybox image in the registry
	pauseRef      string // the sandbox image in the registry
	specials      ociimage.Image
	specialsRef   string // the image with a device node and a lower-layer hard link
	s3            *stack.S3
	s3DiffIDs     []string // the S3 images' layers, uncompressed
	s3Ref         string   // the S3 image registered in the CRI namespace
	timings       []timing
}

type timing struct {
	what string
	took time.Duration
}

// timed runs f and records its wall time under what.
func (e *env) timed(t *testing.T, what string, f func() error) {
	t.Helper()
	start := time.Now()
	err := f()
	e.timings = append(e.timings, timing{what, time.Since(start)})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func setup(t *testing.T, ctx context.Context) *env { return setupPool(t, ctx, "2GiB") }

// setupPool is setup with a pool of dataSize (pool.data_size).
func setupPool(t *testing.T, ctx context.Context, dataSize string) *env {
	repo, scratch, tools, err := stack.VMEnv()
	if err != nil {
		t.Fatal(err)
	}
	// A folder per test: each starts its own registry, containerd and
	// versitygw, whose stores must not hold what an earlier test made.
	e := &env{repo: repo, tools: tools, scratch: filepath.Join(scratch, "clients", strings.ReplaceAll(t.Name(), "/", "_"))}
	if e.nerdctl, err = stack.Tool(repo, "nerdctl", "github.com/containerd/nerdctl/v2", "nerdctl", "nerdctl"); err != nil {
		t.Fatal(err)
	}
	regBin, err := stack.Tool(repo, "registry", "github.com/distribution/distribution/v3", "registry", "registry")
	if err != nil {
		t.Fatal(err)
	}
	if err := stack.LoopbackUp(ctx); err != nil {
		t.Fatal(err)
	}

	e.timed(t, "start registry", func() error {
		e.reg, err = stack.StartRegistry(ctx, regBin, filepath.Join(e.scratch, "registry"))
		return err
	})
	t.Cleanup(func() {
		if err := e.reg.Stop(); err != nil {
			t.Errorf("registry: %v", err)
		}
	})
	e.imageRef = e.reg.Host + "/" + imageRepo + ":v1"
	e.pauseRef = e.reg.Host + "/" + pauseRepo + ":1"
	e.specialsRef = e.reg.Host + "/" + specialsRepo + ":v1"
	var archive []byte
	e.timed(t, "build and push the busybox and pause images", func() error {
		var buf bytes.Buffer
		host := platforms.DefaultSpec()
		if e.image, err = ociimage.Write(&buf, ociimage.Options{Name: e.imageRef, PayloadBytes: 1 << 20, Platform: host}); err != nil {
			return err
		}
		archive = bytes.Clone(buf.Bytes())
		if _, err := e.reg.PushOCIArchive(ctx, buf.Bytes(), imageRepo, "v1"); err != nil {
			return err
		}
		buf.Reset()
		if _, err := ociimage.Write(&buf, ociimage.Options{Name: e.pauseRef, Applets: []string{"sleep"}, Cmd: []string{"/bin/sleep", "86400"}, Platform: host}); err != nil {
			return err
		}
		if _, err := e.reg.PushOCIArchive(ctx, buf.Bytes(), pauseRepo, "1"); err != nil {
			return err
		}
		buf.Reset()
		applets := append(slices.Clone(ociimage.DefaultApplets), "stat")
		if e.specials, err = ociimage.Write(&buf, ociimage.Options{Name: e.specialsRef, Applets: applets, Specials: true, Platform: host}); err != nil {
			return err
		}
		_, err := e.reg.PushOCIArchive(ctx, buf.Bytes(), specialsRepo, "v1")
		return err
	})

	// Our daemon runs a copy of bin/ so that a rebuild on the host during
	// the run cannot change the binary under it.
	bin, err := stack.PrivateBinary(repo, e.scratch)
	if err != nil {
		t.Fatal(err)
	}
	e.timed(t, "start versitygw with the S3 images", func() error { return e.startS3(ctx, archive) })
	t.Cleanup(func() {
		if err := e.s3.Stop(); err != nil {
			t.Errorf("versitygw: %v", err)
		}
	})
	if e.daemon, err = stack.WriteDaemonConfig(bin, stack.DaemonOptions{Dir: filepath.Join(e.scratch, "flyio"), PoolName: pool, DataSize: dataSize,
		S3: e.s3, Containerd: filepath.Join(e.scratch, "containerd", "containerd.sock")}); err != nil {
		t.Fatal(err)
	}
	// The S3 images carry a file capability, which the daemon applies only
	// when told to trust them.
	if err := appendFile(e.daemon.Config, "\n[pipeline]\nallow_setid = true\n"); err != nil {
		t.Fatal(err)
	}
	e.timed(t, "start our daemon (new pool)", func() error { return e.daemon.Start(ctx) })
	t.Cleanup(func() {
		if err := e.daemon.Stop(); err != nil {
			t.Errorf("our daemon: %v", err)
		}
		if err := stack.DestroyPool(context.Background(), pool, filepath.Join(e.daemon.Root, "pool")); err != nil {
			t.Errorf("destroy pool: %v", err)
		}
	})

	e.timed(t, "start containerd with the CRI plugin", func() error { return e.startContainerd(ctx) })
	t.Cleanup(func() {
		e.client.Close()
		if err := e.ctrd.Stop(60 * time.Second); err != nil {
			t.Errorf("containerd: %v", err)
		}
	})
	return e
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// containerdConfig is containerd's config for the run: version 4, the CRI
// plugin on with flyio as its image snapshotter and the registry's pause
// image as its sandbox image, our daemon as proxy snapshotter "flyio" and
// proxy differ "flyio-diff", and flyio in the transfer service's unpack
// list for this host's platform with flyio-diff applying its layers, as
// contrib/containerd/config.toml.snippet sets it up (the transfer service
// does the pulls of ctr and of the CRI plugin).
func (e *env) containerdConfig() string {
	dir := filepath.Join(e.scratch, "containerd")
	var b strings.Builder
	fmt.Fprintf(&b, "version = 4\nroot = %q\nstate = %q\ntemp = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "tmp"))
	b.WriteString(`disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]` + "\n")
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.server.v1.grpc']\naddress = %q\n", e.socket)
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.server.v1.ttrpc']\naddress = %q\n", e.socket+".ttrpc")
	fmt.Fprintf(&b, "\n[proxy_plugins.flyio]\ntype = \"snapshot\"\naddress = %q\n", e.daemon.Socket)
	fmt.Fprintf(&b, "\n[proxy_plugins.flyio-diff]\ntype = \"diff\"\naddress = %q\n", e.daemon.Socket)
	b.WriteString("\n[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]\nplatform = \"linux\"\nsnapshotter = \"flyio\"\ndiffer = \"flyio-diff\"\n")
	b.WriteString("\n[plugins.'io.containerd.cri.v1.images']\nsnapshotter = \"flyio\"\n")
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\nsandbox = %q\n", e.pauseRef)
	return b.String()
}

func (e *env) startContainerd(ctx context.Context) error {
	dir := filepath.Join(e.scratch, "containerd")
	e.socket = filepath.Join(dir, "containerd.sock")
	var err error
	if e.ctrd, e.ctrdEnv, err = stack.RunContainerd(ctx, e.tools, dir, e.containerdConfig(), e.socket, "info"); err != nil {
		return err
	}
	e.client, err = client.New(e.socket, client.WithTimeout(time.Minute))
	if err != nil {
		e.ctrd.Kill()
		return fmt.Errorf("connect to containerd at %s: %w", e.socket, err)
	}
	return nil
}

// ctr runs ctr against the run's containerd in namespace ns and returns
// its combined output.
func (e *env) ctr(ctx context.Context, ns string, args ...string) (string, error) {
	return stack.Run(ctx, e.ctrdEnv, e.ctrArgv(ns, args...)...)
}

// ctrArgv is the ctr command line against the run's containerd in
// namespace ns.
func (e *env) ctrArgv(ns string, args ...string) []string {
	return append([]string{filepath.Join(e.tools, "ctr"), "--address", e.socket, "--namespace", ns}, args...)
}

// nerdctlRun runs nerdctl against the run's containerd in namespace ns
// (nerdctlArgv) and returns its combined output.
func (e *env) nerdctlRun(ctx context.Context, ns string, args ...string) (string, error) {
	return stack.Run(ctx, e.ctrdEnv, e.nerdctlArgv(ns, args...)...)
}

// nerdctlArgv is the nerdctl command line against the run's containerd in
// namespace ns, with flyio as its snapshotter and its state under the
// scratch folder.
func (e *env) nerdctlArgv(ns string, args ...string) []string {
	return append([]string{e.nerdctl, "--address", e.socket, "--namespace", ns, "--snapshotter", "flyio",
		"--data-root", filepath.Join(e.scratch, "nerdctl"), "--cgroup-manager", "cgroupfs"}, args...)
}

// containerOutput runs a client's container command line (ctrArgv or
// nerdctlArgv of "run ...") and returns what the container printed: the
// client's standard output, without its own log lines.
func (e *env) containerOutput(ctx context.Context, argv []string) (string, error) {
	return stack.RunStdout(ctx, e.ctrdEnv, argv...)
}

// ctrPull pulls ref into flyio with ctr, from the test's registry over
// plain HTTP; an error carries ctr's last lines of output.
func (e *env) ctrPull(ctx context.Context, ns, ref string) error {
	out, err := e.ctr(ctx, ns, "image", "pull", "--snapshotter", "flyio", "--plain-http", ref)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, lastLines(out, 5))
	}
	return nil
}

// pullWithCtr is ctrPull timed as the step what, followed by the check
// that containerd sees ref unpacked in flyio.
func (e *env) pullWithCtr(t *testing.T, ctx context.Context, what, ns, ref string) {
	t.Helper()
	e.timed(t, what, func() error { return e.ctrPull(ctx, ns, ref) })
	if err := e.unpackedInFlyio(ctx, ns, ref); err != nil {
		t.Fatal(err)
	}
}

// unpackedInFlyio checks what a run relies on: containerd holds ref in ns
// and sees its layers unpacked in the flyio snapshotter.
func (e *env) unpackedInFlyio(ctx context.Context, ns, ref string) error {
	ctx = namespaces.WithNamespace(ctx, ns)
	img, err := e.client.GetImage(ctx, ref)
	if err != nil {
		return fmt.Errorf("image %s in namespace %s: %w", ref, ns, err)
	}
	ok, err := img.IsUnpacked(ctx, "flyio")
	if err != nil {
		return fmt.Errorf("image %s in namespace %s: %w", ref, ns, err)
	}
	if !ok {
		return fmt.Errorf("image %s in namespace %s is not unpacked in flyio", ref, ns)
	}
	return nil
}

// ourThinDevices returns the names of the thin devices in our pool other
// than its base device, from `pool ls --check --format json`, which also
// fails when the pool and our database disagree.
func (e *env) ourThinDevices(ctx context.Context) ([]string, error) {
	out, err := e.daemon.CLI(ctx, []string{"pool", "ls"}, "--check", "--format", "json")
	if err != nil {
		return nil, err
	}
	var rows []struct {
		ID   uint32 `json:"id"`
		Name string `json:"name"`
		Role string `json:"role"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		return nil, fmt.Errorf("pool ls --format json: %w: %s", err, out)
	}
	var names []string
	for _, r := range rows {
		if r.Role != "base" {
			names = append(names, fmt.Sprintf("%d %s (%s)", r.ID, r.Name, r.Role))
		}
	}
	return names, nil
}

// collectGarbage runs containerd's garbage collector to completion: deleting
// a lease synchronously waits for a full collection, which removes through
// our proxy plugin every snapshot no image or container references.
func (e *env) collectGarbage(ctx context.Context) error {
	return stack.CollectGarbage(namespaces.WithNamespace(ctx, criNamespace), e.client)
}

// TestClients pulls the registry's image with ctr, nerdctl and the CRI
// plugin, and S3 images with our pull, runs containers from them with each
// client, all on flyio, checks what the containers print, removes
// everything through each client and checks that containerd's garbage
// collection leaves no snapshot and no thin device of ours.
func TestClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 35*time.Minute)
	defer cancel()
	start := time.Now()
	e := setup(t, ctx)

	t.Run("ctr", func(t *testing.T) { e.testCtr(t, ctx) })
	t.Run("nerdctl", func(t *testing.T) { e.testNerdctl(t, ctx) })
	t.Run("s3", func(t *testing.T) { e.testS3(t, ctx) })
	t.Run("cri", func(t *testing.T) { e.testCRI(t, ctx) })

	e.timed(t, "containerd garbage collection", func() error { return e.collectGarbage(ctx) })
	thins, err := e.ourThinDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(thins) != 0 {
		t.Errorf("after every client removed its images and containers and containerd collected garbage, our pool still holds thin devices %v", thins)
	}
	names, err := stack.DMDevices(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != pool {
		t.Errorf("after removal and garbage collection, device-mapper devices of ours: %v, want only the pool %s", names, pool)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "wall times (TCG VM):\n| step | wall |\n|---|---|\n")
	for _, tm := range e.timings {
		fmt.Fprintf(&b, "| %s | %s |\n", tm.what, tm.took.Round(10*time.Millisecond))
	}
	fmt.Fprintf(&b, "| whole test | %s |\n", time.Since(start).Round(10*time.Millisecond))
	t.Log(b.String())
}

func (e *env) testCtr(t *testing.T, ctx context.Context) {
	const ns = "flyio-ctr"
	mark := e.daemonLogMark(t)
	e.pullWithCtr(t, ctx, "ctr image pull --snapshotter flyio --plain-http", ns, e.imageRef)
	// Each of the image's layers is a thin device of ours.
	thins, err := e.ourThinDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(thins) != len(e.image.Layers) {
		t.Errorf("after ctr pull our pool holds thin devices %v, want one per layer (%d)", thins, len(e.image.Layers))
	}
	e.appliedByDaemon(t, e.image, mark)
	var out string
	e.timed(t, "ctr run --rm --snapshotter flyio", func() error {
		out, err = e.containerOutput(ctx, e.ctrArgv(ns, "run", "--rm", "--snapshotter", "flyio", e.imageRef, "ctr-hello", "/bin/cat", ociimage.MarkerPath))
		return err
	})
	if out != ociimage.MarkerContent {
		t.Errorf("ctr run printed %q, want %q", out, ociimage.MarkerContent)
	}
	t.Logf("ctr run printed %q", out)
	e.timed(t, "ctr image rm --sync", func() error {
		_, err := e.ctr(ctx, ns, "image", "rm", "--sync", e.imageRef)
		return err
	})
	e.testSpecials(t, ctx, ns)
}

// daemonLogMark returns the length of the daemon's log: appliedByDaemon
// reads what was logged after it.
func (e *env) daemonLogMark(t *testing.T) int {
	t.Helper()
	fi, err := os.Stat(e.daemon.Proc.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Size())
}

// appliedByDaemon checks that, since the daemon's log was at mark,
// containerd handed every layer of img to our diff service, which found the
// diff ID the image's config names: one "differ: layer applied" line of
// the daemon's log names both.
func (e *env) appliedByDaemon(t *testing.T, img ociimage.Image, mark int) {
	t.Helper()
	logged, err := os.ReadFile(e.daemon.Proc.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(logged[mark:]), "\n")
	for i, l := range img.Layers {
		layer, diffID := fmt.Sprintf("layer=%q", l.Digest), fmt.Sprintf("diff_id=%q", img.DiffIDs[i])
		if !slices.ContainsFunc(lines, func(line string) bool {
			return strings.Contains(line, "differ: layer applied") && strings.Contains(line, layer) && strings.Contains(line, diffID)
		}) {
			t.Errorf("the daemon's log has no \"differ: layer applied\" line for layer %s with %s: containerd applied it itself", l.Digest, diffID)
		}
	}
}

// testSpecials pulls with ctr, into flyio, an image whose upper layer holds
// a device node, a hard link to its lower layer's busybox and a file
// written through the lower layer's lib -> usr/lib, as containerd's own
// applier takes them: the daemon applies both layers, and a container sees
// the device, one file under the two names, and the file in usr/lib.
func (e *env) testSpecials(t *testing.T, ctx context.Context, ns string) {
	mark := e.daemonLogMark(t)
	e.pullWithCtr(t, ctx, "ctr image pull (device node, lower-layer hard link)", ns, e.specialsRef)
	e.appliedByDaemon(t, e.specials, mark)
	script := fmt.Sprintf("stat -c '%%F %%t:%%T' %s; stat -c '%%i %%h' /bin/busybox %s; cat %s", ociimage.DevicePath, ociimage.LowerLinkPath, ociimage.ThroughSymlinkPath)
	out, err := e.containerOutput(ctx, e.ctrArgv(ns, "run", "--rm", "--snapshotter", "flyio", e.specialsRef, "ctr-specials", "/bin/sh", "-c", script))
	if err != nil {
		t.Fatalf("ctr run: %v\n%s", err, out)
	}
	t.Logf("ctr run printed %q", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || lines[0] != "character special file 1:3" || lines[1] != lines[2] || !strings.HasSuffix(lines[1], " 2") || lines[3] != ociimage.ThroughSymlinkFile {
		t.Errorf("in the container: %q, want %s the character device 1:3, /bin/busybox with two names, one of them %s, and %s written through lib -> usr/lib",
			out, ociimage.DevicePath, ociimage.LowerLinkPath, ociimage.ThroughSymlinkPath)
	}
	if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", e.specialsRef); err != nil {
		t.Fatal(err)
	}
}

func (e *env) testNerdctl(t *testing.T, ctx context.Context) {
	const ns = "flyio-nerdctl"
	e.timed(t, "nerdctl --snapshotter flyio pull", func() error {
		out, err := e.nerdctlRun(ctx, ns, "pull", "--insecure-registry", e.imageRef)
		t.Logf("nerdctl pull:\n%s", lastLines(out, 3))
		return err
	})
	if err := e.unpackedInFlyio(ctx, ns, e.imageRef); err != nil {
		t.Fatal(err)
	}
	// nerdctl unpacks with containerd's client-side unpacker, whose differ
	// is the diff service's default (walking), not the transfer service's
	// unpack configuration: containerd applies these layers itself.
	var out string
	e.timed(t, "nerdctl --snapshotter flyio run --rm --net none", func() error {
		var err error
		out, err = e.containerOutput(ctx, e.nerdctlArgv(ns, "run", "--rm", "--net", "none", e.imageRef, "/bin/cat", ociimage.MarkerPath))
		return err
	})
	if out != ociimage.MarkerContent {
		t.Errorf("nerdctl run printed %q, want %q", out, ociimage.MarkerContent)
	}
	t.Logf("nerdctl run printed %q", out)
	e.timed(t, "nerdctl rmi", func() error {
		_, err := e.nerdctlRun(ctx, ns, "rmi", e.imageRef)
		return err
	})
}

// lastLines returns the last n lines of s (a client's progress output).
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// readAll reads a file that may still be written.
func readAll(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	return string(b), err
}
