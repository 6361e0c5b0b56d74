//go:build dm

package containerdtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/containerd/ociimage"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

const (
	// namespace is the containerd namespace every test works in.
	namespace = "flyio-it"
	// imageRepo is the repository part of the test image names.
	imageRepo = "docker.io/flyio-test/busybox"
	// Pool settings shared by our pool and the devmapper anchor pool, so
	// the benchmark compares snapshotters, not pools.
	poolDataSize     = 2 << 30
	poolMetaSize     = 64 << 20
	poolBlockSectors = 128 // 64 KiB
	baseImageSize    = 256 << 20
)

// snapshotters returns the snapshotters the tests drive: FLYIO_IT_SNAPSHOTTERS
// (comma separated) or both ours and the devmapper anchor.
func snapshotters() []string {
	if v := os.Getenv("FLYIO_IT_SNAPSHOTTERS"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"flyio", "devmapper"}
}

func wants(name string) bool {
	for _, s := range snapshotters() {
		if s == name {
			return true
		}
	}
	return false
}

// env is what the containerd tests share: one containerd with our proxy
// plugin and the devmapper anchor, one long-lived client, one test image.
type env struct {
	repo, scratch, tools string
	imagePath            string
	image                ociimage.Image
	ours                 *ourDaemon
	anchor               *dmPool
	ctrd                 *stack.Proc
	client               *client.Client
	setupTime            time.Duration
}

var (
	envOnce  sync.Once
	theEnv   *env
	envErr   error
	teardown []func()
)

// getEnv sets up the shared environment on first use (lazily, so a run of
// only the crash test starts no containerd) and fails the test when that
// set-up failed.
func getEnv(t testing.TB) *env {
	t.Helper()
	envOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		start := time.Now()
		theEnv, envErr = setupEnv(ctx)
		if envErr == nil {
			theEnv.setupTime = time.Since(start)
		}
	})
	if envErr != nil {
		t.Fatalf("containerd test environment: %v", envErr)
	}
	return theEnv
}

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(teardown) - 1; i >= 0; i-- {
		teardown[i]()
	}
	os.Exit(code)
}

func setupEnv(ctx context.Context) (*env, error) {
	repo, scratch, tools, err := stack.VMEnv()
	if err != nil {
		return nil, err
	}
	e := &env{repo: repo, scratch: filepath.Join(scratch, "containerd-it"), tools: tools}
	if err := os.MkdirAll(e.scratch, 0o755); err != nil {
		return nil, fmt.Errorf("scratch: %w", err)
	}

	// The test image, built here from the host's static busybox.
	var buf bytes.Buffer
	e.image, err = ociimage.Write(&buf, ociimage.Options{Name: imageRepo + ":it", PayloadBytes: 8 << 20})
	if err != nil {
		return nil, err
	}
	e.imagePath = filepath.Join(e.scratch, "image.oci.tar")
	if err := os.WriteFile(e.imagePath, buf.Bytes(), 0o644); err != nil {
		return nil, fmt.Errorf("write image archive: %w", err)
	}

	cfg := containerdConfig{Root: filepath.Join(e.scratch, "containerd")}
	if wants("flyio") {
		e.ours, err = startOurDaemon(ctx, repo, filepath.Join(e.scratch, "flyio"), "flyio-it-pool")
		if err != nil {
			return nil, err
		}
		teardown = append(teardown, func() { e.ours.stopAndLog() })
		cfg.ProxySocket = e.ours.socket
		cfg.Snapshotters = append(cfg.Snapshotters, "flyio")
	}
	if wants("devmapper") {
		e.anchor, err = createDMPool(ctx, filepath.Join(e.scratch, "devmapper-pool"), "flyio-it-anchor")
		if err != nil {
			return nil, err
		}
		teardown = append(teardown, func() { e.anchor.destroy(context.Background()) })
		cfg.DevmapperPool = e.anchor.name
		cfg.DevmapperRoot = filepath.Join(e.scratch, "devmapper")
		cfg.Snapshotters = append(cfg.Snapshotters, "devmapper")
	}
	e.ctrd, e.client, err = startContainerd(ctx, tools, cfg)
	if err != nil {
		return nil, err
	}
	teardown = append(teardown, func() {
		e.client.Close()
		if err := e.ctrd.Stop(30 * time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "containerd stop: %v\n", err)
		}
	})
	return e, nil
}

// dmPool is a thin pool made with losetup and dmsetup for containerd's
// devmapper snapshotter, with the same table settings as our thinpool
// package uses (block size, skip_block_zeroing, error_if_no_space).
type dmPool struct {
	name  string
	loops []string
}

func createDMPool(ctx context.Context, dir, name string) (*dmPool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("devmapper pool %s: %w", name, err)
	}
	p := &dmPool{name: name}
	for _, f := range []struct {
		file string
		size int64
	}{{"metadata", poolMetaSize}, {"data", poolDataSize}} {
		path := filepath.Join(dir, f.file)
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			return nil, fmt.Errorf("devmapper pool %s: %w", name, err)
		}
		if err := os.Truncate(path, f.size); err != nil {
			return nil, fmt.Errorf("devmapper pool %s: %w", name, err)
		}
		out, err := stack.Run(ctx, nil, "losetup", "--find", "--show", path)
		if err != nil {
			p.destroy(ctx)
			return nil, fmt.Errorf("devmapper pool %s: %w", name, err)
		}
		p.loops = append(p.loops, strings.TrimSpace(out))
	}
	table := fmt.Sprintf("0 %d thin-pool %s %s %d 0 2 skip_block_zeroing error_if_no_space",
		poolDataSize/512, p.loops[0], p.loops[1], poolBlockSectors)
	if _, err := stack.Run(ctx, nil, "dmsetup", "create", name, "--table", table); err != nil {
		p.destroy(ctx)
		return nil, fmt.Errorf("devmapper pool %s: %w", name, err)
	}
	return p, nil
}

// destroy removes the pool, its thin devices and its loop devices.
func (p *dmPool) destroy(ctx context.Context) {
	removePool(ctx, p.name, nil)
	for _, l := range p.loops {
		if _, err := stack.Run(ctx, nil, "losetup", "-d", l); err != nil {
			fmt.Fprintf(os.Stderr, "teardown: %v\n", err)
		}
	}
}

// removePool removes the active thin devices named after pool, the pool,
// and the loop devices backed by files (best effort, reported on stderr: it
// runs at the end of the run, so that nothing is left behind).
func removePool(ctx context.Context, pool string, files []string) {
	if out, err := stack.Run(ctx, nil, "dmsetup", "ls"); err == nil {
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && strings.HasPrefix(f[0], pool+"-") {
				if _, err := stack.Run(ctx, nil, "dmsetup", "remove", f[0]); err != nil {
					fmt.Fprintf(os.Stderr, "teardown: %v\n", err)
				}
			}
		}
	}
	if _, err := stack.Run(ctx, nil, "dmsetup", "remove", pool); err != nil {
		fmt.Fprintf(os.Stderr, "teardown: %v\n", err)
	}
	for _, file := range files {
		out, err := stack.Run(ctx, nil, "losetup", "-j", file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			if dev, _, ok := strings.Cut(line, ":"); ok {
				if _, err := stack.Run(ctx, nil, "losetup", "-d", dev); err != nil {
					fmt.Fprintf(os.Stderr, "teardown: %v\n", err)
				}
			}
		}
	}
}

// containerdConfig is what startContainerd writes into containerd's config.
type containerdConfig struct {
	Root          string
	ProxySocket   string // our daemon's socket, registered as snapshotter "flyio"
	DevmapperPool string // pool for the built-in devmapper snapshotter
	DevmapperRoot string
	Snapshotters  []string // unpack_config entries for linux/amd64
}

func (c containerdConfig) socket() string { return filepath.Join(c.Root, "containerd.sock") }

func (c containerdConfig) toml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "version = 4\nroot = %q\nstate = %q\ntemp = %q\n",
		filepath.Join(c.Root, "root"), filepath.Join(c.Root, "state"), filepath.Join(c.Root, "tmp"))
	// CRI is not under test and costs start-up time under emulation.
	b.WriteString(`disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs"]` + "\n")
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.server.v1.grpc']\naddress = %q\n", c.socket())
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.server.v1.ttrpc']\naddress = %q\n", c.socket()+".ttrpc")
	if c.ProxySocket != "" {
		fmt.Fprintf(&b, "\n[proxy_plugins.flyio]\ntype = \"snapshot\"\naddress = %q\n", c.ProxySocket)
	}
	if c.DevmapperPool != "" {
		fmt.Fprintf(&b, "\n[plugins.'io.containerd.snapshotter.v1.devmapper']\npool_name = %q\nroot_path = %q\nbase_image_size = \"%dMB\"\nasync_remove = true\ndiscard_blocks = false\nfs_type = \"ext4\"\n",
			c.DevmapperPool, c.DevmapperRoot, baseImageSize>>20)
	}
	// An OS-only platform, which every containerd 2.x completes with the
	// host's architecture, as in contrib/containerd/config.toml.snippet.
	for _, s := range c.Snapshotters {
		fmt.Fprintf(&b, "\n[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]\nplatform = \"linux\"\nsnapshotter = %q\n", s)
	}
	return b.String()
}

// startContainerd writes cfg, starts containerd and connects one client.
func startContainerd(ctx context.Context, tools string, cfg containerdConfig) (*stack.Proc, *client.Client, error) {
	p, _, err := stack.RunContainerd(ctx, tools, cfg.Root, cfg.toml(), cfg.socket(), "info")
	if err != nil {
		return nil, nil, err
	}
	c, err := client.New(cfg.socket(), client.WithDefaultNamespace(namespace), client.WithTimeout(time.Minute))
	if err != nil {
		p.Kill()
		return nil, nil, fmt.Errorf("connect to containerd at %s: %w; log tail:\n%s", cfg.socket(), err, p.LogTail(40))
	}
	return p, c, nil
}
