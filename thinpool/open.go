package thinpool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/durable"
)

// Names of the loop-backed files under Config.RootDir.
const (
	DataFileName     = "data"
	MetadataFileName = "metadata"
)

// checkName rejects a device-mapper name the kernel or /dev/mapper cannot
// hold.
func checkName(what, name string) error {
	switch {
	case name == "", name == ".", name == "..", name == "control":
		return fmt.Errorf("%s name %q is reserved or empty: %w", what, name, ErrInvalid)
	case len(name) > 127:
		return fmt.Errorf("%s name %q is longer than 127 bytes: %w", what, name, ErrInvalid)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("%s name %q contains '/' or NUL: %w", what, name, ErrInvalid)
	}
	return nil
}

// newPool validates cfg (defaults filled in) and returns the Pool it
// describes, with the device-mapper control device open and nothing
// asked of the kernel yet; op names the caller in its errors.
func newPool(cfg Config, op string) (*Pool, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("thinpool: %s: invalid config: %w: %w", op, ErrInvalid, err)
	}
	ctl, err := control()
	if err != nil {
		return nil, fmt.Errorf("thinpool: %s %q: %w", op, cfg.Name, err)
	}
	return &Pool{cfg: cfg, name: cfg.Name, ctl: ctl, blockSize: cfg.blockSizeSectors()}, nil
}

// Open creates the pool described by cfg when it is absent and reuses it
// when it is present: an active pool of that name is reused as is (daemon
// restart); when the pool is gone but its files are present (reboot), the
// loop devices are reattached and the table reloaded, keeping the metadata.
// A fresh metadata file has its first 4 KiB zeroed so the kernel formats it.
// Existing DataDevice/MetadataDevice are used as given (a fresh metadata
// device must have been zeroed by the caller).
func Open(ctx context.Context, cfg Config) (*Pool, error) {
	p, err := newPool(cfg, "open pool")
	if err != nil {
		return nil, err
	}
	lg := log.G(ctx).WithField("pool", p.name)

	info, err := p.ctl.info(p.name)
	switch {
	case err == nil && info.hasLiveTable():
		if err := p.adopt(); err != nil {
			return nil, fmt.Errorf("thinpool: open pool %q: reuse active pool: %w", p.name, err)
		}
		lg.WithField("dev", p.devStr).Debug("thinpool: reusing active pool")
	case err == nil || errors.Is(err, unix.ENXIO):
		created := err != nil
		if err := p.activatePool(ctx, created); err != nil {
			return nil, fmt.Errorf("thinpool: open pool %q: %w", p.name, err)
		}
		lg.WithField("dev", p.devStr).WithField("block_sectors", p.blockSize).Info("thinpool: pool activated")
	default:
		return nil, fmt.Errorf("thinpool: open pool %q: %w", p.name, err)
	}
	if _, err := ensureNode(p.name, p.dev); err != nil {
		return nil, fmt.Errorf("thinpool: open pool %q: %w", p.name, err)
	}
	// A start follows whatever stopped the last run, a kill inside
	// Deactivate included: the nodes of this pool's names that outlived
	// their devices go before anything opens them.
	if removed, err := p.removeStaleNodes(p.name + "-"); err != nil {
		lg.WithError(err).Warn("thinpool: removing device nodes left without their devices")
	} else if len(removed) > 0 {
		lg.WithField("names", strings.Join(removed, ",")).Info("thinpool: removed device nodes left without their devices")
	}
	return p, nil
}

// OpenActive opens the pool described by cfg only when the kernel has it
// active: a device-mapper device of that name with a live thin-pool table
// on the configured metadata. It is Open for the commands that only read:
// it neither creates nor attaches nor loads anything, so a device of that
// name without a live table (a creation cut short before its table was
// loaded or resumed, or another tool's device being set up) is reported,
// wrapping ErrNotActive, and left as it is.
func OpenActive(ctx context.Context, cfg Config) (*Pool, error) {
	p, err := newPool(cfg, "open active pool")
	if err != nil {
		return nil, err
	}
	info, err := p.ctl.info(p.name)
	switch {
	case errors.Is(err, unix.ENXIO):
		return nil, fmt.Errorf("thinpool: pool %q: no device-mapper device of that name: %w", p.name, ErrNotActive)
	case err != nil:
		return nil, fmt.Errorf("thinpool: open active pool %q: %w", p.name, err)
	case !info.hasLiveTable():
		return nil, fmt.Errorf("thinpool: pool %q: the device-mapper device of that name has no live table (inactive table loaded: %v): %w",
			p.name, info.hasInactiveTbl(), ErrNotActive)
	}
	if err := p.adopt(); err != nil {
		return nil, fmt.Errorf("thinpool: open active pool %q: %w", p.name, err)
	}
	if _, err := ensureNode(p.name, p.dev); err != nil {
		return nil, fmt.Errorf("thinpool: open active pool %q: %w", p.name, err)
	}
	log.G(ctx).WithField("pool", p.name).WithField("dev", p.devStr).Debug("thinpool: opened active pool")
	return p, nil
}

// adopt checks that the active device p.name is a thin pool on our devices
// and learns its device number, block size and metadata device.
func (p *Pool) adopt() error {
	targets, info, err := p.ctl.tableStatus(p.name, true, false)
	if err != nil {
		return err
	}
	if len(targets) != 1 || targets[0].Type != "thin-pool" {
		return fmt.Errorf("device %q is not a thin pool (table %v): %w", p.name, targets, ErrExists)
	}
	t, err := parsePoolTable(targets[0].Params)
	if err != nil {
		return err
	}
	metaDev, err := parseDevString(t.MetaDev)
	if err != nil {
		return err
	}
	if err := p.checkOwnMetadata(metaDev); err != nil {
		return err
	}
	p.dev, p.devStr, p.blockSize = info.Dev, devString(info.Dev), t.BlockSize
	p.metaPath, err = nodeFor(metaDev)
	return err
}

// checkOwnMetadata refuses to adopt a pool of the same name that runs on
// another metadata device than the configured one.
func (p *Pool) checkOwnMetadata(metaDev uint64) error {
	if p.cfg.MetadataDevice != "" {
		want, err := blockDevNumber(p.cfg.MetadataDevice)
		if err != nil {
			return err
		}
		if want != metaDev {
			return fmt.Errorf("active pool %q uses metadata device %s, config names %s (%s): %w",
				p.name, devString(metaDev), p.cfg.MetadataDevice, devString(want), ErrExists)
		}
		return nil
	}
	want := filepath.Join(p.cfg.RootDir, MetadataFileName)
	if got := loopBackingFile(metaDev); got != "" && !sameFile(strings.TrimSuffix(got, " (deleted)"), want) {
		return fmt.Errorf("active pool %q keeps its metadata in %s, not %s: %w", p.name, got, want, ErrExists)
	}
	return nil
}

// sameFile reports whether backing, the path the kernel gives a loop
// device's backing file (resolved: no symlink in it), names the file at
// path, which may be reached through symlinks (a root directory under a
// /var/lib that links to a data disk): the same file when both exist,
// else the same path once path's directory is resolved (a backing file
// deleted since).
func sameFile(backing, path string) bool {
	backing = filepath.Clean(backing)
	if backing == path {
		return true
	}
	a, aerr := os.Stat(backing)
	b, berr := os.Stat(path)
	if aerr == nil && berr == nil {
		return os.SameFile(a, b)
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	return err == nil && filepath.Join(dir, filepath.Base(path)) == backing
}

// activatePool loads the thin-pool table into device p.name (creating the
// device when created is true) and resumes it. On failure a device it
// created is removed again.
func (p *Pool) activatePool(ctx context.Context, create bool) (err error) {
	var metaNode, dataNode string
	var hold []*os.File // loop devices stay open until the table holds them
	defer func() {
		for _, f := range hold {
			f.Close()
		}
	}()
	if p.cfg.DataDevice != "" {
		metaNode, dataNode = p.cfg.MetadataDevice, p.cfg.DataDevice
	} else {
		metaFile, dataFile, err := p.ensureFiles(ctx)
		if err != nil {
			return err
		}
		if err := p.restoreDataSize(ctx, metaFile, dataFile); err != nil {
			return err
		}
		ml, err := attachLoop(metaFile)
		if err != nil {
			return fmt.Errorf("metadata loop: %w", err)
		}
		hold = append(hold, ml)
		dl, err := attachLoop(dataFile)
		if err != nil {
			return fmt.Errorf("data loop: %w", err)
		}
		hold = append(hold, dl)
		metaNode, dataNode = ml.Name(), dl.Name()
	}
	metaDev, err := blockDevNumber(metaNode)
	if err != nil {
		return err
	}
	dataDev, err := blockDevNumber(dataNode)
	if err != nil {
		return err
	}
	if bs, ok := superblockDataBlockSize(metaNode); ok && bs != p.blockSize {
		log.G(ctx).WithField("pool", p.name).WithField("configured", p.blockSize).WithField("metadata", bs).
			Warn("thinpool: existing metadata has another data block size; keeping the metadata's")
		p.blockSize = bs
	}
	dataBytes, err := deviceSize(dataNode)
	if err != nil {
		return err
	}
	sectors := uint64(dataBytes) / 512 / uint64(p.blockSize) * uint64(p.blockSize)
	if sectors == 0 {
		return fmt.Errorf("data device %s (%d bytes) is smaller than one %d-sector block: %w", dataNode, dataBytes, p.blockSize, ErrInvalid)
	}
	if create {
		if _, err := p.ctl.create(p.name, ""); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				if rmErr := p.ctl.remove(p.name); rmErr != nil {
					err = fmt.Errorf("%w (and removing the half-made pool device: %v)", err, rmErr)
				}
			}
		}()
	}
	table := []dmTarget{{Start: 0, Length: sectors, Type: "thin-pool",
		Params: poolTableParams(devString(metaDev), devString(dataDev), p.blockSize, p.lowWaterBlocks(sectors/uint64(p.blockSize)))}}
	if err := p.ctl.load(p.name, table, false); err != nil {
		return fmt.Errorf("load table %q: %w", table[0].Params, err)
	}
	dev, err := p.ctl.resume(p.name)
	if err != nil {
		return err
	}
	p.dev, p.devStr = dev, devString(dev)
	p.metaPath = metaNode
	return nil
}

// restoreDataSize finishes a growth whose new data file size was lost
// while the pool's metadata kept it (a power cut after the table reload
// committed the metadata but before the host filesystem wrote the file's
// new size): the kernel refuses to load a pool whose data device is
// smaller than its metadata records. The file is extended back (sparse)
// to the recorded size when the committed data space map has no block in
// use past the file's end, and the call fails otherwise.
//
// Extending is safe then: no device maps a block the space map counts as
// free, so what the file reads there (zeros) is never returned as a
// device's data; once the kernel allocates such a block, a device reads
// only what it wrote there (and zeros in the rest of a partly written
// block, where skip_block_zeroing elsewhere shows a deleted device's old
// data). A block in use past
// the file's end is data a device maps that the file has lost: extending
// would have that device read zeros where it wrote data, so the pool is
// not loaded and the error names both sizes. Metadata that cannot be read
// is left to the kernel, which reports it when the table is loaded.
func (p *Pool) restoreDataSize(ctx context.Context, metaFile, dataFile string) error {
	blocks, blockSectors, ok, err := committedDataSpace(metaFile)
	if err != nil {
		log.G(ctx).WithError(err).WithField("pool", p.name).WithField("file", metaFile).
			Debug("thinpool: metadata superblock unreadable; the data file's size is left to the kernel to check")
		return nil
	}
	if !ok || blockSectors == 0 {
		return nil
	}
	blockBytes := int64(blockSectors) * 512
	want := int64(blocks) * blockBytes
	fi, err := os.Stat(dataFile)
	if err != nil {
		return fmt.Errorf("stat data file: %w", err)
	}
	have := fi.Size()
	if have >= want {
		return nil
	}
	lg := log.G(ctx).WithField("pool", p.name).WithField("file", dataFile).
		WithField("file_bytes", have).WithField("metadata_bytes", want)
	used, inUse, err := firstDataBlockInUse(metaFile, uint64(have/blockBytes))
	if err != nil {
		return fmt.Errorf("data file %s holds %d bytes, less than the %d bytes of data the pool's metadata records; "+
			"reading which data blocks past the file's end are in use: %w", dataFile, have, want, err)
	}
	if inUse {
		return fmt.Errorf("data file %s holds %d bytes, less than the %d bytes of data the pool's metadata records, "+
			"and data block %d (at byte %d) past the file's end is in use: the file lost data the pool's devices hold; "+
			"restore the data file or recreate the pool (see \"The pool's data file is shorter than its metadata\" in docs/operating.md): %w",
			dataFile, have, want, used, int64(used)*blockBytes, ErrInvalid)
	}
	if err := extendFile(dataFile, want); err != nil {
		return fmt.Errorf("finish a growth the data file lost: %w", err)
	}
	lg.Warn("thinpool: data file shorter than the pool's metadata records, with no block in use past its end; extended it to the recorded size")
	return nil
}

// ensureFiles creates the sparse data and metadata files when absent.
func (p *Pool) ensureFiles(ctx context.Context) (metaFile, dataFile string, err error) {
	if err := os.MkdirAll(p.cfg.RootDir, 0o700); err != nil {
		return "", "", fmt.Errorf("make root dir: %w", err)
	}
	metaFile = filepath.Join(p.cfg.RootDir, MetadataFileName)
	dataFile = filepath.Join(p.cfg.RootDir, DataFileName)
	if err := checkDataFileKept(metaFile, dataFile); err != nil {
		return "", "", err
	}
	if err := makeSparse(dataFile, p.cfg.DataSize.Bytes(), false); err != nil {
		return "", "", err
	}
	if err := makeSparse(metaFile, p.cfg.MetadataSize.Bytes(), true); err != nil {
		return "", "", err
	}
	return metaFile, dataFile, nil
}

// checkDataFileKept refuses a data file that is gone (absent, or empty)
// beside metadata whose devices map data blocks: the data file is made
// before the metadata file, so such metadata had a data file, and a new
// empty one under it would have every device read zeros where it wrote
// its data. Metadata that is absent, fresh or unreadable, or that maps no
// data block, takes a new data file.
func checkDataFileKept(metaFile, dataFile string) error {
	if fi, err := os.Stat(dataFile); err == nil && fi.Size() > 0 {
		return nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("stat %s: %w", dataFile, err)
	}
	if fi, err := os.Stat(metaFile); err != nil || fi.Size() == 0 {
		return nil
	}
	if _, _, ok, err := committedDataSpace(metaFile); err != nil || !ok {
		return nil
	}
	used, inUse, err := firstDataBlockInUse(metaFile, 0)
	if err != nil || !inUse {
		return nil
	}
	return fmt.Errorf("data file %s is missing or empty, but the pool's metadata %s records data block %d in use: "+
		"the data the pool's devices hold is lost; restore the data file or recreate the pool "+
		"(see \"The pool's data file is shorter than its metadata\" in docs/operating.md): %w",
		dataFile, metaFile, used, ErrInvalid)
}

// makeSparse creates file of size bytes unless it exists; a new metadata
// file gets its first 4 KiB explicitly zeroed and synced so the kernel sees
// no superblock and formats fresh metadata. The file and its directory are
// synced, so the new name survives a power cut. A file found empty is one
// whose creation a crash cut short before it was sized (no pool file is
// ever empty): it is sized now. A file made only partly is removed on
// failure.
func makeSparse(path string, size int64, zeroHead bool) (err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		fi, serr := os.Stat(path)
		if serr != nil {
			return fmt.Errorf("stat %s: %w", path, serr)
		}
		if fi.Size() != 0 {
			return nil
		}
		f, err = os.OpenFile(path, os.O_RDWR, 0)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close %s: %w", path, cerr)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("size %s to %d bytes: %w", path, size, err)
	}
	if zeroHead {
		if _, err := f.WriteAt(make([]byte, metaBlockSize), 0); err != nil {
			return fmt.Errorf("zero the head of %s: %w", path, err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return durable.SyncDir(filepath.Dir(path))
}

// superblockDataBlockSize reads the data block size recorded in existing
// thin metadata; ok is false for fresh (zeroed) or unreadable metadata.
func superblockDataBlockSize(metaNode string) (uint32, bool) {
	r, err := openMetaReader(metaNode)
	if err != nil {
		return 0, false
	}
	defer r.Close()
	b, err := r.block(0)
	if err != nil || binary.LittleEndian.Uint64(b[32:]) != thinSuperMagic {
		return 0, false
	}
	if _, err := detailsRootOf(b, 0); err != nil {
		return 0, false
	}
	return binary.LittleEndian.Uint32(b[336:]), true
}

// deviceSize returns the size in bytes of a block device (BLKGETSIZE64).
func deviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	size, err := fdSize(int(f.Fd()))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return int64(size), nil
}

// fdSize returns the size in bytes of the block device open as fd
// (BLKGETSIZE64); its error names the ioctl, not the device.
func fdSize(fd int) (uint64, error) {
	var size uint64
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
		return 0, fmt.Errorf("BLKGETSIZE64: %w", errno)
	}
	return size, nil
}

// parseDevString parses "major:minor".
func parseDevString(s string) (uint64, error) {
	var maj, min uint32
	if _, err := fmt.Sscanf(s, "%d:%d", &maj, &min); err != nil {
		return 0, fmt.Errorf("device number %q: %w", s, err)
	}
	return unix.Mkdev(maj, min), nil
}

// nodeFor returns a path to a block node of dev: /dev/<DEVNAME> from sysfs,
// else a node made under /dev/mapper/.thinpool.
func nodeFor(dev uint64) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", unix.Major(dev), unix.Minor(dev)))
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "DEVNAME="); ok {
				path := "/dev/" + name
				if got, err := blockDevNumber(path); err == nil && got == dev {
					return path, nil
				}
			}
		}
	}
	dir := filepath.Join(MapperDir, ".thinpool")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("make %s: %w", dir, err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%d-%d", unix.Major(dev), unix.Minor(dev)))
	if got, err := blockDevNumber(path); err == nil && got == dev {
		return path, nil
	}
	os.Remove(path)
	if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(dev)); err != nil {
		return "", fmt.Errorf("mknod %s: %w", path, err)
	}
	return path, nil
}

// Close releases the package's handles. It never removes the pool or any
// thin device: the pool survives for the next Open.
func (p *Pool) Close() error {
	p.closed.Store(true)
	return nil
}

// Name returns the device-mapper name of the pool.
func (p *Pool) Name() string { return p.name }
