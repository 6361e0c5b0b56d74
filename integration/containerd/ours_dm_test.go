//go:build dm

package containerdtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// ourDaemon is `containerd-flyio-snapshotter serve` on its own loop-file
// pool under dir.
type ourDaemon struct {
	bin, dir, config, socket, pool string
	p                              *stack.Proc
}

// startOurDaemon writes a config for a pool named pool under dir and starts
// the daemon; it returns once the snapshots socket accepts connections.
func startOurDaemon(ctx context.Context, repo, dir, pool string) (*ourDaemon, error) {
	d := &ourDaemon{
		bin:    filepath.Join(repo, "bin/containerd-flyio-snapshotter"),
		dir:    dir,
		config: filepath.Join(dir, "config.toml"),
		socket: filepath.Join(dir, "flyio.sock"),
		pool:   pool,
	}
	if _, err := os.Stat(d.bin); err != nil {
		return nil, fmt.Errorf("our daemon: %w (run `make build` on the host first)", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("our daemon dir: %w", err)
	}
	// Every daemon of the run gets its own control socket: the default
	// path is shared by all of them and only one may serve it.
	cfg := fmt.Sprintf(`[daemon]
socket = %q
control_socket = %q
root_dir = %q
log_level = "info"

[metadata]
path = %q

[pool]
name = %q
root_dir = %q
data_size = %d
metadata_size = %d
block_size = %d
base_image_size = %d
fs_type = "ext4"
async_remove = true
`, d.socket, filepath.Join(dir, "control.sock"), dir, filepath.Join(dir, "metadata.db"), pool, filepath.Join(dir, "pool"),
		poolDataSize, poolMetaSize, poolBlockSectors*512, baseImageSize)
	if err := os.WriteFile(d.config, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("our daemon config: %w", err)
	}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// start starts (or restarts) the daemon and waits for its socket.
func (d *ourDaemon) start(ctx context.Context) error {
	var err error
	d.p, err = stack.StartServing(ctx, "containerd-flyio-snapshotter", filepath.Join(d.dir, "daemon.log"), os.Environ(), "unix", d.socket,
		d.bin, "serve", "--config", d.config)
	return err
}

// stopAndLog stops the daemon with SIGTERM and reports an unclean stop,
// then tears down its pool (its devices, the pool, the loop devices): the
// daemon keeps its pool across restarts by design, a test run must not.
func (d *ourDaemon) stopAndLog() {
	if d.p != nil && !d.p.Exited() {
		if err := d.p.Stop(30 * time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "our daemon did not stop cleanly: %v\nlog tail:\n%s\n", err, d.p.LogTail(30))
		}
	}
	ctx := context.Background()
	var files []string
	for _, f := range []string{"data", "metadata"} {
		files = append(files, filepath.Join(d.dir, "pool", f))
	}
	removePool(ctx, d.pool, files)
}

// thinIDs lists every thin device id in the daemon's pool, read from the
// pool's metadata through our thinpool package (the daemon keeps running;
// call it while the daemon is idle).
func (d *ourDaemon) thinIDs(ctx context.Context) ([]uint32, error) {
	p, err := thinpool.Open(ctx, thinpool.Config{Name: d.pool, RootDir: filepath.Join(d.dir, "pool")})
	if err != nil {
		return nil, fmt.Errorf("open our pool %s to list its devices: %w", d.pool, err)
	}
	defer p.Close()
	ids, err := p.ThinIDs(ctx)
	if err != nil {
		return nil, fmt.Errorf("list thin devices of our pool %s: %w", d.pool, err)
	}
	slices.Sort(ids)
	return ids, nil
}

// waitThinIDs polls until the pool holds at most limit thin devices (removal
// is asynchronous: garbage collection's Cleanup reclaims the devices) and
// returns them, or fails after within.
func (d *ourDaemon) waitThinIDs(ctx context.Context, limit int, within time.Duration) ([]uint32, error) {
	deadline := time.Now().Add(within)
	for {
		ids, err := d.thinIDs(ctx)
		if err != nil {
			return nil, err
		}
		if len(ids) <= limit {
			return ids, nil
		}
		if time.Now().After(deadline) {
			return ids, fmt.Errorf("our pool %s still holds thin devices %v %s after removal; want at most %d (the base device)", d.pool, ids, within, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
