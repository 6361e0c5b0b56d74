package snapshotter

import (
	"context"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// DevicePool is what the snapshotter asks of the thin pool: the methods of
// *thinpool.Pool it calls, with their meaning there. *thinpool.Pool is the
// one implementation the daemon uses; the interface lets the host tests
// and benchmarks run the snapshotter over a pool held in memory
// (thinpooltest.FakePool), while the VM tests run it over the real one.
type DevicePool interface {
	Name() string
	CreateThin(ctx context.Context, id uint32) error
	CreateSnap(ctx context.Context, id, originID uint32) error
	Delete(ctx context.Context, id uint32) error
	Activate(ctx context.Context, name string, id uint32, sizeBytes int64) (string, error)
	Deactivate(ctx context.Context, name string) error
	// Discard unmaps every block of active device name, giving back to
	// the pool (and, passed down, to its data device) those no other
	// device shares.
	Discard(ctx context.Context, name string) error
	ThinExists(ctx context.Context, id uint32) (bool, error)
	ThinIDs(ctx context.Context) ([]uint32, error)
	ActiveDevices(ctx context.Context) ([]thinpool.ActiveDevice, error)
	ThinStatus(ctx context.Context, name string) (thinpool.ThinStatus, error)
	// Format makes the filesystem fs (mkfs options opts) on the active
	// device at devPath, its root empty: the base device, once.
	Format(ctx context.Context, devPath string, fs thinpool.FSType, opts []string) error
	// ReleaseFormat undoes what a Format cut short by a crash left on the
	// host (a mount), before the device it formatted is rolled back.
	ReleaseFormat()
}

var _ DevicePool = (*thinpool.Pool)(nil)

// finishTimeout bounds the work that must run to its end once a
// device-mapper call changed the pool: recording the outcome, or rolling
// the device back. That work does not follow the caller's cancellation (a
// caller that gives up half-way would otherwise leave an intent row and a
// reserved key until the next start-up), so it needs a deadline of its own.
const finishTimeout = 30 * time.Second

// detached returns a context carrying ctx's values (logger, namespace) but
// not its cancellation or deadline, bounded by finishTimeout.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
}
