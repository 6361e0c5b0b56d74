package tarball

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	// with ErrOutsideRootfs, and the archive root entry "./" is ignored.
	StripRootfs bool
	// NoChown leaves every entry owned by the extracting user instead of the
	// archive's uid/gid (for unprivileged tools and tests).
	NoChown bool
	// Progress, if set, is called after every entry and every 8 MiB of a
	// large file, on the extracting goroutine: it must return quickly.
	Progress func(Progress)
}

// Progress is a snapshot of an extraction under way.
type Progress struct {
	Entries int    // headers processed
	Files   int    // regular files written
	Bytes   int64  // file content written
	Entry   string // the entry being extracted
}

// Stats describes a finished (or failed) extraction.
type Stats struct {
	Entries   int   // headers read
	Files     int   // regular files written
	Dirs      int   // directories made or updated
	Symlinks  int   // symlinks made
	Hardlinks int   // hard links made
	Fifos     int   // named pipes made
	Whiteouts int   // whiteout entries applied (.wh.<name>, .wh..wh..opq)
	Removed   int   // names removed by whiteouts (lower-layer content)
	Bytes     int64 // file content written
	// XattrsSkipped counts extended attributes not applied: only user.*
	// attributes are set, and only where the filesystem supports them.
	XattrsSkipped int
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

// Extract streams the tar archive r into root, applying the same policy as
// Validate entry by entry, so it is safe on an archive that was never
// validated: every name, link and whiteout is confined to root by os.Root,
// no symlink is ever followed (an entry below a symlink, whether the symlink
// comes from this archive or from content already in root, is rejected with
// ErrThroughSymlink), and a rejection is a *PolicyError or *FormatError
// naming the entry. root may hold lower layers: OCI whiteouts in r remove
// their content (.wh.<name> removes <name>; .wh..wh..opq empties its
// directory of everything this archive does not itself write), and entries
// replace what is there. Modes, ownership (unless NoChown), modification
// times, user.* xattrs and hard links are preserved. Memory use is bounded
// by the limits, not by the archive's size.
//
// On error the entry being written is removed (no partial file is left);
// the entries written before it remain, for the caller to discard along with
// the target.
func Extract(ctx context.Context, r io.Reader, root *os.Root, opts ExtractOptions) (Stats, error) {
	x := &extractor{
		root:     root,
		opts:     opts,
		chk:      newChecker(opts.Limits, opts.StripRootfs),
		verified: make(map[uint64]struct{}),
		buf:      make([]byte, readBufferSize),
	}
	x.top = parentDir{name: ".", r: root}
	defer x.close()
	s := newStream(ctx, r)
	for {
		hdr, err := s.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return x.st, err
		}
		x.st.Entries++
		e, err := x.chk.admit(hdr)
		if err != nil {
			return x.st, err
		}
		if err := x.apply(s, e); err != nil {
			return x.st, err
		}
		// Drain what the entry did not read (bodies of links, whiteouts).
		if _, err := io.CopyBuffer(io.Discard, body{s}, x.buf); err != nil {
			return x.st, err
		}
		x.progress(hdr.Name)
	}
	if err := x.finish(); err != nil {
		return x.st, err
	}
	log.G(ctx).WithField("root", root.Name()).WithField("entries", x.st.Entries).
		WithField("bytes", x.st.Bytes).Debug("tarball extracted")
	return x.st, nil
}

// parentDir is an open directory entries are created in, as a sub-root, so
// each operation on a name in it costs one system call.
type parentDir struct {
	name string   // root-relative
	r    *os.Root // confined to the directory
	f    *os.File // the directory itself, opened on demand for *at calls
}

type extractor struct {
	root *os.Root
	opts ExtractOptions
	chk  *checker
	st   Stats
	buf  []byte

	// verified holds directories known to be real directories reached
	// without any symlink; cleared whenever a directory is removed.
	verified map[uint64]struct{}
	top      parentDir // the root itself
	cur      parentDir // the most recent other parent directory
	dirTimes []dirTime // applied at the end: writing children changes them
}

type dirTime struct {
	name         string
	atime, mtime time.Time
}

func (x *extractor) close() {
	x.closeCur()
	if x.top.f != nil {
		x.top.f.Close()
		x.top.f = nil
	}
}

func (x *extractor) closeCur() {
	if x.cur.f != nil {
		x.cur.f.Close()
	}
	if x.cur.r != nil {
		x.cur.r.Close()
	}
	x.cur = parentDir{}
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
		err = x.fifo(raw, e)
	case opWhiteout:
		x.st.Whiteouts++
		err = x.whiteout(raw, e.name)
	case opOpaque:
		x.st.Whiteouts++
		var ok bool
		if ok, err = x.ensureDir(raw, e.name, false); ok && err == nil {
			err = x.clearLower(raw, e.name)
		}
	}
	var pe *PolicyError
	if err != nil && !errors.As(err, &pe) && !errors.Is(err, ErrMalformed) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("extract entry %q: %w", raw, err)
	}
	return err
}

// ensureDir makes sure dir is a real directory reached through real
// directories only. With create, missing directories are made (mode 0755);
// without, a missing one returns false. A symlink on the way is a rejection.
func (x *extractor) ensureDir(raw, dir string, create bool) (bool, error) {
	if dir == "." {
		return true, nil
	}
	k := x.chk.key(dir)
	if _, ok := x.verified[k]; ok {
		return true, nil
	}
	if ok, err := x.ensureDir(raw, path.Dir(dir), create); !ok || err != nil {
		return ok, err
	}
	fi, err := x.root.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if !create {
			return false, nil
		}
		if err := x.root.Mkdir(dir, 0o755); err != nil {
			return false, err
		}
	case err != nil:
		return false, err
	case fi.Mode()&fs.ModeSymlink != 0:
		return false, reject(raw, ErrThroughSymlink, "%s is a symlink", dir)
	case !fi.IsDir():
		return false, reject(raw, ErrParentNotDir, "%s", dir)
	}
	x.verified[k] = struct{}{}
	return true, nil
}

// parent returns the (created if needed) directory dir, open as a sub-root.
func (x *extractor) parent(raw, dir string) (*parentDir, error) {
	if dir == "." {
		return &x.top, nil
	}
	if x.cur.r != nil && x.cur.name == dir {
		return &x.cur, nil
	}
	if _, err := x.ensureDir(raw, dir, true); err != nil {
		return nil, err
	}
	x.closeCur()
	r, err := x.root.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	x.cur = parentDir{name: dir, r: r}
	return &x.cur, nil
}

func (p *parentDir) fd() (int, error) {
	if p.f == nil {
		f, err := p.r.Open(".")
		if err != nil {
			return -1, err
		}
		p.f = f
	}
	return int(p.f.Fd()), nil
}

// invalidate forgets verified directories after the directory removed (a
// root-relative name) was deleted.
func (x *extractor) invalidate(removed string) {
	clear(x.verified)
	if x.cur.r != nil && (x.cur.name == removed || strings.HasPrefix(x.cur.name, removed+"/")) {
		x.closeCur()
	}
}

// prepare clears the way for a new entry base in p: an existing non-directory
// is removed, and so is an existing directory unless the new entry is one
// (directories merge). It reports whether a directory stays in place.
func (x *extractor) prepare(p *parentDir, base string, isDir bool) (bool, error) {
	fi, err := p.r.Lstat(base)
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
		if err := p.r.RemoveAll(base); err != nil {
			return false, err
		}
		x.invalidate(path.Join(p.name, base))
		return false, nil
	}
	return false, p.r.Remove(base)
}

// slot returns the parent directory of name (made if missing) and name's
// base, with the way cleared by prepare; exists reports a directory kept.
func (x *extractor) slot(raw, name string, isDir bool) (p *parentDir, base string, exists bool, err error) {
	if p, err = x.parent(raw, path.Dir(name)); err != nil {
		return nil, "", false, err
	}
	base = path.Base(name)
	exists, err = x.prepare(p, base, isDir)
	return p, base, exists, err
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

func timespecs(h *tar.Header) []unix.Timespec {
	at := h.AccessTime
	if at.IsZero() {
		at = h.ModTime
	}
	return []unix.Timespec{timespec(at), timespec(h.ModTime)}
}

// setTimes sets base's times in p without following a symlink.
func setTimes(p *parentDir, base string, h *tar.Header) error {
	fd, err := p.fd()
	if err != nil {
		return err
	}
	return unix.UtimesNanoAt(fd, base, timespecs(h), unix.AT_SYMLINK_NOFOLLOW)
}

func (x *extractor) chown(p *parentDir, base string, h *tar.Header) error {
	if x.opts.NoChown {
		return nil
	}
	return p.r.Lchown(base, h.Uid, h.Gid)
}

// userXattrs applies the archive's user.* extended attributes to fd.
func (x *extractor) userXattrs(fd int, h *tar.Header) {
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPAXPrefix)
		if !ok {
			continue
		}
		if !strings.HasPrefix(name, "user.") || unix.Fsetxattr(fd, name, []byte(v), 0) != nil {
			x.st.XattrsSkipped++
		}
	}
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
	if e.name == "." {
		if !x.opts.NoChown {
			if err := x.root.Lchown(".", h.Uid, h.Gid); err != nil {
				return err
			}
		}
		if err := x.root.Chmod(".", fileMode(h.Mode)); err != nil {
			return err
		}
		x.dirTimes = append(x.dirTimes, dirTime{".", h.AccessTime, h.ModTime})
		return nil
	}
	p, base, exists, err := x.slot(raw, e.name, true)
	if err != nil {
		return err
	}
	if !exists {
		if err := p.r.Mkdir(base, 0o700); err != nil {
			return err
		}
	}
	if err := x.chown(p, base, h); err != nil {
		return err
	}
	if err := p.r.Chmod(base, fileMode(h.Mode)); err != nil {
		return err
	}
	if hasXattrs(h) {
		f, err := p.r.Open(base)
		if err != nil {
			return err
		}
		x.userXattrs(int(f.Fd()), h)
		f.Close()
	}
	x.verified[x.chk.key(e.name)] = struct{}{}
	x.dirTimes = append(x.dirTimes, dirTime{e.name, h.AccessTime, h.ModTime})
	return nil
}

// writerOnly and readerOnly hide ReadFrom/WriteTo so io.CopyBuffer uses our
// buffer and our context-checking, error-classifying reader.
type writerOnly struct{ io.Writer }
type readerOnly struct{ io.Reader }

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
	p, base, _, err := x.slot(raw, e.name, false)
	if err != nil {
		return err
	}
	f, err := p.r.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			if rerr := p.r.Remove(base); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = fmt.Errorf("%w (and removing the partial file: %v)", err, rerr)
			}
		}
	}()
	src := &countingBody{x: x, r: body{s}, raw: raw, next: x.st.Bytes + progressEvery}
	if _, err := io.CopyBuffer(writerOnly{f}, readerOnly{src}, x.buf); err != nil {
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
		x.userXattrs(int(f.Fd()), h)
	}
	cerr := f.Close()
	f = nil
	if cerr != nil {
		return cerr
	}
	return setTimes(p, base, h)
}

func (x *extractor) symlink(raw string, e entry) error {
	p, base, _, err := x.slot(raw, e.name, false)
	if err != nil {
		return err
	}
	if err := p.r.Symlink(e.link, base); err != nil {
		return err
	}
	if err := x.chown(p, base, e.hdr); err != nil {
		return err
	}
	return setTimes(p, base, e.hdr)
}

func (x *extractor) hardlink(raw string, e entry) error {
	ok, err := x.ensureDir(raw, path.Dir(e.link), false)
	if err != nil {
		return err
	}
	if ok {
		fi, err := x.root.Lstat(e.link)
		ok = err == nil && !fi.IsDir()
	}
	if !ok {
		return reject(raw, ErrHardlinkTarget, "-> %s is not in the tree", e.link)
	}
	if _, _, _, err := x.slot(raw, e.name, false); err != nil {
		return err
	}
	return x.root.Link(e.link, e.name)
}

func (x *extractor) fifo(raw string, e entry) error {
	p, base, _, err := x.slot(raw, e.name, false)
	if err != nil {
		return err
	}
	fd, err := p.fd()
	if err != nil {
		return err
	}
	if err := unix.Mkfifoat(fd, base, 0o600); err != nil {
		return &fs.PathError{Op: "mkfifoat", Path: e.name, Err: err}
	}
	if err := x.chown(p, base, e.hdr); err != nil {
		return err
	}
	if err := p.r.Chmod(base, fileMode(e.hdr.Mode)); err != nil {
		return err
	}
	return setTimes(p, base, e.hdr)
}

// whiteout removes name (from a lower layer, or written earlier by this
// archive); a missing name or directory is fine.
func (x *extractor) whiteout(raw, name string) error {
	dir := path.Dir(name)
	ok, err := x.ensureDir(raw, dir, false)
	if !ok || err != nil {
		return err
	}
	p, err := x.parent(raw, dir)
	if err != nil {
		return err
	}
	return x.remove(p, path.Base(name))
}

func (x *extractor) remove(p *parentDir, base string) error {
	fi, err := p.r.Lstat(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	x.st.Removed++
	if fi.IsDir() {
		if err := p.r.RemoveAll(base); err != nil {
			return err
		}
		x.invalidate(path.Join(p.name, base))
		return nil
	}
	return p.r.Remove(base)
}

// clearLower applies an opaque whiteout to the verified directory dir:
// everything below it that this archive did not write is removed (a
// directory this archive wrote is kept, and cleared the same way).
func (x *extractor) clearLower(raw, dir string) error {
	f, err := x.root.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		child := path.Join(dir, n)
		if x.chk.written(child) {
			fi, err := x.root.Lstat(child)
			if err != nil {
				return err
			}
			if fi.IsDir() {
				x.verified[x.chk.key(child)] = struct{}{}
				if err := x.clearLower(raw, child); err != nil {
					return err
				}
			}
			continue
		}
		p, err := x.parent(raw, dir)
		if err != nil {
			return err
		}
		if err := x.remove(p, n); err != nil {
			return err
		}
	}
	return nil
}

// finish sets the directories' times, now that nothing more is written in
// them; a directory replaced or removed since is skipped.
func (x *extractor) finish() error {
	for i := len(x.dirTimes) - 1; i >= 0; i-- {
		d := x.dirTimes[i]
		if d.name != "." {
			ok, err := x.ensureDir(d.name, d.name, false)
			var pe *PolicyError
			if errors.As(err, &pe) || !ok {
				continue
			}
			if err != nil {
				return fmt.Errorf("set times of %q: %w", d.name, err)
			}
		}
		at := d.atime
		if at.IsZero() {
			at = d.mtime
		}
		if err := x.root.Chtimes(d.name, at, d.mtime); err != nil {
			return fmt.Errorf("set times of %q: %w", d.name, err)
		}
	}
	return nil
}
