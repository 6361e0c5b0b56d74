package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/flock"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// LockFileName is the file in daemon.root_dir whose lock (flock) the
// daemon owning that root holds for its whole life; it holds the owner's
// pid.
const LockFileName = "daemon.lock"

// ErrLocked is matched by Open's error when another live process holds
// the lock of daemon.root_dir, of the database, or of the pool (lockPool).
var ErrLocked = errors.New("another daemon is running on this root, database or pool")

// lockDaemon takes the locks of a daemon on root whose database is db:
// root's (lockRoot) and, when db is not in root, db's own (the file
// db + ".lock" beside it). Two daemons on two roots must not share a
// database either: each would reconcile the other's records against its
// own pool. The locks go with the returned files, and with the process.
func lockDaemon(root, db string) ([]*os.File, error) {
	rl, err := lockRoot(root)
	if err != nil {
		return nil, err
	}
	held := heldLocks{rl}
	if filepath.Dir(filepath.Clean(db)) == filepath.Clean(root) {
		return held, nil
	}
	if err := held.take(db + ".lock"); err != nil {
		held.release()
		return nil, err
	}
	return held, nil
}

// LockDatabase takes, at once, the locks a daemon on the database at db
// holds for its whole life (lockDaemon): its root's, when db lies in a
// root (LockFileName beside it), and db's own (db + ".lock"). Only lock
// files that exist are taken, so none is made beside a database no daemon
// ran on. Each records this process's pid, as a daemon's does, so that a
// daemon starting meanwhile names it. A lock held by another process is
// an error matching ErrLocked and naming the holder. release drops them.
func LockDatabase(db string) (release func(), err error) {
	var held heldLocks
	for _, p := range []string{filepath.Join(filepath.Dir(db), LockFileName), db + ".lock"} {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := held.take(p); err != nil {
			held.release()
			return nil, err
		}
	}
	return held.release, nil
}

// heldLocks are the lock files a caller takes one after another
// (lockPath), so that the refusal of one drops those taken before it.
type heldLocks []*os.File

// take takes the lock of the file at path (lockPath) and keeps it in h.
func (h *heldLocks) take(path string) error {
	f, err := lockPath(path)
	if err != nil {
		return err
	}
	*h = append(*h, f)
	return nil
}

// release drops every lock in h: closing a file drops its lock.
func (h heldLocks) release() {
	for _, f := range h {
		f.Close()
	}
}

// lockRoot takes the exclusive lock of root (created 0700 if missing) at
// once or fails naming the lock file and the holder's pid. The lock goes
// with the returned file, and with the process.
func lockRoot(root string) (*os.File, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("lock %s: %w", root, err)
	}
	return lockPath(filepath.Join(root, LockFileName))
}

// lockPath takes the exclusive lock (flock) of the file at path, made if
// missing, at once or fails naming it and the holder's pid, and writes
// the process's pid into it.
func lockPath(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := flock.TryLock(f); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "unknown pid"
			if b, rerr := os.ReadFile(path); rerr == nil && strings.TrimSpace(string(b)) != "" {
				holder = "pid " + strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("lock %s is held by %s: %w", path, holder, ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: record pid: %w", path, err)
	}
	return f, nil
}

// PoolLockDir is the host-wide directory of the pool locks that no
// daemon's own directories can hold: the pool's device-mapper name
// (pool-<name>.lock) and the number of each configured block device
// (dev-<major>:<minor>.lock). Both name things the kernel shares among
// every process of the host, so their locks must be found by every daemon
// whatever its root_dir; /run/lock is where the host keeps the locks of
// shared resources, and as a tmpfs it is emptied at boot, as the kernel's
// device-mapper names are.
const PoolLockDir = "/run/lock/containerd-flyio-snapshotter"

// poolLockDir is PoolLockDir; tests put it elsewhere.
var poolLockDir = PoolLockDir

// lockPool takes the locks of the pool pool describes, which a daemon
// holds for its whole life beside its root's, so that two daemons never
// run one pool: the second would adopt the first's live pool and reconcile
// it against its own database, deleting the first's devices as unknown.
// A pool is keyed by its device-mapper name, and by its backing stores:
// the files data and metadata of a loop-file pool (the lock files beside
// them, <file>.lock, after the file's symbolic links), or the configured
// block devices (by device number, in PoolLockDir: every node of a device
// names one lock, and the device itself is never opened, let alone
// written), and the file a configured loop device is attached to, as a
// loop-file pool locks it. Each lock is taken at once or refused as lockPath refuses,
// naming it and the holder's pid; on refusal none is kept.
func lockPool(pool thinpool.Config) (_ []*os.File, err error) {
	var held heldLocks
	defer func() {
		if err != nil {
			held.release()
		}
	}()
	take := func(path string) error {
		if err := held.take(path); err != nil {
			return fmt.Errorf("pool %s: %w", pool.Name, err)
		}
		return nil
	}
	if err := makeLockDir(poolLockDir); err != nil {
		return nil, fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	if err := take(filepath.Join(poolLockDir, "pool-"+pool.Name+".lock")); err != nil {
		return nil, err
	}
	if pool.DataDevice != "" {
		for _, dev := range []string{pool.DataDevice, pool.MetadataDevice} {
			var st unix.Stat_t
			if err := unix.Stat(dev, &st); err != nil {
				return nil, fmt.Errorf("pool %s: lock device %s: %w", pool.Name, dev, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFBLK {
				return nil, fmt.Errorf("pool %s: lock device %s: not a block device", pool.Name, dev)
			}
			name := fmt.Sprintf("dev-%d:%d.lock", unix.Major(st.Rdev), unix.Minor(st.Rdev))
			if err := take(filepath.Join(poolLockDir, name)); err != nil {
				return nil, err
			}
			// A loop device is its backing file, which a loop-file pool
			// locks beside it: a node set up by hand once may be
			// attached to another pool's file after a reboot.
			file, err := loopBackingFile(st.Rdev)
			if err != nil {
				return nil, fmt.Errorf("pool %s: lock device %s: %w", pool.Name, dev, err)
			}
			if file != "" {
				if err := take(file + ".lock"); err != nil {
					return nil, err
				}
			}
		}
		return held, nil
	}
	if err := os.MkdirAll(pool.RootDir, 0o700); err != nil {
		return nil, fmt.Errorf("pool %s: lock %s: %w", pool.Name, pool.RootDir, err)
	}
	for _, name := range []string{thinpool.DataFileName, thinpool.MetadataFileName} {
		file := filepath.Join(pool.RootDir, name)
		// A file reached through a link is locked beside the file itself,
		// where a daemon naming it directly looks.
		if real, err := filepath.EvalSymlinks(file); err == nil {
			file = real
		}
		if err := take(file + ".lock"); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// loopBackingFile is the file the loop device rdev is attached to, after
// its symbolic links as a loop-file pool resolves its own, or "" when
// rdev is not an attached loop device or its file was deleted (no pool
// can name it then).
func loopBackingFile(rdev uint64) (string, error) {
	sys := fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(rdev), unix.Minor(rdev))
	b, err := os.ReadFile(sys)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the loop device's backing file: %w", err)
	}
	file := strings.TrimSuffix(string(b), "\n")
	if strings.HasSuffix(file, " (deleted)") || !filepath.IsAbs(file) {
		return "", nil
	}
	if real, err := filepath.EvalSymlinks(file); err == nil {
		file = real
	}
	return file, nil
}

// makeLockDir makes dir (0700; its missing parents 0755, as the host
// makes /run/lock) unless it is there, and refuses it unless it is a
// directory of this process's user that no other user may write: /run/lock
// is writable by every user on many hosts, and a lock file another user
// may replace (by a link to a file the daemon would then truncate, or by
// a file of their own that they hold locked) is no lock.
func makeLockDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("make lock directory %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make lock directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("lock directory %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return fmt.Errorf("lock directory %s is not a directory of uid %d that only it may write (uid %d, mode %#o): remove it, the daemon makes it anew",
			dir, os.Geteuid(), st.Uid, st.Mode&0o7777)
	}
	return nil
}
