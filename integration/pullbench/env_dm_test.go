//go:build dm

package pullbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

const (
	// bucket is the S3 bucket of the bench images.
	bucket = "pullbench"
	// ourPool, anchorPool and floorPool are the dm names of our daemon's
	// pool, the pool of containerd's built-in devmapper snapshotter and
	// the pool of the floor's ext4 device.
	ourPool    = "pb-flyio"
	anchorPool = "pb-devmapper"
	floorPool  = "pb-floor"
	// poolDataSize is every pool's data size, as our daemon's config
	// writes it; the other two pools get the same table settings through
	// thinpool.Open: its default block size (our daemon's default),
	// skip_block_zeroing, error_if_no_space.
	poolDataSize = "3GiB"
	// poolMetaSize is the metadata size stack.WriteDaemonConfig gives our
	// daemon's pool.
	poolMetaSize = 64 << 20
	// baseImageSize is the ext4 device size of every layer, as
	// stack.WriteDaemonConfig gives our daemon (base_image_size).
	baseImageSize = "1GiB"
)

// env is the run: one registry, one versitygw, our daemon, one containerd
// with three snapshotters (devmapper, overlayfs, flyio), one long-lived
// client, the floor's pool and the two images.
type env struct {
	repo, scratch string
	cli           string // our binary, copied to the scratch tmpfs
	reg           *stack.Registry
	s3            *stack.S3
	daemon        *stack.Daemon
	ctrd          *stack.Proc
	ctrdSocket    string
	client        *client.Client
	floor         *thinpool.Pool
	images        []*benchImage
	warm          *benchImage // warmUp's image, never measured
	cleanups      []func() error
}

func (e *env) atEnd(f func() error) { e.cleanups = append(e.cleanups, f) }

// close undoes the set-up in reverse order and returns what failed.
func (e *env) close() error {
	var errs []error
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		errs = append(errs, e.cleanups[i]())
	}
	return errors.Join(errs...)
}

// versitygwBin asks scripts/install-versitygw.sh, which pins versitygw's
// version, where the binary is; the script only prints the path of a
// binary installed on the host before the VM (no network here).
func versitygwBin(ctx context.Context, repo string) (string, error) {
	out, err := stack.RunStdout(ctx, nil, "bash", filepath.Join(repo, "scripts/install-versitygw.sh"))
	if err != nil {
		return "", fmt.Errorf("versitygw (run scripts/install-versitygw.sh on the host first): %w", err)
	}
	return strings.TrimSpace(out), nil
}

// setup starts everything and generates and publishes the images.
func setup(ctx context.Context, specs []imageSpec, logf func(string, ...any)) (_ *env, err error) {
	repo, scratch, tools, err := stack.VMEnv()
	if err != nil {
		return nil, err
	}
	e := &env{repo: repo, scratch: filepath.Join(scratch, "pullbench")}
	defer func() {
		if err != nil {
			if cerr := e.close(); cerr != nil {
				logf("teardown after a failed set-up: %v", cerr)
			}
		}
	}()
	regBin, err := stack.Tool(e.repo, "registry", "github.com/distribution/distribution/v3", "registry", "registry")
	if err != nil {
		return nil, err
	}
	vgw, err := versitygwBin(ctx, e.repo)
	if err != nil {
		return nil, err
	}
	// The CLI and the daemon run a copy on tmpfs: an exec from the
	// repository's 9p share reads the binary again each time, and a
	// rebuild on the host must not change it under the run.
	if e.cli, err = stack.PrivateBinary(e.repo, e.scratch); err != nil {
		return nil, err
	}

	t := time.Now()
	c := newCorpus(1)
	s3src := filepath.Join(e.scratch, "s3src")
	var all []*benchImage
	for _, s := range append(specs, warmSpec) {
		img, err := writeImage(s, filepath.Join(e.scratch, "tars"), s3src, c)
		if err != nil {
			return nil, err
		}
		all = append(all, img)
	}
	e.images, e.warm = all[:len(specs)], all[len(specs)]
	logf("images generated in %s", time.Since(t).Round(time.Millisecond))

	t = time.Now()
	if e.reg, err = stack.StartRegistry(ctx, regBin, filepath.Join(e.scratch, "registry")); err != nil {
		return nil, err
	}
	e.atEnd(e.reg.Stop)
	for _, img := range all {
		repo := "pullbench/" + img.spec.name
		for _, l := range img.layers {
			if err := e.reg.PushBlob(ctx, repo, l.digest.String(), l.gzPath); err != nil {
				return nil, err
			}
		}
		cfgPath := filepath.Join(e.scratch, "tars", img.spec.name+"-config.json")
		if err := os.WriteFile(cfgPath, img.config, 0o644); err != nil {
			return nil, err
		}
		if err := e.reg.PushBlob(ctx, repo, digest.FromBytes(img.config).String(), cfgPath); err != nil {
			return nil, err
		}
		if err := e.reg.PushManifest(ctx, repo, "v1", "application/vnd.oci.image.manifest.v1+json", img.manifest); err != nil {
			return nil, err
		}
	}
	if e.s3, err = stack.StartS3(ctx, vgw, filepath.Join(e.scratch, "s3"), filepath.Join(e.scratch, "s3-log"), bucket, "", ""); err != nil {
		return nil, err
	}
	e.atEnd(e.s3.Stop)
	if _, err := e.s3.Seed(ctx, s3src); err != nil {
		return nil, err
	}
	logf("registry and versitygw serving the images after %s", time.Since(t).Round(time.Millisecond))

	t = time.Now()
	ctrdDir := filepath.Join(e.scratch, "containerd")
	e.ctrdSocket = filepath.Join(ctrdDir, "containerd.sock")
	var debug string
	if *flagProfile != "" {
		debug = stack.AnyLoopbackPort
	}
	// Every pull of ours starts from nothing: no tarball is kept once
	// its layer is unpacked.
	if e.daemon, err = stack.WriteDaemonConfig(e.cli, stack.DaemonOptions{
		Dir: filepath.Join(e.scratch, "flyio"), PoolName: ourPool, DataSize: poolDataSize,
		S3: e.s3, Containerd: e.ctrdSocket, Debug: debug, GzipCommand: *flagGzipCommand,
		ExtraTOML: "[pipeline]\ntarball_cache_size = \"0\"\n",
	}); err != nil {
		return nil, err
	}
	if err := e.daemon.Start(ctx); err != nil {
		return nil, err
	}
	e.atEnd(func() error {
		return errors.Join(e.daemon.Stop(), stack.DestroyPool(context.Background(), ourPool, filepath.Join(e.daemon.Root, "pool")))
	})
	dataSize, err := plugin.ParseSize(poolDataSize)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{anchorPool, floorPool} {
		dir := filepath.Join(e.scratch, name)
		p, err := thinpool.Open(ctx, thinpool.Config{Name: name, RootDir: dir, DataSize: conf.Size(dataSize), MetadataSize: poolMetaSize})
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", name, err)
		}
		e.atEnd(func() error { return stack.DestroyPool(context.Background(), name, dir) })
		if name == floorPool {
			e.floor = p
		} else {
			_ = p.Close() // containerd's devmapper snapshotter drives it
		}
	}
	if err := e.startContainerd(ctx, tools, ctrdDir); err != nil {
		return nil, err
	}
	logf("our daemon, containerd (devmapper, overlayfs, flyio) and the pools up after %s", time.Since(t).Round(time.Millisecond))
	return e, nil
}

// containerdConfig: version 4, CRI off, the built-in devmapper snapshotter
// on anchorPool with our base image size and file system, our daemon as
// proxy snapshotter flyio and proxy differ flyio-diff, and the three
// snapshotters in the transfer service's unpack list (what `ctr pull
// --snapshotter` needs): flyio's layers applied by flyio-diff, as
// contrib/containerd/config.toml.snippet sets it up, the others by
// containerd's own applier (walking, named so that containerd need not
// choose between the two differs).
func (e *env) containerdConfig(dir string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version = 4\nroot = %q\nstate = %q\ntemp = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "tmp"))
	b.WriteString(`disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs"]` + "\n")
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.server.v1.grpc']\naddress = %q\n", e.ctrdSocket)
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.server.v1.ttrpc']\naddress = %q\n", e.ctrdSocket+".ttrpc")
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.snapshotter.v1.devmapper']\npool_name = %q\nroot_path = %q\nbase_image_size = %q\nasync_remove = false\ndiscard_blocks = false\nfs_type = \"ext4\"\n",
		anchorPool, filepath.Join(dir, "devmapper"), baseImageSize)
	fmt.Fprintf(&b, "\n[proxy_plugins.flyio]\ntype = \"snapshot\"\naddress = %q\n", e.daemon.Socket)
	fmt.Fprintf(&b, "\n[proxy_plugins.flyio-diff]\ntype = \"diff\"\naddress = %q\n", e.daemon.Socket)
	for _, u := range [][2]string{{"devmapper", "walking"}, {"overlayfs", "walking"}, {"flyio", "flyio-diff"}} {
		fmt.Fprintf(&b, "\n[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]\nplatform = \"linux\"\nsnapshotter = %q\ndiffer = %q\n", u[0], u[1])
	}
	return b.String()
}

func (e *env) startContainerd(ctx context.Context, tools, dir string) error {
	var err error
	if e.ctrd, _, err = stack.RunContainerd(ctx, tools, dir, e.containerdConfig(dir), e.ctrdSocket, "warn"); err != nil {
		return err
	}
	e.atEnd(func() error { return e.ctrd.Stop(60 * time.Second) })
	if e.client, err = client.New(e.ctrdSocket, client.WithDefaultNamespace(stack.Namespace), client.WithTimeout(time.Minute)); err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", e.ctrdSocket, err)
	}
	e.atEnd(e.client.Close)
	return nil
}

func nsCtx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, stack.Namespace)
}

// runContainer runs /bin/cat markerPath in a container on ref with
// snapshotter sn and checks that it prints the image's marker: busybox
// from the lowest layer runs and reads the top layer's file. The container
// and its snapshot are gone from the snapshotter when it returns.
func (e *env) runContainer(ctx context.Context, img *benchImage, ref, sn string) (err error) {
	ctx = nsCtx(ctx)
	image, err := e.client.GetImage(ctx, ref)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	id := "pb-" + sn
	ctr, err := e.client.NewContainer(ctx, id, client.WithImage(image), client.WithSnapshotter(sn),
		client.WithNewSnapshot(id, image), client.WithNewSpec(oci.WithImageConfig(image), oci.WithProcessArgs("/bin/cat", markerPath)))
	if err != nil {
		return fmt.Errorf("container on %s (%s): %w", ref, sn, err)
	}
	defer func() {
		// containerd removes the snapshot from its records at once and
		// from the snapshotter at its next garbage collection: run one.
		err = errors.Join(err, ctr.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup), e.collectGarbage(context.WithoutCancel(ctx)))
	}()
	var stdout, stderr bytes.Buffer
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr), cio.WithFIFODir(filepath.Join(e.scratch, "fifo"))))
	if err != nil {
		return fmt.Errorf("task on %s (%s): %w", ref, sn, err)
	}
	exitC, err := task.Wait(ctx)
	if err == nil {
		err = task.Start(ctx)
	}
	if err != nil {
		_, _ = task.Delete(context.WithoutCancel(ctx), client.WithProcessKill)
		return fmt.Errorf("start task on %s (%s): %w", ref, sn, err)
	}
	code, _, err := (<-exitC).Result()
	// The task's output is all copied once Delete returns.
	if _, derr := task.Delete(ctx); err == nil && derr != nil {
		err = fmt.Errorf("delete task on %s (%s): %w", ref, sn, derr)
	}
	if err != nil {
		return err
	}
	want := markerContent(img.spec.name, len(img.layers))
	if code != 0 || stdout.String() != want {
		return fmt.Errorf("container on %s (%s): exit %d, printed %q (stderr %q), want exit 0 and %q", ref, sn, code, stdout.String(), stderr.String(), want)
	}
	return nil
}

// collectGarbage runs containerd's garbage collection to completion:
// deleting a lease synchronously waits for a full collection, which
// removes from the snapshotters what nothing references any more.
func (e *env) collectGarbage(ctx context.Context) error {
	return stack.CollectGarbage(nsCtx(ctx), e.client)
}

// removeImage deletes ref from containerd with a synchronous garbage
// collection (its content and, through the snapshotter, its snapshots go).
func (e *env) removeImage(ctx context.Context, ref string) error {
	if err := e.client.ImageService().Delete(nsCtx(ctx), ref, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete image %s: %w", ref, err)
	}
	return nil
}

// checkCold waits until snapshotter sn holds no snapshot, then checks that
// containerd's content store holds none of img's layers: the next pull of
// img starts from nothing.
func (e *env) checkCold(ctx context.Context, img *benchImage, sn string) error {
	ctx = nsCtx(ctx)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var keys []string
		err := e.client.SnapshotService(sn).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			keys = append(keys, info.Name)
			return nil
		})
		if err != nil {
			return fmt.Errorf("walk %s: %w", sn, err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still holds snapshots %v after the image's removal", sn, keys)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, l := range img.layers {
		if _, err := e.client.ContentStore().Info(ctx, l.digest); err == nil {
			return fmt.Errorf("containerd's content store still holds layer %s of %s", l.digest, img.spec.name)
		} else if !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}
