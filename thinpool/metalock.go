package thinpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/flock"
)

// MetadataSnapLockFileName is the file under Config.RootDir (or, for a
// pool without a root directory, "<pool name>.metadata-snap.lock" under
// /dev/mapper/.thinpool) whose flock ThinIDs holds, in every process,
// from reserving the pool's metadata snapshot to releasing it. The kernel
// holds one metadata snapshot per pool whoever reserved it, so the lock is
// what tells a snapshot a live reader holds from one a dead reader left.
const MetadataSnapLockFileName = "metadata-snap.lock"

// metaSnapLockPoll is how often lockMetaSnap retries while another process
// holds the lock: flock itself cannot be given a context.
const metaSnapLockPoll = 20 * time.Millisecond

// metaSnapLockPath is the lock file of the pool's metadata snapshot. Every
// process opening the pool from the same configuration names the same file.
func (p *Pool) metaSnapLockPath() string {
	if p.cfg.RootDir != "" {
		return filepath.Join(p.cfg.RootDir, MetadataSnapLockFileName)
	}
	return filepath.Join(MapperDir, ".thinpool", p.name+"."+MetadataSnapLockFileName)
}

// lockMetaSnap takes the host-wide exclusive lock of the pool's metadata
// snapshot, waiting while another open file description (another process,
// or another Pool of the same pool) holds it, until ctx is done. The lock
// is released by calling unlock, or when the process dies.
func (p *Pool) lockMetaSnap(ctx context.Context) (unlock func(), err error) {
	path := p.metaSnapLockPath()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lock metadata snapshot: make the directory of %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock metadata snapshot: %w", err)
	}
	waiting := false
	for {
		err := flock.TryLock(f)
		switch {
		case err == nil:
			return func() { f.Close() }, nil
		case !errors.Is(err, unix.EWOULDBLOCK):
			f.Close()
			return nil, fmt.Errorf("lock metadata snapshot: flock %s: %w", path, err)
		}
		if !waiting {
			waiting = true
			log.G(ctx).WithField("pool", p.name).WithField("lock", path).
				Debug("thinpool: waiting for another reader of the metadata snapshot")
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock metadata snapshot: wait for %s, held by another reader: %w", path, ctx.Err())
		case <-time.After(metaSnapLockPoll):
		}
	}
}
