// Command flyio-demo is the part of the README's demo (scripts/demo.sh)
// that needs real device-mapper: it runs inside the VM harness (or directly
// on a host with device-mapper). It starts versitygw and uploads the layer
// tarballs of integration/e2e/mkimage.sh, starts our snapshotter on a fresh
// loop-file pool and containerd with our proxy plugin, pulls every image
// family from S3, runs a container from two of them with
// `ctr run --snapshotter flyio`, prints what they printed, removes the images
// (containerd's garbage collection removes their snapshots through us),
// stops everything, removes the pool, and copies each piece's log to
// --logs.
//
//	flyio-demo --images DIR --versitygw BIN --logs DIR [--scratch DIR]
//	flyio-demo seed --images DIR --versitygw BIN
//
// The seed form runs on the host first (integration/e2e/prepare.sh): it
// makes the versitygw store (bucket, public-read policy, uploaded layers,
// generated keys) once per image, where uploading is fast; the VM then
// serves that store.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

var start = time.Now()

func say(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

// show prints a command line and its output, indented.
func show(cmdline, out string) {
	fmt.Printf("  $ %s\n", cmdline)
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		fmt.Printf("    %s\n", l)
	}
}

func main() {
	seed := len(os.Args) > 1 && os.Args[1] == "seed"
	if seed {
		os.Args = append(os.Args[:1], os.Args[2:]...)
	}
	images := flag.String("images", "", "folder holding images/<family>/<n>.tar (integration/e2e/mkimage.sh's output)")
	vgw := flag.String("versitygw", "", "versitygw binary (scripts/install-versitygw.sh)")
	logs := flag.String("logs", "", "folder the logs are copied to at the end")
	scratch := flag.String("scratch", os.Getenv("VM_SCRATCH"), "state folder (loop files, S3 objects, containerd); default $VM_SCRATCH")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if seed && *images != "" && *vgw != "" {
		up, err := stack.SeedStore(ctx, *vgw, stack.StoreDir(*images), stack.Bucket, *images)
		if err != nil {
			fmt.Fprintf(os.Stderr, "flyio-demo seed: %v\n", err)
			os.Exit(1)
		}
		for _, u := range up {
			fmt.Fprintf(os.Stderr, "uploaded s3://%s/%s (%d bytes)\n", stack.Bucket, u.Key, u.Size)
		}
		fmt.Println(stack.StoreDir(*images))
		return
	}
	if *images == "" || *vgw == "" || *logs == "" || *scratch == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := demo(ctx, *images, *vgw, *logs, *scratch); err != nil {
		fmt.Fprintf(os.Stderr, "flyio-demo: %v\n", err)
		os.Exit(1)
	}
}

func demo(ctx context.Context, images, vgw, logs, scratch string) (err error) {
	repo, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(scratch, "flyio-demo-")
	if err != nil {
		return fmt.Errorf("scratch folder: %w", err)
	}
	const pool = "flyio-demo-pool"
	e, err := stack.Up(ctx, stack.Options{
		Repo: repo, Scratch: dir, ImageDir: images, Versitygw: vgw, PoolName: pool,
		Log: say,
	})
	// Whatever happens, stop everything, remove the pool and keep the logs.
	defer func() {
		if e != nil {
			if derr := e.Down(); derr != nil {
				say("stopping: %v", derr)
			}
		}
		if perr := stack.DestroyPool(context.Background(), pool, filepath.Join(dir, "flyio", "pool")); perr != nil {
			say("removing the pool: %v", perr)
		}
		copyLogs(dir, logs)
		if rerr := os.RemoveAll(dir); rerr != nil {
			say("removing %s: %v", dir, rerr)
		}
	}()
	if err != nil {
		return err
	}

	for _, f := range stack.Families {
		t := time.Now()
		out, err := e.Pull(ctx, f)
		if err != nil {
			return fmt.Errorf("pull %s: %w", f, err)
		}
		say("pulled %s in %s", f, time.Since(t).Round(time.Millisecond))
		show("containerd-flyio-snapshotter pull --name "+stack.Ref(f)+" "+stack.S3URL(f), out)
	}
	out, err := e.Daemon.CLI(ctx, []string{"ls", "chains"})
	if err != nil {
		return err
	}
	say("chains unpacked (identical layers of the three images once):")
	show("containerd-flyio-snapshotter ls chains", out)

	for _, c := range []struct {
		family string
		argv   []string
	}{
		{"debian", []string{"/usr/local/bin/flyio-hello"}},
		{"debian-rootfs", []string{"sh", "-c", "head -n 1 /etc/os-release; cat /etc/flyio-release; test -e /etc/motd || echo '/etc/motd: deleted by rootfs/etc/.wh.motd'"}},
	} {
		if ok, err := e.Unpacked(ctx, c.family); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("containerd does not see %s as unpacked in flyio after pull: its chain was not adopted", c.family)
		}
		t := time.Now()
		out, err := e.RunContainer(ctx, c.family, "demo-"+c.family, c.argv...)
		if err != nil {
			return fmt.Errorf("run a container from %s: %w", c.family, err)
		}
		say("container from %s ran in %s; it printed:", c.family, time.Since(t).Round(time.Millisecond))
		show("ctr run --rm --snapshotter flyio "+stack.Ref(c.family)+" demo-"+c.family+" "+strings.Join(c.argv, " "), out)
	}

	out, err = e.Daemon.CLI(ctx, []string{"pool", "status"})
	if err != nil {
		return err
	}
	show("containerd-flyio-snapshotter pool status", out)
	m, err := e.Metrics(ctx, "flyio_snapshotter_pool_data", "flyio_snapshotter_devices",
		`flyio_snapshotter_operation_duration_seconds_count{method="Prepare"`, `flyio_snapshotter_operation_duration_seconds_count{method="Commit"`,
		"flyio_snapshotter_pipeline_runs", "flyio_snapshotter_pipeline_unpacked", "flyio_snapshotter_pipeline_blob_bytes")
	if err != nil {
		return err
	}
	show("curl -s http://"+e.Daemon.Metrics+"/metrics | grep ...", strings.Join(m, "\n"))

	out, err = e.RemoveImages(ctx)
	if err != nil {
		return err
	}
	say("images removed, containerd's garbage collection done")
	show("ctr image rm --sync ...", out)
	out, err = e.Daemon.CLI(ctx, []string{"ls", "chains"})
	if err != nil {
		return err
	}
	show("containerd-flyio-snapshotter ls chains", out)
	devs, err := stack.DMDevices(ctx, pool)
	if err != nil {
		return err
	}
	say("device-mapper devices of ours left: %v (the pool itself is removed next)", devs)
	return nil
}

// copyLogs copies each *.log under dir into logs and prints where.
func copyLogs(dir, logs string) {
	if err := os.MkdirAll(logs, 0o755); err != nil {
		say("logs: %v", err)
		return
	}
	var found []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(path, ".log") {
			found = append(found, path)
		}
		return nil
	})
	sort.Strings(found)
	say("logs:")
	for _, p := range found {
		dst := filepath.Join(logs, filepath.Base(p))
		if err := copyFile(p, dst); err != nil {
			say("  %s: %v", p, err)
			continue
		}
		fmt.Printf("  %s\n", dst)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
