package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

const progressEvery = 8 << 20 // report progress at least every 8 MiB of a file

// ExtractOptions tunes Extract.
type ExtractOptions struct {
	// Limits are the policy's limits (zero fields: the defaults).
	Limits Limits
	// StripRootfs extracts rootfs/<x> as <x> (Report.HasRootfs said the
	// archive has that layout); an entry outside rootfs/ is then rejected
	// with ErrOutsideRootfs, and the archive root entry "./" is checked as
	// Validate checks it but not applied.
	StripRootfs bool
	// DetectRootfs decides StripRootfs from the archive itself, for a
	// stream extracted before Validate has seen it whole: the first entry
	// other than the archive root tells (rootfs/ or under it: strip).
	// Stats.StrippedRootfs says what was decided. An archive that later
	// leaves rootfs/ is rejected with ErrOutsideRootfs, as with
	// StripRootfs, so an extraction whose decision differs from
	// Report.HasRootfs never completes; a caller that is told so extracts
	// again with StripRootfs set from the report.
	DetectRootfs bool
	// HashStream computes a compressed layer's diff ID, the SHA-256 of its
	// decompressed tar stream, as it is read (Stats.DiffID), so that one
	// read of a layer both extracts it and names it. A plain layer's diff
	// ID is the SHA-256 of the bytes given, which the caller computes as it
	// reads them: Stats.DiffID is left empty (Stats.Compression says which).
	HashStream bool
	// MaxDataBytes, if positive, is the most file content and extended
	// attributes (names and values) Extract writes (runs of zeros are left
	// as holes and not counted): the space the caller has for this
	// archive. The entry that would write more is refused (ErrOverBudget)
	// before its excess is written, and removed.
	MaxDataBytes int64
	// KeepRootMetadata leaves the mode, owner, extended attributes and
	// times of root as they are: an entry naming the archive root ("./",
	// or rootfs/ when stripped) is checked and counted as any other but
	// not applied, as containerd's applier ignores an entry that resolves
	// to the root. It is for extracting onto a snapshot whose root belongs
	// to the layers below, where a layer made with `tar -c .` by a build
	// user would otherwise make the image's / private to that user.
	KeepRootMetadata bool
	// NoChown leaves every entry owned by the extracting user instead of the
	// archive's uid/gid (for unprivileged tools and tests).
	NoChown bool
	// GzipCommand, unless "", is a program gzip layers are inflated with
	// instead of the built-in inflater: an executable run as
	// `GzipCommand -d -c`, reading gzip on its standard input and writing
	// what it inflates on its standard output (igzip, unpigz and gzip
	// take this). What is extracted, and the verdict, are the same either
	// way (see gzipcmd.go).
	GzipCommand string
	// Progress, if set, is called after every entry and every 8 MiB of a
	// large file, on the extracting goroutine: it must return quickly.
	Progress func(Progress)
}

// Progress is a snapshot of an extraction under way.
type Progress struct {
	Entries int    // headers processed
	Files   int    // regular files written
	Bytes   int64  // file content written
	Entry   string // the entry being extracted, as written in the archive (unescaped: quote it to print it)
}

// Stats describes a finished (or failed) extraction.
type Stats struct {
	Entries   int   // headers read
	Files     int   // regular files written
	Dirs      int   // directories made or updated
	Symlinks  int   // symlinks made
	Hardlinks int   // hard links made
	Fifos     int   // named pipes made
	Devices   int   // character and block devices made (Limits.AllowDeviceNodes)
	Whiteouts int   // whiteout entries applied (.wh.<name>, .wh..wh..opq)
	Removed   int   // names removed by whiteouts (lower-layer content)
	Bytes     int64 // file content extracted, holes included
	// Written is the file content actually written: Bytes less the runs
	// of zeros (a sparse entry's holes) left as holes.
	Written int64
	// XattrBytes is the size (names and values) of the extended
	// attributes of the files and directories extracted, every record
	// whether applied or skipped: what counts with Written against
	// ExtractOptions.MaxDataBytes.
	XattrBytes int64
	// XattrsSkipped counts extended attributes not applied: only user.*
	// attributes are set, where the filesystem supports them, and file
	// capabilities (see Capabilities).
	XattrsSkipped int
	// Capabilities counts the security.capability attributes set: only
	// with Limits.AllowSetID (without it an archive carrying one is
	// rejected), and not with NoChown (setting one needs the privilege
	// chown does; it is then skipped).
	Capabilities int
	// StrippedRootfs reports that rootfs/ was extracted as the root
	// (StripRootfs, or what DetectRootfs decided).
	StrippedRootfs bool
	// StreamBytes is the length of the tar stream (decompressed, for a
	// gzip or zstd layer), its padding included: set when Extract returns
	// nil.
	StreamBytes int64
	// DiffID is "sha256:<hex>" of the whole decompressed tar stream, as
	// Validate's Report has it: set with HashStream for a compressed layer
	// when Extract returns nil.
	DiffID string
	// Compression is how the bytes read were stored.
	Compression Compression
}

// ExtractDir is Extract into the directory dir, opened as an os.Root.
func ExtractDir(ctx context.Context, r io.Reader, dir string, opts ExtractOptions) (Stats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Stats{}, fmt.Errorf("extract into %s: %w", dir, err)
	}
	defer root.Close()
	return Extract(ctx, r, root, opts)
}

// SyncFS writes back the filesystem holding dir, an extraction's root: an
// extracted tree is only durable once its filesystem is synced, which
// Extract leaves to its caller (one sync for the whole tree, when the
// caller needs it).
func SyncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Extract streams the tar archive r (plain, gzip or zstd, told by its first
// bytes) into root, applying the same policy as
// Validate entry by entry, so it is safe on an archive that was never
// validated: every name, link and whiteout is confined to root by os.Root,
// no symlink is ever followed (an entry below a symlink, whether the symlink
// comes from this archive or from content already in root, is rejected with
// ErrThroughSymlink), and a rejection is a *PolicyError or *FormatError
// naming the entry. root may hold lower layers: OCI whiteouts in r remove
// their content (.wh.<name> removes <name>; .wh..wh..opq empties its
// directory of everything this archive does not itself write), and entries
// replace what is there. Modes, ownership (unless NoChown), modification
// times, user.* xattrs, file capabilities (when Limits.AllowSetID admits
// them) and hard links are preserved. Memory use is bounded
// by the limits, not by the archive's size.
//
// On error the entry being written is removed (no partial file is left);
// the entries written before it remain, for the caller to discard along with
// the target.
func Extract(ctx context.Context, r io.Reader, root *os.Root, opts ExtractOptions) (Stats, error) {
	x := &extractor{
		root:    root,
		opts:    opts,
		buf:     make([]byte, readBufferSize),
		cleared: make(map[uint64]struct{}),
		times:   make(map[uint64][2]unix.Timespec),
		links:   make(map[uint64]struct{}),
		wrote:   make(map[uint64]struct{}),
	}
	// With DetectRootfs the checker starts without stripping and is told
	// the decision once made: the entries admitted before it (the archive
	// root, global headers) get the same verdict and leave the same record
	// either way (checker.admit).
	x.chk = newChecker(opts.Limits, opts.StripRootfs && !opts.DetectRootfs)
	x.st.StrippedRootfs = x.chk.strip
	x.cur = newCursor(root, opts.Limits.LowerSymlinks, x.madeSymlink, x.chk.step)
	x.cur.leave = x.settle
	defer x.cur.close()
	hash := hashNone
	if opts.HashStream {
		hash = hashCompressed
	}
	s := newStream(ctx, r, opts.Limits, hash, nil, opts.GzipCommand)
	x.st.Compression = s.comp
	defer s.close()
	// held are the archive root's entries read before DetectRootfs could
	// decide: admitted at once, so every rule and limit applies to them as
	// they are read, and applied once it has (to the root, or not at all
	// when rootfs/ is the root). The checker admits at most MaxRootEntries
	// of them, and each is kept reduced to what applying it needs.
	var held []entry
	deciding := opts.DetectRootfs
	for {
		hdr, err := s.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return x.st, err
		}
		x.st.Entries++
		if deciding {
			if hdr.Typeflag == tar.TypeXGlobalHeader || isRootEntry(hdr, opts.Limits) {
				e, err := x.chk.admit(hdr)
				if err != nil {
					return x.st, err
				}
				if e.op == opSkip {
					x.progress(hdr.Name)
				} else {
					held = append(held, rootEntry(e))
				}
				continue
			}
			deciding = false
			if err := x.decideRootfs(s, hdr, held); err != nil {
				return x.st, err
			}
			held = nil
		}
		if err := x.admitApply(s, hdr); err != nil {
			return x.st, err
		}
	}
	if deciding { // an archive of nothing but its root
		if err := x.decideRootfs(s, nil, held); err != nil {
			return x.st, err
		}
	}
	// A compressed stream's end (gzip's checksum) comes after the archive's.
	if err := s.drain(); err != nil {
		return x.st, err
	}
	if err := x.finish(); err != nil {
		return x.st, err
	}
	x.st.DiffID, x.st.StreamBytes = s.diffID(), s.cnt.n
	log.G(ctx).WithField("root", root.Name()).WithField("entries", x.st.Entries).
		WithField("bytes", x.st.Bytes).Debug("tarball extracted")
	return x.st, nil
}

// isRootEntry reports whether hdr is a bodiless entry for the archive
// root, which DetectRootfs holds until it decides. The entry types that
// never carry a body (a directory above all) are bodiless whatever their
// size field says: archive/tar reads none for them, and Validate counts
// them as the root too.
func isRootEntry(hdr *tar.Header, l Limits) bool {
	name, err := cleanName(hdr.Name, l.RootRelativeNames)
	if err != nil || name != "." {
		return false
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return true
	}
	return hdr.Size == 0
}

// rootEntry is e, an admitted entry for the archive root, with a header
// that keeps only what dir applies (owner, mode, times, extended
// attributes), copied out of the archive's PAX records so that the rest
// of them, up to 1 MiB per header, is not held with it.
func rootEntry(e entry) entry {
	h := e.hdr
	c := &tar.Header{
		Typeflag: h.Typeflag, Name: strings.Clone(h.Name), Mode: h.Mode, Uid: h.Uid, Gid: h.Gid,
		ModTime: h.ModTime, AccessTime: h.AccessTime,
	}
	for k, v := range h.PAXRecords {
		if strings.HasPrefix(k, xattrPAXPrefix) {
			if c.PAXRecords == nil {
				c.PAXRecords = make(map[string]string)
			}
			c.PAXRecords[strings.Clone(k)] = strings.Clone(v)
		}
	}
	e.hdr = c
	return e
}

// decideRootfs tells the checker what DetectRootfs decided: rootfs/ is
// the root when the first entry other than the archive root is rootfs/
// or under it (first is nil for an archive of nothing else). It then
// applies the held root entries, unless rootfs/ is the root.
func (x *extractor) decideRootfs(s *stream, first *tar.Header, held []entry) error {
	strip := false
	if first != nil {
		if name, err := cleanName(first.Name, x.chk.limits.RootRelativeNames); err == nil {
			_, strip = underRootfs(name)
		}
	}
	x.chk.strip = strip
	x.st.StrippedRootfs = strip
	for _, e := range held {
		if !strip {
			if err := x.apply(s, e); err != nil {
				return err
			}
		}
		x.progress(e.hdr.Name)
	}
	return nil
}

// admitApply checks hdr against the policy, applies it and drains what
// the entry did not read of its body (links, whiteouts).
func (x *extractor) admitApply(s *stream, hdr *tar.Header) error {
	e, err := x.chk.admit(hdr)
	if err != nil {
		return err
	}
	if err := x.apply(s, e); err != nil {
		return err
	}
	if _, err := io.CopyBuffer(io.Discard, body{s}, x.buf); err != nil {
		return err
	}
	x.progress(hdr.Name)
	return nil
}

type extractor struct {
	root *os.Root
	opts ExtractOptions
	chk  *checker
	cur  *cursor
	st   Stats
	buf  []byte

	// times are the access and modification times the archive gives
	// directories, by the key (checker.key) of their real root-relative
	// path: set when the entry is applied, and again whenever the cursor
	// leaves the directory (settle) and at the end (finish), since
	// writing in it changes them. Keyed by a hash, they cost a few dozen
	// bytes a directory whatever its name's length.
	times   map[uint64][2]unix.Timespec
	cleared map[uint64]struct{} // directories an opaque whiteout already emptied
	// links are where this archive made symlinks (and hard links to
	// symlinks), by the key (checker.key) of their real root-relative
	// path: lower symlinks on the way to them resolved.
	links map[uint64]struct{}
	// wrote holds, when lower symlinks are followed, the key of the real
	// root-relative path of every entry written and of its parents. Such
	// an entry may be at another name than the archive's (written through
	// lib -> usr/lib), and an opaque whiteout given by either name must
	// keep it (clearLower).
	wrote map[uint64]struct{}
}

// wroteAt records, when lower symlinks are followed, that the archive
// wrote base in l: the real path and its parents.
func (x *extractor) wroteAt(l *level, base string) {
	if !x.cur.follow {
		return
	}
	for p := path.Join(l.name, base); p != "."; p = path.Dir(p) {
		k := x.chk.key(p)
		if _, ok := x.wrote[k]; ok {
			return
		}
		x.wrote[k] = struct{}{}
	}
}

// madeSymlink reports whether the symlink at name, a real root-relative
// path, is one this archive made. Only a symlink in place asks: one the
// archive made and then replaced or removed is not met again, and a
// lower layer's symlink cannot come back at a name the archive wrote.
func (x *extractor) madeSymlink(name string) bool {
	_, ok := x.links[x.chk.key(name)]
	return ok
}

// madeLink records that this archive made a symlink at base in l.
func (x *extractor) madeLink(l *level, base string) {
	x.links[x.chk.key(path.Join(l.name, base))] = struct{}{}
}

func (x *extractor) progress(entry string) {
	if x.opts.Progress != nil {
		x.opts.Progress(Progress{Entries: x.st.Entries, Files: x.st.Files, Bytes: x.st.Bytes, Entry: entry})
	}
}

func (x *extractor) apply(s *stream, e entry) error {
	raw := e.hdr.Name
	var err error
	switch e.op {
	case opSkip:
		return nil
	case opDir:
		if e.name == "." && x.opts.KeepRootMetadata {
			return nil
		}
		x.st.Dirs++
		err = x.dir(raw, e)
	case opReg:
		x.st.Files++
		err = x.file(s, raw, e)
	case opSymlink:
		x.st.Symlinks++
		err = x.symlink(raw, e)
	case opHardlink:
		x.st.Hardlinks++
		err = x.hardlink(raw, e)
	case opFifo:
		x.st.Fifos++
		err = x.node(raw, e, unix.S_IFIFO, 0)
	case opDevice:
		x.st.Devices++
		typ := uint32(unix.S_IFCHR)
		if e.hdr.Typeflag == tar.TypeBlock {
			typ = unix.S_IFBLK
		}
		err = x.node(raw, e, typ, int(unix.Mkdev(uint32(e.hdr.Devmajor), uint32(e.hdr.Devminor))))
	case opWhiteout:
		x.st.Whiteouts++
		err = x.whiteout(raw, e.name)
	case opOpaque:
		x.st.Whiteouts++
		// The directory is made if missing, as for a whiteout's (see
		// whiteout); then there is nothing below it to clear.
		if _, err = x.cur.cd(raw, e.name, true); err == nil {
			err = x.clearLower(raw, e.name)
		}
	}
	var pe *PolicyError
	if err != nil && !errors.As(err, &pe) && !errors.Is(err, ErrMalformed) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		// The file system's message names the paths, which come from
		// the archive: escaped too.
		err = exhausted(fmt.Errorf("extract entry %s: %w", quote(raw), &escapedError{err}))
	}
	return err
}

// slot moves to the parent directory of name (made if missing) and clears
// the way for name's base there with prepare; exists reports a directory
// kept in place.
func (x *extractor) slot(raw, name string, isDir bool) (l *level, base string, exists bool, err error) {
	if l, err = x.cur.cd(raw, path.Dir(name), true); err != nil {
		return nil, "", false, err
	}
	base = path.Base(name)
	exists, err = x.prepare(l, base, isDir)
	if err == nil {
		x.wroteAt(l, base)
	}
	return l, base, exists, err
}

// fresh moves to the parent directory of name (made if missing) and runs
// create there on name's base; when something already has that name, it
// clears the way with prepare and runs create once more. Most entries of a
// layer are new names, so trying first spares them the Lstat that prepare
// costs, a system call per entry that shows in layers of many small files.
// create must fail with an error satisfying errors.Is(err, fs.ErrExist),
// and change nothing, when base exists in any form (a symlink included).
func (x *extractor) fresh(raw, name string, create func(l *level, base string) error) (*level, string, error) {
	l, err := x.cur.cd(raw, path.Dir(name), true)
	if err != nil {
		return nil, "", err
	}
	base := path.Base(name)
	err = create(l, base)
	if errors.Is(err, fs.ErrExist) {
		if _, err = x.prepare(l, base, false); err == nil {
			err = create(l, base)
		}
	}
	if err == nil {
		x.wroteAt(l, base)
	}
	return l, base, err
}

// createFile makes base in l a new, empty regular file open for writing.
// It opens the single component base from l's descriptor with O_NOFOLLOW
// and O_EXCL, which confines it as Root.OpenFile would; os.NewFile then
// spares the poller registration (and the four fcntl calls around it) that
// Root.OpenFile attempts for every file and a regular file always refuses.
func createFile(l *level, base string) (*os.File, error) {
	dir, err := l.fd()
	if err != nil {
		return nil, err
	}
	for {
		fd, err := unix.Openat(dir, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		switch {
		case err == nil:
			return os.NewFile(uintptr(fd), path.Join(l.name, base)), nil
		case err != unix.EINTR:
			return nil, &fs.PathError{Op: "openat", Path: path.Join(l.name, base), Err: err}
		}
	}
}

// prepare clears the way for a new entry base in l: an existing
// non-directory is removed, and so is an existing directory unless the new
// entry is one (directories merge). It reports whether a directory stays.
func (x *extractor) prepare(l *level, base string, isDir bool) (bool, error) {
	fi, err := l.r.Lstat(base)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.IsDir() {
		if isDir {
			return true, nil
		}
		return false, x.removeDir(l, base)
	}
	return false, l.r.Remove(base)
}

func (x *extractor) removeDir(l *level, base string) error {
	if err := l.r.RemoveAll(base); err != nil {
		return err
	}
	x.cur.removed(path.Join(l.name, base))
	return nil
}

func fileMode(m int64) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	return mode
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// entryTimes are the access and modification times an entry gets from its
// header's, as containerd's applier sets them: the access time is never
// older than the modification time (an absent one is the modification
// time), and a time before the epoch, or past what a time_t holds, is the
// epoch.
func entryTimes(atime, mtime time.Time) (time.Time, time.Time) {
	bound := func(t time.Time) time.Time {
		if t.Before(minEntryTime) || t.After(maxEntryTime) {
			return minEntryTime
		}
		return t
	}
	if atime.Before(mtime) {
		atime = mtime
	}
	return bound(atime), bound(mtime)
}

// The range of entry times kept as they are (entryTimes).
var (
	minEntryTime = time.Unix(0, 0)
	maxEntryTime = time.Unix(0, math.MaxInt64)
)

// setTimes sets base's times in l without following a symlink.
func setTimes(l *level, base string, atime, mtime time.Time) error {
	atime, mtime = entryTimes(atime, mtime)
	return setTimespec(l, base, [2]unix.Timespec{timespec(atime), timespec(mtime)})
}

// setTimespec sets base's access and modification times in l (ts) without
// following a symlink.
func setTimespec(l *level, base string, ts [2]unix.Timespec) error {
	fd, err := l.fd()
	if err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(fd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimensat", Path: path.Join(l.name, base), Err: err}
	}
	return nil
}

func (x *extractor) chown(l *level, base string, h *tar.Header) error {
	if x.opts.NoChown {
		return nil
	}
	return l.r.Lchown(base, h.Uid, h.Gid)
}

// xattrs applies the archive's user.* extended attributes to fd, and its
// file capability (security.capability) when the limits admit it (the
// checker refused it otherwise) and entries are owned as archived: it is
// set after the owner, since a chown clears it, and needs the privilege
// chown does. A user.* attribute the filesystem refuses is skipped (and
// counted); a capability admitted but not applied would leave a binary
// that fails at run time, so that is an error, and a value the kernel
// finds invalid a rejection of the entry.
//
// The attributes' bytes (e.xattrBytes, every record) count against
// ExtractOptions.MaxDataBytes before any is set.
func (x *extractor) xattrs(fd int, raw string, e entry) error {
	if err := x.charge(raw, e.xattrBytes); err != nil {
		return err
	}
	x.st.XattrBytes += e.xattrBytes
	h := e.hdr
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPAXPrefix)
		if !ok {
			continue
		}
		if name == capabilityXattr && x.chk.limits.AllowSetID && !x.opts.NoChown {
			err := unix.Fsetxattr(fd, name, []byte(v), 0)
			switch {
			case errors.Is(err, unix.EINVAL):
				return reject(raw, ErrFileCapability, "the kernel refuses its value (%d bytes)", len(v))
			case err != nil:
				return fmt.Errorf("entry %s: set %s: %w", quote(raw), name, err)
			}
			x.st.Capabilities++
			continue
		}
		if !strings.HasPrefix(name, "user.") || unix.Fsetxattr(fd, name, []byte(v), 0) != nil {
			x.st.XattrsSkipped++
		}
	}
	return nil
}

func hasXattrs(h *tar.Header) bool {
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, xattrPAXPrefix) {
			return true
		}
	}
	return false
}

func (x *extractor) dir(raw string, e entry) error {
	h := e.hdr
	var (
		l      *level
		base   = "."
		exists = true
		err    error
	)
	if e.name == "." {
		l, err = x.cur.cd(raw, ".", false)
	} else {
		l, base, exists, err = x.slot(raw, e.name, true)
	}
	if err != nil {
		return err
	}
	if !exists {
		if err := l.r.Mkdir(base, 0o700); err != nil {
			return err
		}
	}
	if err := x.chown(l, base, h); err != nil {
		return err
	}
	if err := l.r.Chmod(base, fileMode(h.Mode)); err != nil {
		return err
	}
	if hasXattrs(h) {
		f, err := l.r.Open(base)
		if err != nil {
			return err
		}
		err = x.xattrs(int(f.Fd()), raw, e)
		f.Close()
		if err != nil {
			return err
		}
	}
	atime, mtime := entryTimes(h.AccessTime, h.ModTime)
	ts := [2]unix.Timespec{timespec(atime), timespec(mtime)}
	x.times[x.chk.key(path.Join(l.name, base))] = ts
	return setTimespec(l, base, ts)
}

// settle sets the times the archive gave the directory of l, if it gave
// any, as the cursor leaves it: what was written in it since changed them.
func (x *extractor) settle(l *level) error {
	ts, ok := x.times[l.key]
	if !ok {
		return nil
	}
	return setTimespec(l, ".", ts)
}

// countingBody reports progress while a large file is copied.
type countingBody struct {
	x    *extractor
	r    io.Reader
	raw  string
	next int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.x.st.Bytes += int64(n)
	if c.x.opts.Progress != nil && c.x.st.Bytes >= c.next {
		c.next = c.x.st.Bytes + progressEvery
		c.x.progress(c.raw)
	}
	return n, err
}

func (x *extractor) file(s *stream, raw string, e entry) (err error) {
	h := e.hdr
	var f *os.File
	l, base, err := x.fresh(raw, e.name, func(l *level, base string) (err error) {
		f, err = createFile(l, base)
		return err
	})
	if err != nil {
		return err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			if rerr := l.r.Remove(base); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = fmt.Errorf("%w (and removing the partial file: %v)", err, rerr)
			}
		}
	}()
	src := &countingBody{x: x, r: body{s}, raw: raw, next: x.st.Bytes + progressEvery}
	if err := x.copySparse(f, src, raw); err != nil {
		return err
	}
	if !x.opts.NoChown {
		if err := f.Chown(h.Uid, h.Gid); err != nil {
			return err
		}
	}
	if err := f.Chmod(fileMode(h.Mode)); err != nil {
		return err
	}
	if hasXattrs(h) {
		if err := x.xattrs(int(f.Fd()), raw, e); err != nil {
			return err
		}
	}
	cerr := f.Close()
	f = nil
	if cerr != nil {
		return cerr
	}
	return setTimes(l, base, h.AccessTime, h.ModTime)
}

// holeBlock is the granularity of the holes copySparse leaves: a file
// system block.
const holeBlock = 4096

var zeroBlock [holeBlock]byte

// copySparse copies a file's content into the new, empty file f, leaving
// every block-aligned run of zeros as a hole instead of writing it: the
// holes of a sparse entry (read back as zeros) cost no space, whatever
// size the header claims. Only the bytes written count against
// ExtractOptions.MaxDataBytes.
func (x *extractor) copySparse(f *os.File, src io.Reader, raw string) error {
	var off, end int64 // bytes of content so far; end of the written part
	for {
		n, rerr := src.Read(x.buf)
		for p := x.buf[:n]; len(p) > 0; {
			// One block (up to the next aligned offset), then extend a
			// write over the following non-zero blocks.
			k := min(int64(len(p)), holeBlock-off%holeBlock)
			if bytes.Equal(p[:k], zeroBlock[:k]) {
				off, p = off+k, p[k:]
				continue
			}
			for k < int64(len(p)) {
				next := min(int64(len(p)), k+holeBlock)
				if bytes.Equal(p[k:next], zeroBlock[:next-k]) {
					break
				}
				k = next
			}
			if err := x.charge(raw, k); err != nil {
				return err
			}
			if _, err := f.WriteAt(p[:k], off); err != nil {
				return err
			}
			x.st.Written += k
			off, p = off+k, p[k:]
			end = off
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if off > end {
		return f.Truncate(off)
	}
	return nil
}

// charge refuses (ErrOverBudget) writing n more bytes of file data or
// extended attributes when that would pass ExtractOptions.MaxDataBytes.
func (x *extractor) charge(raw string, n int64) error {
	if budget := x.opts.MaxDataBytes; budget > 0 && x.st.Written+x.st.XattrBytes+n > budget {
		return reject(raw, ErrOverBudget, "more than %d bytes of file data and extended attributes", budget)
	}
	return nil
}

func (x *extractor) symlink(raw string, e entry) error {
	l, base, err := x.fresh(raw, e.name, func(l *level, base string) error {
		return l.r.Symlink(e.link, base)
	})
	if err != nil {
		return err
	}
	x.madeLink(l, base)
	if err := x.chown(l, base, e.hdr); err != nil {
		return err
	}
	return setTimes(l, base, e.hdr.AccessTime, e.hdr.ModTime)
}

func (x *extractor) hardlink(raw string, e entry) error {
	// The target's directories must be real ones too: Root.Link below
	// walks both names, and must have no symlink to follow.
	l, err := x.cur.cd(raw, path.Dir(e.link), false)
	if err != nil {
		return err
	}
	ok, typ := l != nil, fs.FileMode(0)
	if ok {
		fi, err := l.r.Lstat(path.Base(e.link))
		ok = err == nil && !fi.IsDir()
		if ok {
			typ = fi.Mode().Type()
		}
	}
	if !ok {
		return reject(raw, ErrHardlinkTarget, "-> %s is not in the tree", quote(e.link))
	}
	// Link from the two directories' descriptors: a walk of both names
	// from the root would cost a system call per component.
	src, err := l.r.Open(".")
	if err != nil {
		return err
	}
	defer src.Close()
	dst, base, _, err := x.slot(raw, e.name, false)
	if err != nil {
		return err
	}
	fd, err := dst.fd()
	if err != nil {
		return err
	}
	if err := unix.Linkat(int(src.Fd()), path.Base(e.link), fd, base, 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			// The target was there before the entry's name was cleared:
			// it lay under that name (reached through a lower symlink),
			// and the layer, not the disk, is at fault.
			return reject(raw, ErrHardlinkTarget, "-> %s lay under the name this entry replaces", quote(e.link))
		}
		return &os.LinkError{Op: "linkat", Old: e.link, New: e.name, Err: err}
	}
	if typ == fs.ModeSymlink {
		// A second name of a symlink is one more symlink the archive
		// made; the checker knows it as a hard link, which no entry may
		// be below, by its name in the archive only.
		x.madeLink(dst, base)
	}
	return x.linkMetadata(dst, base, raw, e, typ)
}

// linkMetadata gives the inode a hard link entry named (base in l, of type
// typ) the entry's owner, mode, extended attributes and times, as
// containerd's applier does: the header of a hard link describes the file
// as much as the target's did, and the last one applied is what the file
// keeps. A symlink's mode cannot change; only a regular file is opened,
// and only to set its extended attributes.
func (x *extractor) linkMetadata(l *level, base, raw string, e entry, typ fs.FileMode) error {
	h := e.hdr
	if err := x.chown(l, base, h); err != nil {
		return err
	}
	if typ != fs.ModeSymlink {
		if err := l.r.Chmod(base, fileMode(h.Mode)); err != nil {
			return err
		}
	}
	if typ == 0 && hasXattrs(h) {
		f, err := l.r.OpenFile(base, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		err = x.xattrs(int(f.Fd()), raw, e)
		f.Close()
		if err != nil {
			return err
		}
	}
	return setTimes(l, base, h.AccessTime, h.ModTime)
}

// node makes a named pipe or a device (typ, one of S_IFIFO, S_IFCHR and
// S_IFBLK, with dev its number), private until its owner and mode are set.
func (x *extractor) node(raw string, e entry, typ uint32, dev int) error {
	l, base, _, err := x.slot(raw, e.name, false)
	if err != nil {
		return err
	}
	fd, err := l.fd()
	if err != nil {
		return err
	}
	if err := unix.Mknodat(fd, base, typ|0o600, dev); err != nil {
		return &fs.PathError{Op: "mknodat", Path: e.name, Err: err}
	}
	if err := x.chown(l, base, e.hdr); err != nil {
		return err
	}
	if err := l.r.Chmod(base, fileMode(e.hdr.Mode)); err != nil {
		return err
	}
	return setTimes(l, base, e.hdr.AccessTime, e.hdr.ModTime)
}

// whiteout removes name (from a lower layer, or written earlier by this
// archive); a missing name is fine. A missing directory of it is made, as
// containerd's applier makes an entry's parents before it sees that the
// entry is a whiteout, and as overlayfs shows the directory that holds a
// whiteout in the layer.
func (x *extractor) whiteout(raw, name string) error {
	l, err := x.cur.cd(raw, path.Dir(name), true)
	if err != nil {
		return err
	}
	return x.remove(l, path.Base(name))
}

func (x *extractor) remove(l *level, base string) error {
	fi, err := l.r.Lstat(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	x.st.Removed++
	if fi.IsDir() {
		return x.removeDir(l, base)
	}
	return l.r.Remove(base)
}

// clearLower applies an opaque whiteout to directory dir: everything below
// it that this archive did not write is removed (a directory this archive
// wrote is kept, and cleared the same way). A directory is cleared at most
// once: afterwards it only holds what this archive writes, so repeated
// markers cost nothing.
func (x *extractor) clearLower(raw, dir string) error {
	return x.clearDir(raw, dir, dir)
}

// clearDir is clearLower of dir, entered as at. Once entered, the
// directory is entered again by its real path (the lower symlinks on the
// way resolved): dir may be named through a lower symlink inside it
// (a/self -> .), which the clearing removes with the rest.
func (x *extractor) clearDir(raw, dir, at string) error {
	k := x.chk.key(dir)
	if _, done := x.cleared[k]; done {
		return nil
	}
	l, err := x.cur.cd(raw, at, false)
	if l == nil || err != nil {
		return err
	}
	x.cleared[k] = struct{}{}
	f, err := l.r.Open(".")
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	realDir := l.name // dir with the lower symlinks on its way resolved
	for _, n := range names {
		child := path.Join(dir, n)
		_, wrote := x.wrote[x.chk.key(path.Join(realDir, n))]
		if l, err = x.cur.cd(raw, realDir, false); l == nil || err != nil {
			return err
		}
		if !wrote && !x.chk.written(child) {
			if err := x.remove(l, n); err != nil {
				return err
			}
			continue
		}
		if fi, err := l.r.Lstat(n); err == nil && fi.IsDir() {
			if err := x.clearDir(raw, child, path.Join(realDir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish sets the times of the directories the cursor is still in, the
// root's last: the others were set when the cursor last left them.
func (x *extractor) finish() error {
	if err := x.cur.pop(1, true); err != nil {
		return err
	}
	return x.settle(x.cur.top())
}
