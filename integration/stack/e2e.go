package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Bucket is the local S3 bucket of the end-to-end run.
const Bucket = "flyio-images"

// Families are the image families integration/e2e/mkimage.sh cuts, in the
// order they are pulled. debian and debian-dev share layers 1 and 2 byte
// for byte; debian-rootfs keeps everything under rootfs/.
var Families = []string{"debian", "debian-dev", "debian-rootfs"}

// Ref is the containerd image name a family is pulled under.
func Ref(family string) string { return "flyio.local/e2e/" + family + ":latest" }

// S3URL is the s3:// prefix of a family's layers.
func S3URL(family string) string { return "s3://" + Bucket + "/images/" + family + "/" }

// Options say where the run finds its inputs and keeps its state.
type Options struct {
	Repo      string // repository root (bin/, .cache/tools)
	Scratch   string // state folder: S3 objects, pool loop files, containerd
	ImageDir  string // mkimage.sh's output (holding images/<family>/<n>.tar)
	Versitygw string // versitygw binary
	// The S3 store is StoreDir(ImageDir), seeded on the host by SeedStore.
	PoolName string // dm name of our pool
	Log      func(format string, args ...any)
}

// E2E is the running stack.
type E2E struct {
	Opts   Options
	S3     *S3
	Daemon *Daemon
	Ctrd   *Containerd
}

// StoreDir is the versitygw store SeedStore makes for an image folder.
func StoreDir(imageDir string) string { return filepath.Join(imageDir, "s3") }

func (o Options) logf(format string, args ...any) {
	if o.Log != nil {
		o.Log(format, args...)
	}
}

// Up starts versitygw and seeds it, our daemon on a fresh loop-file pool
// under Scratch, and containerd with the daemon as proxy plugin. On error
// everything it started is stopped again.
func Up(ctx context.Context, opts Options) (_ *E2E, err error) {
	e := &E2E{Opts: opts}
	defer func() {
		if err != nil {
			e.Down()
		}
	}()
	bin := filepath.Join(opts.Repo, "bin", "containerd-flyio-snapshotter")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("our binary (make build): %w", err)
	}
	tools, err := ToolsDir(opts.Repo)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	if e.S3, err = OpenStore(ctx, opts.Versitygw, StoreDir(opts.ImageDir), filepath.Join(opts.Scratch, "s3"), Bucket); err != nil {
		return nil, err
	}
	opts.logf("versitygw serving bucket %s at %s (SigV4; public-read policy: anonymous list/GET ok, anonymous and badly signed PUT refused) after %s",
		Bucket, e.S3.Endpoint, time.Since(t).Round(time.Millisecond))

	ctrdDir := filepath.Join(opts.Scratch, "containerd")
	if e.Daemon, err = WriteDaemonConfig(bin, DaemonOptions{
		Dir: filepath.Join(opts.Scratch, "flyio"), PoolName: opts.PoolName, DataSize: "3GiB",
		S3: e.S3, Containerd: filepath.Join(ctrdDir, "containerd.sock"),
		Metrics: AnyLoopbackPort,
	}); err != nil {
		return nil, err
	}
	t = time.Now()
	if err = e.Daemon.Start(ctx); err != nil {
		return nil, err
	}
	opts.logf("containerd-flyio-snapshotter serving on %s (pool %s, loop files in %s) after %s",
		e.Daemon.Socket, opts.PoolName, filepath.Join(e.Daemon.Root, "pool"), time.Since(t).Round(time.Millisecond))
	t = time.Now()
	if e.Ctrd, err = StartContainerd(ctx, tools, ctrdDir, e.Daemon.Socket); err != nil {
		return nil, err
	}
	opts.logf("containerd serving on %s with proxy plugin flyio after %s", e.Ctrd.Socket, time.Since(t).Round(time.Millisecond))
	return e, nil
}

// Pull runs `containerd-flyio-snapshotter pull --name REF s3://...` for a
// family and returns the CLI's output.
func (e *E2E) Pull(ctx context.Context, family string) (string, error) {
	return e.Daemon.CLI(ctx, []string{"pull"}, "--name", Ref(family), S3URL(family))
}

// RunContainer runs `ctr run --rm --snapshotter flyio REF ID ARGS...` and
// returns what the container printed.
func (e *E2E) RunContainer(ctx context.Context, family, id string, args ...string) (string, error) {
	argv := append([]string{"run", "--rm", "--snapshotter", "flyio", Ref(family), id}, args...)
	return e.Ctrd.Ctr(ctx, argv...)
}

// RemoveImages removes every family's image from containerd and waits for
// containerd's garbage collection (`ctr image rm --sync`), which removes
// the image's snapshots through our proxy plugin.
func (e *E2E) RemoveImages(ctx context.Context) (string, error) {
	args := []string{"image", "rm", "--sync"}
	for _, f := range Families {
		args = append(args, Ref(f))
	}
	return e.Ctrd.Ctr(ctx, args...)
}

// Metrics returns the lines of the daemon's /metrics page that start
// with one of prefixes (all of them when none is given): MetricLines.
func (e *E2E) Metrics(ctx context.Context, prefixes ...string) ([]string, error) {
	return MetricLines(ctx, e.Daemon.Metrics, prefixes...)
}

// Logs lists each piece's log file.
func (e *E2E) Logs() map[string]string {
	m := map[string]string{}
	if e.S3 != nil {
		m["versitygw"] = e.S3.Proc.LogPath
	}
	if e.Daemon != nil && e.Daemon.Proc != nil {
		m["snapshotter"] = e.Daemon.Proc.LogPath
	}
	if e.Ctrd != nil {
		m["containerd"] = e.Ctrd.Proc.LogPath
	}
	return m
}

// Down stops containerd, the daemon and versitygw (in that order) and
// returns what failed to stop cleanly. The pool's devices are left to
// DestroyPool.
func (e *E2E) Down() error {
	var errs []error
	if e.Ctrd != nil {
		errs = append(errs, e.Ctrd.Stop())
	}
	if e.Daemon != nil {
		errs = append(errs, e.Daemon.Stop())
	}
	if e.S3 != nil {
		errs = append(errs, e.S3.Stop())
	}
	return errors.Join(errs...)
}

// DMDevices lists the device-mapper devices whose name starts with prefix
// (our pool's name: the pool and its thin devices).
func DMDevices(ctx context.Context, prefix string) ([]string, error) {
	out, err := Run(ctx, nil, "dmsetup", "ls")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// DestroyPool removes every device-mapper device named after the pool (its
// thin devices first, then the pool) and detaches the loop devices backing
// files under poolDir: what the daemon leaves by design when it stops.
func DestroyPool(ctx context.Context, pool, poolDir string) error {
	names, err := DMDevices(ctx, pool)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if n != pool {
			if _, err := Run(ctx, nil, "dmsetup", "remove", "--retry", n); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(names) > 0 {
		if _, err := Run(ctx, nil, "dmsetup", "remove", "--retry", pool); err != nil {
			errs = append(errs, err)
		}
	}
	out, err := Run(ctx, nil, "losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE")
	if err == nil {
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && strings.HasPrefix(f[1], poolDir+"/") {
				if _, err := Run(ctx, nil, "losetup", "-d", f[0]); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}
