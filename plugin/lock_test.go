package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// TestLockRootSingleInstance: while one owner holds the root's lock a
// second is refused at once, naming the lock file and the holder's pid,
// and the lock file is left as it was; once released the next owner gets
// it.
func TestLockRootSingleInstance(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	first, err := lockRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, LockFileName)
	before, err := os.ReadFile(path)
	if err != nil || string(before) != strconv.Itoa(os.Getpid())+"\n" {
		t.Fatalf("lock file holds %q (%v), want our pid", before, err)
	}
	second, err := lockRoot(root)
	if !errors.Is(err, ErrLocked) || second != nil {
		t.Fatalf("second lock: %v, want %v", err, ErrLocked)
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("refusal %q does not name %s and the holder's pid", msg, path)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Errorf("the refused owner changed the lock file: %q", after)
	}
	first.Close()
	third, err := lockRoot(root)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	third.Close()
}

// TestLockDaemonSharedDatabase: two daemons on two roots that name one
// database outside both are refused like two on one root, naming the
// database's lock; a database inside its root takes the root's lock only
// (nothing more beside it), and two roots with their own databases do
// not stand in each other's way.
func TestLockDaemonSharedDatabase(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared", "metadata.db")
	if err := os.MkdirAll(filepath.Dir(shared), 0o700); err != nil {
		t.Fatal(err)
	}
	first, err := lockDaemon(filepath.Join(dir, "a"), shared)
	if err != nil {
		t.Fatal(err)
	}
	second, err := lockDaemon(filepath.Join(dir, "b"), shared)
	if !errors.Is(err, ErrLocked) || second != nil || !strings.Contains(err.Error(), shared+".lock") {
		t.Fatalf("a second daemon on database %s from another root: %v, want %v naming %s.lock", shared, err, ErrLocked, shared)
	}
	// The refused daemon let go of its root's lock too.
	b, err := lockRoot(filepath.Join(dir, "b"))
	if err != nil {
		t.Fatalf("root b after the refusal: %v", err)
	}
	b.Close()
	for _, l := range first {
		l.Close()
	}

	own := filepath.Join(dir, "c", "metadata.db")
	c, err := lockDaemon(filepath.Join(dir, "c"), own)
	if err != nil || len(c) != 1 {
		t.Fatalf("a daemon whose database is in its root: %d locks, %v; want the root's only", len(c), err)
	}
	if _, err := os.Stat(own + ".lock"); !os.IsNotExist(err) {
		t.Errorf("a lock beside a database inside its root: %v", err)
	}
	d, err := lockDaemon(filepath.Join(dir, "d"), filepath.Join(dir, "d", "metadata.db"))
	if err != nil {
		t.Fatalf("a daemon on another root and database: %v", err)
	}
	for _, l := range append(c, d...) {
		l.Close()
	}
}

// hostDaemonConfig is a daemon's configuration with every path under
// dir/name and a loop-file pool named name. Its database path is made a
// directory: a daemon that passes its locks stops there, at the database,
// before it reaches device-mapper, which these tests on the host must
// never touch.
func hostDaemonConfig(t *testing.T, dir, name string) *Config {
	t.Helper()
	root := filepath.Join(dir, name)
	cfg := DefaultConfig()
	cfg.Daemon.RootDir = root
	cfg.Daemon.Socket = filepath.Join(root, "run", "snap.sock")
	cfg.Daemon.ControlSocket = ""
	cfg.Metadata.Path = filepath.Join(root, "metadata.db")
	cfg.Pool.RootDir = filepath.Join(root, "pool")
	cfg.Pipeline.DownloadDir = filepath.Join(root, "images")
	cfg.Pool.Name = name
	if err := os.MkdirAll(cfg.Metadata.Path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// holdDaemonLocks takes what Open takes before it opens anything for cfg,
// as a running daemon holds it, until the test ends.
func holdDaemonLocks(t *testing.T, cfg *Config) {
	t.Helper()
	held, err := lockDaemon(cfg.Daemon.RootDir, cfg.Metadata.Path)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := lockPool(cfg.ThinpoolConfig())
	held = append(held, pl...)
	t.Cleanup(func() {
		for _, f := range held {
			f.Close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// mknodBlock makes a block device node of major:minor at path, which
// stat reads without the device being there; it skips the test where
// nodes cannot be made.
func mknodBlock(t *testing.T, path string, major, minor uint32) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(major, minor))); err != nil {
		t.Skipf("mknod %s: %v", path, err)
	}
}

// TestOpenRefusesSharedPool: a daemon whose root_dir and database are its
// own, but whose pool is a running daemon's (its loop files, its block
// devices, under whatever node names, or its device-mapper name), is
// refused at once, naming the lock and the holder's pid, before it opens
// its database; a daemon on another pool is not.
func TestOpenRefusesSharedPool(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	poolLockDir = filepath.Join(dir, "run-lock")
	t.Cleanup(func() { poolLockDir = PoolLockDir })
	devs := filepath.Join(dir, "dev")
	if err := os.Mkdir(devs, 0o700); err != nil {
		t.Fatal(err)
	}
	// 7 is the loop driver's major; nothing opens these nodes.
	mknodBlock(t, filepath.Join(devs, "data"), 7, 240)
	mknodBlock(t, filepath.Join(devs, "meta"), 7, 241)
	mknodBlock(t, filepath.Join(devs, "data-alias"), 7, 240)
	mknodBlock(t, filepath.Join(devs, "meta-other"), 7, 242)

	loop := hostDaemonConfig(t, dir, "loop")
	holdDaemonLocks(t, loop)
	block := hostDaemonConfig(t, dir, "block")
	block.Pool.DataDevice = filepath.Join(devs, "data")
	block.Pool.MetadataDevice = filepath.Join(devs, "meta")
	block.Pool.DataSize, block.Pool.MetadataSize = 0, 0
	holdDaemonLocks(t, block)
	pid := "pid " + strconv.Itoa(os.Getpid())

	for _, tc := range []struct {
		name  string
		edit  func(c *Config)
		names string // the lock the refusal names; "" when not refused
	}{
		{"the loop files of another pool", func(c *Config) { c.Pool.RootDir = loop.Pool.RootDir },
			filepath.Join(loop.Pool.RootDir, thinpool.DataFileName+".lock")},
		{"the name of another pool", func(c *Config) { c.Pool.Name = loop.Pool.Name },
			filepath.Join(poolLockDir, "pool-loop.lock")},
		{"the data device of another pool by another node", func(c *Config) {
			c.Pool.DataDevice = filepath.Join(devs, "data-alias")
			c.Pool.MetadataDevice = filepath.Join(devs, "meta-other")
		}, filepath.Join(poolLockDir, "dev-7:240.lock")},
		{"another pool", func(c *Config) {}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := hostDaemonConfig(t, dir, strings.ReplaceAll(tc.name, " ", "-"))
			tc.edit(cfg)
			if cfg.Pool.DataDevice != "" {
				cfg.Pool.DataSize, cfg.Pool.MetadataSize = 0, 0
			}
			svc, err := Open(ctx, cfg)
			if svc != nil {
				svc.Close()
				t.Fatal("opened a service on the host")
			}
			if tc.names == "" {
				if errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "metadata database") {
					t.Fatalf("a daemon on a pool of its own: %v, want it past its locks, stopped at its database", err)
				}
				return
			}
			if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), tc.names) || !strings.Contains(err.Error(), pid) {
				t.Fatalf("a second daemon on %s: %v, want %v naming %s and %s", tc.name, err, ErrLocked, tc.names, pid)
			}
			// The refused daemon let go of its own root's lock.
			rl, err := lockRoot(cfg.Daemon.RootDir)
			if err != nil {
				t.Fatalf("root after the refusal: %v", err)
			}
			rl.Close()
		})
	}
}

// TestLockPoolRefusesOpenLockDir: the host-wide lock directory is refused
// when another user may write it, where a planted link or a file held
// locked would make the lock a lie, and taken again once it is the
// daemon's own.
func TestLockPoolRefusesOpenLockDir(t *testing.T) {
	dir := t.TempDir()
	poolLockDir = filepath.Join(dir, "run-lock")
	t.Cleanup(func() { poolLockDir = PoolLockDir })
	if err := os.Mkdir(poolLockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(poolLockDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	cfg := hostDaemonConfig(t, dir, "a").ThinpoolConfig()
	if held, err := lockPool(cfg); err == nil || !strings.Contains(err.Error(), poolLockDir) {
		for _, f := range held {
			f.Close()
		}
		t.Fatalf("lock in a directory every user writes: %v, want a refusal naming %s", err, poolLockDir)
	}
	if err := os.Chmod(poolLockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	held, err := lockPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range held {
		f.Close()
	}
}
