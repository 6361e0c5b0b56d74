// Package thinpooltest holds FakePool, a fake of *thinpool.Pool for tests
// on hosts without device-mapper: a thin pool kept in memory, its devices'
// files (when a test wants them) in a directory each, driven by the same
// methods (the ones the snapshotter's DevicePool names). Faking the
// pool is sound because the real pool runs behind those methods in the VM
// tests (integration/vm); what runs over FakePool on the host (the
// snapshotter's bookkeeping, and what is built on it) is the real code.
// Only tests import this package.
package thinpooltest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// FakePool is a thin pool held in memory: thin ids, the device-mapper
// names mapped to them and the sectors each maps. It answers
// with thinpool's errors where the kernel would fail (an id taken, an id
// or a name missing, a mapped id deleted) and refuses creates as the real
// pool does once SetSpace gave it a status line. A device maps the sectors
// Write says it wrote, on top of those its origin mapped when it was
// snapshotted. A pool from NewFakePool stores no files and makes no
// filesystem; one from NewFakePoolAt gives every device a directory that
// stands for its filesystem (ThinDir, MappedDir). Its methods are safe for
// concurrent use.
type FakePool struct {
	mu     sync.Mutex
	thins  map[uint32]*thin  // thin id -> the device
	active map[string]uint32 // dm name -> thin id
	used   uint64            // sectors mapped by some device
	// space, when set, is the pool's status line: creates are refused
	// by the rules of the real pool (thinpool's FullError and
	// ReserveError at reserve percent) before anything is made.
	space   *thinpool.PoolStatus
	reserve float64
	// root, when set, holds a directory per thin id (dir): the files
	// on the device.
	root string
	// discarded are the names Discard was called on, in order.
	discarded []string
	// opens counts the opens held on an active device (Hold).
	opens map[string]int
}

// thin is one thin device: the runs of sectors it maps, shared with its
// origin and its snapshots as a thin pool shares blocks.
type thin struct {
	runs []*run
}

// run is sectors written once, held by every device that maps them.
type run struct {
	sectors uint64
	holders int
}

// NewFakePool returns an empty pool that refuses nothing and stores no
// files.
func NewFakePool() *FakePool {
	return &FakePool{thins: map[uint32]*thin{}, active: map[string]uint32{}}
}

// NewFakePoolAt returns an empty pool that refuses nothing and keeps each
// device's files in a directory under root (which it creates): CreateThin
// makes an empty one, CreateSnap a copy of the origin's (a thin snapshot
// holds its origin's content), Format empties it and Delete removes it.
// The files are not counted as mapped sectors; Write still says what a
// device maps.
func NewFakePoolAt(root string) (*FakePool, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("fake pool at %s: %w", root, err)
	}
	p := NewFakePool()
	p.root = root
	return p, nil
}

// dir is the directory of thin id id, "" when the pool keeps no files.
func (p *FakePool) dir(id uint32) string {
	if p.root == "" {
		return ""
	}
	return filepath.Join(p.root, strconv.FormatUint(uint64(id), 10))
}

// SetSpace gives the pool a status line and a reserve (percent) that its
// creates obey from now on, as thinpool.Pool's obey the kernel's status
// and Config.MinFreeSpace.
func (p *FakePool) SetSpace(st thinpool.PoolStatus, reserve float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.space, p.reserve = &st, reserve
}

// Reserve is the reserve (percent) SetSpace gave the pool, 0 before.
func (p *FakePool) Reserve() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reserve
}

// creatable refuses a create as the real pool would with p.space; p.mu
// is held.
func (p *FakePool) creatable() error {
	if p.space == nil {
		return nil
	}
	if err := p.space.FullError(); err != nil {
		return err
	}
	return p.space.ReserveError(p.reserve, "pool.min_free_space")
}

// Name is the pool's device-mapper name: "fake".
func (p *FakePool) Name() string { return "fake" }

// CreateThin makes thin id id, mapping nothing.
func (p *FakePool) CreateThin(ctx context.Context, id uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.thins[id]; ok {
		return fmt.Errorf("fake pool: create_thin %d: %w", id, thinpool.ErrExists)
	}
	if err := p.creatable(); err != nil {
		return fmt.Errorf("fake pool: create_thin %d: %w", id, err)
	}
	if d := p.dir(id); d != "" {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("fake pool: create_thin %d: %w", id, err)
		}
	}
	p.thins[id] = &thin{}
	return nil
}

// CreateSnap makes thin id id a snapshot of originID: it maps what the
// origin maps, sharing it.
func (p *FakePool) CreateSnap(ctx context.Context, id, originID uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	origin, ok := p.thins[originID]
	if !ok {
		return fmt.Errorf("fake pool: create_snap %d of %d: origin: %w", id, originID, thinpool.ErrNotFound)
	}
	if _, ok := p.thins[id]; ok {
		return fmt.Errorf("fake pool: create_snap %d: %w", id, thinpool.ErrExists)
	}
	if err := p.creatable(); err != nil {
		return fmt.Errorf("fake pool: create_snap %d of %d: %w", id, originID, err)
	}
	if d := p.dir(id); d != "" {
		if err := copyTree(p.dir(originID), d); err != nil {
			_ = os.RemoveAll(d)
			return fmt.Errorf("fake pool: create_snap %d of %d: copy the origin's files: %w", id, originID, err)
		}
	}
	for _, r := range origin.runs {
		r.holders++
	}
	p.thins[id] = &thin{runs: append([]*run(nil), origin.runs...)}
	return nil
}

// Delete removes thin id id, freeing the sectors no other device maps; a
// mapped id is refused with thinpool.ErrBusy.
func (p *FakePool) Delete(ctx context.Context, id uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.thins[id]
	if !ok {
		return fmt.Errorf("fake pool: delete %d: %w", id, thinpool.ErrNotFound)
	}
	for name, a := range p.active {
		if a == id {
			return fmt.Errorf("fake pool: delete %d: mapped as %s: %w", id, name, thinpool.ErrBusy)
		}
	}
	if d := p.dir(id); d != "" {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("fake pool: delete %d: its files: %w", id, err)
		}
	}
	p.unmap(t)
	delete(p.thins, id)
	return nil
}

// unmap drops t's sectors, freeing those no other device holds; the
// caller holds mu.
func (p *FakePool) unmap(t *thin) {
	for _, r := range t.runs {
		if r.holders--; r.holders == 0 {
			p.used -= r.sectors
		}
	}
	t.runs = nil
}

// Discard unmaps every sector of the thin device mapped as name, as a
// discard of the whole device does: the sectors no other device holds are
// freed. Its
// files, if the pool keeps them, stay (a discarded filesystem is garbage
// the caller deletes next). name must be mapped.
func (p *FakePool) Discard(ctx context.Context, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.active[name]
	if !ok {
		return fmt.Errorf("fake pool: discard %s: %w", name, thinpool.ErrNotFound)
	}
	p.unmap(p.thins[id])
	p.discarded = append(p.discarded, name)
	return nil
}

// Discarded returns the names Discard was called on, in order.
func (p *FakePool) Discarded() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.discarded...)
}

// Activate maps name to thin id id and returns its device path; mapping a
// name again to the same id is not an error.
func (p *FakePool) Activate(ctx context.Context, name string, id uint32, sizeBytes int64) (string, error) {
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

// Deactivate unmaps name; a name not mapped is not an error.
func (p *FakePool) Deactivate(ctx context.Context, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opens[name] > 0 {
		return fmt.Errorf("fake pool: deactivate %s: held open %d times: %w", name, p.opens[name], thinpool.ErrBusy)
	}
	delete(p.active, name)
	return nil
}

// Hold opens active device name once more, as a mount or a VM given its
// path would: ThinStatus counts it in OpenCount, and Deactivate refuses
// the device (thinpool.ErrBusy), as the kernel does, until Release.
func (p *FakePool) Hold(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opens == nil {
		p.opens = map[string]int{}
	}
	p.opens[name]++
}

// Release closes one open of device name that Hold made.
func (p *FakePool) Release(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opens[name] > 0 {
		p.opens[name]--
	}
}

// ThinExists reports whether the pool holds thin id id.
func (p *FakePool) ThinExists(ctx context.Context, id uint32) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.thins[id]
	return ok, nil
}

// ThinIDs lists the thin ids the pool holds, in no order.
func (p *FakePool) ThinIDs(ctx context.Context) ([]uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]uint32, 0, len(p.thins))
	for id := range p.thins {
		ids = append(ids, id)
	}
	return ids, nil
}

// ActiveDevices lists the mapped names with their thin ids.
func (p *FakePool) ActiveDevices(ctx context.Context) ([]thinpool.ActiveDevice, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]thinpool.ActiveDevice, 0, len(p.active))
	for name, id := range p.active {
		out = append(out, thinpool.ActiveDevice{Name: name, ThinID: id})
	}
	return out, nil
}

// ThinStatus returns the sectors the device mapped as name maps;
// thinpool.ErrNotFound when name is not mapped.
func (p *FakePool) ThinStatus(ctx context.Context, name string) (thinpool.ThinStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.active[name]
	if !ok {
		return thinpool.ThinStatus{}, fmt.Errorf("fake pool: status of %s: %w", name, thinpool.ErrNotFound)
	}
	var mapped uint64
	for _, r := range p.thins[id].runs {
		mapped += r.sectors
	}
	return thinpool.ThinStatus{MappedSectors: mapped, HasMapped: mapped > 0, OpenCount: p.opens[name]}, nil
}

// Format checks devPath is a mapped device of the pool
// (thinpool.ErrNotFound otherwise) and makes no filesystem; a pool that
// keeps files empties the device's directory, the empty root a new
// filesystem has.
func (p *FakePool) Format(ctx context.Context, devPath string, fs thinpool.FSType, opts []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.mappedAt(devPath)
	if !ok {
		return fmt.Errorf("fake pool: format %s: not a mapped device: %w", devPath, thinpool.ErrNotFound)
	}
	if d := p.dir(id); d != "" {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("fake pool: format %s: %w", devPath, err)
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("fake pool: format %s: %w", devPath, err)
		}
	}
	return nil
}

// mappedAt returns the thin id mapped at device path devPath; p.mu is
// held.
func (p *FakePool) mappedAt(devPath string) (uint32, bool) {
	for name, id := range p.active {
		if thinpool.DevicePath(name) == devPath {
			return id, true
		}
	}
	return 0, false
}

// Mapped reports whether devPath (thinpool.DevicePath of a name) is the
// path of a mapped device of the pool: whether the real pool's device node
// would be there.
func (p *FakePool) Mapped(devPath string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.mappedAt(devPath)
	return ok
}

// ThinDir returns the directory holding the files of thin id id, mapped
// or not; thinpool.ErrNotFound when the pool has no such id, an error when
// it keeps no files.
func (p *FakePool) ThinDir(id uint32) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.root == "" {
		return "", errors.New("fake pool: keeps no files (NewFakePoolAt does)")
	}
	if _, ok := p.thins[id]; !ok {
		return "", fmt.Errorf("fake pool: files of %d: %w", id, thinpool.ErrNotFound)
	}
	return p.dir(id), nil
}

// MappedDir returns the directory holding the files of the device mapped
// at devPath, what mounting devPath would show; thinpool.ErrNotFound when
// no device is mapped there, an error when the pool keeps no files.
func (p *FakePool) MappedDir(devPath string) (string, error) {
	p.mu.Lock()
	id, ok := p.mappedAt(devPath)
	p.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("fake pool: files at %s: not a mapped device: %w", devPath, thinpool.ErrNotFound)
	}
	return p.ThinDir(id)
}

// ReleaseFormat does nothing: Format mounts nothing.
func (p *FakePool) ReleaseFormat() {}

// Write makes thin id id map sectors more, newly allocated, as a write to
// sectors it did not map would; thinpool.ErrNotFound when the pool has
// no such id.
func (p *FakePool) Write(id uint32, sectors uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.thins[id]
	if !ok {
		return fmt.Errorf("fake pool: write to %d: %w", id, thinpool.ErrNotFound)
	}
	t.runs = append(t.runs, &run{sectors: sectors, holders: 1})
	p.used += sectors
	return nil
}

// UsedSectors returns the pool's data in use: the sectors some device
// maps, each counted once however many devices share it.
func (p *FakePool) UsedSectors() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// Counts returns how many thin ids the pool holds and how many names are
// mapped.
func (p *FakePool) Counts() (thins, active int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.thins), len(p.active)
}

// copyTree copies the tree at src into dst (directories, regular files,
// symlinks), keeping modes.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			if err := os.MkdirAll(to, 0o755); err != nil {
				return err
			}
			return os.Chmod(to, fi.Mode().Perm())
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case fi.Mode().IsRegular():
			return copyFile(path, to, fi.Mode().Perm())
		}
		return fmt.Errorf("copy %s: unsupported file type %s", path, fi.Mode().Type())
	})
}

// copyFile copies regular file src to the new file dst with mode perm.
func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
