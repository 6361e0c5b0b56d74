package snapshotter

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// fakePool is a thin pool held in memory: thin ids with their origin, and
// the names mapped to them. It answers with thinpool's errors where the
// kernel would fail (an id taken, an id or a name missing), so the
// snapshotter's bookkeeping (intents, records, rollbacks, reconciliation)
// runs on the host without device-mapper. It stores no data: a device's
// mapped size is what setMapped says.
type fakePool struct {
	mu     sync.Mutex
	thins  map[uint32]uint32 // thin id -> origin (0: none)
	active map[string]uint32 // dm name -> thin id
	mapped map[uint32]uint64 // thin id -> mapped sectors
	// space, when set, is the pool's status line: creates are refused
	// by the rules of the real pool (thinpool's FullError and
	// ReserveError at reserve percent) before anything is made.
	space   *thinpool.PoolStatus
	reserve float64
}

// setSpace gives the pool a status line and a reserve its creates obey.
func (p *fakePool) setSpace(st thinpool.PoolStatus, reserve float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.space, p.reserve = &st, reserve
}

// creatable refuses a create as the real pool would with p.space; p.mu
// is held.
func (p *fakePool) creatable() error {
	if p.space == nil {
		return nil
	}
	if err := p.space.FullError(); err != nil {
		return err
	}
	return p.space.ReserveError(p.reserve, "pool.min_free_space")
}

var _ devicePool = (*fakePool)(nil)

func newFakePool() *fakePool {
	return &fakePool{thins: map[uint32]uint32{}, active: map[string]uint32{}, mapped: map[uint32]uint64{}}
}

func (p *fakePool) Name() string { return "fake" }

func (p *fakePool) CreateThin(ctx context.Context, id uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.thins[id]; ok {
		return fmt.Errorf("fake pool: create_thin %d: %w", id, thinpool.ErrExists)
	}
	if err := p.creatable(); err != nil {
		return fmt.Errorf("fake pool: create_thin %d: %w", id, err)
	}
	p.thins[id] = 0
	return nil
}

func (p *fakePool) CreateSnap(ctx context.Context, id, originID uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.thins[originID]; !ok {
		return fmt.Errorf("fake pool: create_snap %d of %d: origin: %w", id, originID, thinpool.ErrNotFound)
	}
	if _, ok := p.thins[id]; ok {
		return fmt.Errorf("fake pool: create_snap %d: %w", id, thinpool.ErrExists)
	}
	if err := p.creatable(); err != nil {
		return fmt.Errorf("fake pool: create_snap %d of %d: %w", id, originID, err)
	}
	p.thins[id] = originID
	p.mapped[id] = p.mapped[originID]
	return nil
}

func (p *fakePool) Delete(ctx context.Context, id uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.thins[id]; !ok {
		return fmt.Errorf("fake pool: delete %d: %w", id, thinpool.ErrNotFound)
	}
	for name, a := range p.active {
		if a == id {
			return fmt.Errorf("fake pool: delete %d: mapped as %s: %w", id, name, thinpool.ErrBusy)
		}
	}
	delete(p.thins, id)
	delete(p.mapped, id)
	return nil
}

func (p *fakePool) Activate(ctx context.Context, name string, id uint32, sizeBytes int64) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.thins[id]; !ok {
		return "", fmt.Errorf("fake pool: activate %s (%d): %w", name, id, thinpool.ErrNotFound)
	}
	if a, ok := p.active[name]; ok && a != id {
		return "", fmt.Errorf("fake pool: activate %s: maps %d: %w", name, a, thinpool.ErrExists)
	}
	p.active[name] = id
	return thinpool.DevicePath(name), nil
}

func (p *fakePool) Deactivate(ctx context.Context, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.active, name)
	return nil
}

func (p *fakePool) ThinExists(ctx context.Context, id uint32) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.thins[id]
	return ok, nil
}

func (p *fakePool) ThinIDs(ctx context.Context) ([]uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]uint32, 0, len(p.thins))
	for id := range p.thins {
		ids = append(ids, id)
	}
	return ids, nil
}

func (p *fakePool) ActiveDevices(ctx context.Context) ([]thinpool.ActiveDevice, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]thinpool.ActiveDevice, 0, len(p.active))
	for name, id := range p.active {
		out = append(out, thinpool.ActiveDevice{Name: name, ThinID: id})
	}
	return out, nil
}

func (p *fakePool) ThinStatus(ctx context.Context, name string) (thinpool.ThinStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.active[name]
	if !ok {
		return thinpool.ThinStatus{}, fmt.Errorf("fake pool: status of %s: %w", name, thinpool.ErrNotFound)
	}
	return thinpool.ThinStatus{MappedSectors: p.mapped[id], HasMapped: p.mapped[id] > 0}, nil
}

// Format makes nothing: the fake holds no data.
func (p *fakePool) Format(ctx context.Context, devPath string, fs thinpool.FSType, opts []string) error {
	return nil
}

// ReleaseFormat does nothing: Format mounts nothing.
func (p *fakePool) ReleaseFormat() {}

// counts returns how many thin ids the pool holds and how many are mapped.
func (p *fakePool) counts() (thins, active int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.thins), len(p.active)
}

// fakeBaseID is the thin id of the base device newFakeSnapshotter records.
const fakeBaseID = 1

// newFakeSnapshotter returns a Snapshotter on a real database file (dir,
// or a fresh one when dir is "") and pool, whose base device is recorded
// and present (a fake pool cannot run mkfs).
func newFakeSnapshotter(t testing.TB, dir string, pool *fakePool, cfg Config) *Snapshotter {
	t.Helper()
	ctx := context.Background()
	if dir == "" {
		dir = t.TempDir()
	}
	db := metadatatest.OpenPath(t, filepath.Join(dir, "meta.db"))
	if cfg.BaseImageSize == 0 {
		cfg.BaseImageSize = DefaultBaseImageSize
	}
	if _, ok, err := ReadRecords(db).baseDevice(ctx); err != nil {
		t.Fatal(err)
	} else if !ok {
		if err := pool.CreateThin(ctx, fakeBaseID); err != nil {
			t.Fatal(err)
		}
		err := db.WithTx(ctx, func(tx *sql.Tx) error {
			return RecordsTx(tx).InsertThinDevice(ctx, ThinDevice{ID: fakeBaseID, Name: baseDeviceName(pool.Name(), fakeBaseID),
				Role: ThinRoleBase, State: ThinStateInactive, SizeBytes: cfg.BaseImageSize.Bytes(), FSType: "ext4", CreatedNs: 1, UpdatedNs: 1})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := newOn(ctx, db, pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
