package tarball

import (
	"archive/tar"
	"hash/maphash"
	"path"
	"strings"
)

// Default limits of the extraction policy (DESIGN.md).
const (
	DefaultMaxEntries   = 100_000
	DefaultMaxFileSize  = 1 << 30  // 1 GiB
	DefaultMaxTotalSize = 10 << 30 // 10 GiB

	maxNameLen      = 4095 // PATH_MAX without its NUL
	maxComponentLen = 255  // NAME_MAX
	maxOwnerID      = 1<<32 - 2
	whiteoutPrefix  = ".wh."
	whiteoutMeta    = ".wh..wh."
	whiteoutOpaque  = ".wh..wh..opq"
	rootfsDir       = "rootfs"
	xattrPAXPrefix  = "SCHILY.xattr."
	capabilityXattr = "security.capability"
)

// Limits bounds what an archive may hold. A zero field means the default.
type Limits struct {
	MaxEntries   int   // headers of any kind; default 100,000
	MaxFileSize  int64 // bytes of one regular file; default 1 GiB
	MaxTotalSize int64 // bytes of all regular files together; default 10 GiB
	// AllowSetID turns off the ErrSetID and ErrFileCapability rules. It is
	// off by default, as DESIGN.md's policy says; real distribution images
	// (su, passwd, mount) carry setuid files, so an operator who trusts the
	// source may need it.
	AllowSetID bool
}

func (l Limits) withDefaults() Limits {
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxFileSize <= 0 {
		l.MaxFileSize = DefaultMaxFileSize
	}
	if l.MaxTotalSize <= 0 {
		l.MaxTotalSize = DefaultMaxTotalSize
	}
	return l
}

// op is what an admitted entry asks the extractor to do.
type op uint8

const (
	opSkip     op = iota // nothing to create (pax global header, aufs metadata)
	opDir                // make or update a directory
	opReg                // write a regular file
	opSymlink            // make a symlink (never followed)
	opHardlink           // link to an earlier entry
	opFifo               // make a named pipe
	opWhiteout           // remove name (a lower layer's entry)
	opOpaque             // remove the lower content of directory name
)

// kind is what the checker remembers about a name of the archive.
type kind uint8

const (
	kNone kind = iota
	kDir
	kReg
	kSymlink
	kHardlink
	kFifo
	kRemoved // whited out; a later implicit or explicit entry re-creates it
)

type node struct {
	kind   kind
	serial uint32 // when the name was (re)created; used to tell stale names
}

// entry is a header the checker admitted, with names normalised.
type entry struct {
	op   op
	name string // root-relative slash path, "." for the root; after stripping
	link string // opHardlink: normalised target; opSymlink: target as written
	hdr  *tar.Header
}

// checker applies the extraction policy to a stream of headers. It remembers
// what kind of thing every name is (keyed by a seeded 64-bit hash, so memory
// is a few dozen bytes per entry whatever the name lengths) in order to
// refuse writes through symlinks and hard links to unknown names in a single
// pass. Validate and Extract share it, so both apply exactly the same rules.
type checker struct {
	limits Limits
	strip  bool // map rootfs/ to the root, refuse entries outside it
	seed   maphash.Seed
	nodes  map[uint64]node
	serial uint32

	entries int
	total   int64
}

func newChecker(limits Limits, strip bool) *checker {
	return &checker{limits: limits.withDefaults(), strip: strip, seed: maphash.MakeSeed(), nodes: make(map[uint64]node)}
}

func (c *checker) key(name string) uint64 { return maphash.String(c.seed, name) }

// cleanName turns an archive name into a root-relative clean slash path
// ("." is the root), or names the rule it breaks.
func cleanName(raw string) (string, error) {
	if raw == "" {
		return "", ErrInvalidName
	}
	if strings.HasPrefix(raw, "/") {
		return "", ErrAbsoluteName
	}
	c := path.Clean(raw)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", ErrTraversal
	}
	if len(c) > maxNameLen {
		return "", ErrNameTooLong
	}
	for rest := c; rest != ""; {
		comp, tail, _ := strings.Cut(rest, "/")
		if len(comp) > maxComponentLen {
			return "", ErrNameTooLong
		}
		rest = tail
	}
	return c, nil
}

// underRootfs maps a clean name to its place once rootfs/ is stripped.
func underRootfs(name string) (string, bool) {
	if name == rootfsDir {
		return ".", true
	}
	if rest, ok := strings.CutPrefix(name, rootfsDir+"/"); ok {
		return rest, true
	}
	return "", false
}

// escapes reports whether a relative symlink at name pointing at target
// resolves (lexically) above the root.
func escapes(name, target string) bool {
	r := path.Join(path.Dir(name), target)
	return r == ".." || strings.HasPrefix(r, "../")
}

// admit checks one header against the policy and records it. A nil error
// and op opSkip means there is nothing to create.
func (c *checker) admit(hdr *tar.Header) (entry, error) {
	raw := hdr.Name
	c.entries++
	if c.entries > c.limits.MaxEntries {
		return entry{}, reject(raw, ErrTooManyEntries, "more than %d", c.limits.MaxEntries)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return entry{op: opSkip, hdr: hdr}, nil
	}
	name, err := cleanName(raw)
	if err != nil {
		return entry{}, reject(raw, err, "")
	}
	if c.strip {
		if name == "." {
			return entry{op: opSkip, hdr: hdr}, nil // the archive root above rootfs/
		}
		s, ok := underRootfs(name)
		if !ok {
			return entry{}, reject(raw, ErrOutsideRootfs, "")
		}
		name = s
	}
	if hdr.Uid < 0 || hdr.Uid > maxOwnerID || hdr.Gid < 0 || hdr.Gid > maxOwnerID {
		return entry{}, reject(raw, ErrBadOwner, "uid %d gid %d", hdr.Uid, hdr.Gid)
	}
	if !c.limits.AllowSetID {
		if _, ok := hdr.PAXRecords[xattrPAXPrefix+capabilityXattr]; ok {
			return entry{}, reject(raw, ErrFileCapability, "")
		}
	}

	base := path.Base(name)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return c.admitWhiteout(raw, name, base, hdr)
	}

	e := entry{name: name, hdr: hdr}
	var k kind
	switch hdr.Typeflag {
	case tar.TypeDir:
		e.op, k = opDir, kDir
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse, tar.TypeCont:
		e.op, k = opReg, kReg
		if hdr.Size > c.limits.MaxFileSize {
			return entry{}, reject(raw, ErrFileTooLarge, "%d bytes, limit %d", hdr.Size, c.limits.MaxFileSize)
		}
		c.total += hdr.Size
		if c.total > c.limits.MaxTotalSize {
			return entry{}, reject(raw, ErrTotalTooLarge, "more than %d bytes of files", c.limits.MaxTotalSize)
		}
	case tar.TypeSymlink:
		e.op, k = opSymlink, kSymlink
		e.link = hdr.Linkname
		switch {
		case e.link == "":
			return entry{}, reject(raw, ErrInvalidName, "empty symlink target")
		case len(e.link) > maxNameLen:
			return entry{}, reject(raw, ErrNameTooLong, "symlink target of %d bytes", len(e.link))
		case !strings.HasPrefix(e.link, "/") && escapes(name, e.link):
			return entry{}, reject(raw, ErrSymlinkEscape, "-> %s", e.link)
		}
	case tar.TypeLink:
		e.op, k = opHardlink, kHardlink
		t, err := c.linkTarget(raw, name, hdr.Linkname)
		if err != nil {
			return entry{}, err
		}
		e.link = t
	case tar.TypeFifo:
		e.op, k = opFifo, kFifo
	case tar.TypeChar, tar.TypeBlock:
		return entry{}, reject(raw, ErrDeviceNode, "%d:%d", hdr.Devmajor, hdr.Devminor)
	default:
		return entry{}, reject(raw, ErrUnsupportedType, "type %q", hdr.Typeflag)
	}
	if name == "." && e.op != opDir {
		return entry{}, reject(raw, ErrRootNotDir, "")
	}
	if !c.limits.AllowSetID && e.op != opHardlink {
		if hdr.Mode&04000 != 0 || (hdr.Mode&02000 != 0 && e.op != opDir) {
			return entry{}, reject(raw, ErrSetID, "mode %04o", hdr.Mode&07777)
		}
	}
	if _, err := c.ancestors(raw, path.Dir(name), true); err != nil {
		return entry{}, err
	}
	key := c.key(name)
	if old, ok := c.nodes[key]; !(ok && old.kind == kDir && k == kDir) {
		c.serial++
		c.nodes[key] = node{kind: k, serial: c.serial}
	}
	return e, nil
}

func (c *checker) admitWhiteout(raw, name, base string, hdr *tar.Header) (entry, error) {
	if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA {
		return entry{}, reject(raw, ErrUnsupportedType, "whiteout of type %q, want a regular file", hdr.Typeflag)
	}
	dir := path.Dir(name)
	if _, err := c.ancestors(raw, dir, false); err != nil {
		return entry{}, err
	}
	if dir != "." {
		// The whited-out directory itself must not be a symlink either.
		if n, ok := c.nodes[c.key(dir)]; ok {
			switch n.kind {
			case kSymlink:
				return entry{}, reject(raw, ErrThroughSymlink, "%s is a symlink", dir)
			case kReg, kHardlink, kFifo:
				return entry{}, reject(raw, ErrParentNotDir, "%s", dir)
			}
		}
	}
	if base == whiteoutOpaque {
		return entry{op: opOpaque, name: dir, hdr: hdr}, nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return entry{op: opSkip, hdr: hdr}, nil // aufs metadata (.wh..wh.plnk, ...): ignored
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return entry{}, reject(raw, ErrWhiteoutEscape, "target %q", target)
	}
	t := path.Join(dir, target)
	c.serial++
	c.nodes[c.key(t)] = node{kind: kRemoved, serial: c.serial}
	return entry{op: opWhiteout, name: t, hdr: hdr}, nil
}

// ancestors checks every proper ancestor of a name (dir is path.Dir of it):
// none may be a symlink or a non-directory. With record, ancestors unknown or
// whited out are recorded as (implicit) directories, as extraction will make
// them. It returns the newest serial among the ancestors.
func (c *checker) ancestors(raw, dir string, record bool) (uint32, error) {
	var newest uint32
	if dir == "." {
		return 0, nil
	}
	// One incremental hash over the components gives every prefix's key
	// (the same as c.key(prefix)) in time linear in the name's length.
	var h maphash.Hash
	h.SetSeed(c.seed)
	for i := 0; ; {
		j := strings.IndexByte(dir[i:], '/')
		end := len(dir)
		if j >= 0 {
			end = i + j
		}
		if i > 0 {
			h.WriteByte('/')
		}
		h.WriteString(dir[i:end])
		key := h.Sum64()
		n, ok := c.nodes[key]
		switch {
		case ok && n.kind == kSymlink:
			return 0, reject(raw, ErrThroughSymlink, "%s is a symlink", dir[:end])
		case ok && (n.kind == kReg || n.kind == kHardlink || n.kind == kFifo):
			return 0, reject(raw, ErrParentNotDir, "%s", dir[:end])
		case (!ok || n.kind == kRemoved) && record:
			c.serial++
			n = node{kind: kDir, serial: c.serial}
			c.nodes[key] = n
		}
		newest = max(newest, n.serial)
		if j < 0 {
			return newest, nil
		}
		i = end + 1
	}
}

// linkTarget checks a hard link's target: inside the root, an earlier
// non-directory entry still in place, not under the link itself.
func (c *checker) linkTarget(raw, name, linkname string) (string, error) {
	t, err := cleanName(linkname)
	if err != nil {
		if err == ErrNameTooLong || err == ErrInvalidName {
			return "", reject(raw, err, "hard link target %q", linkname)
		}
		return "", reject(raw, ErrHardlinkEscape, "-> %s", linkname)
	}
	if c.strip {
		s, ok := underRootfs(t)
		if !ok {
			return "", reject(raw, ErrHardlinkEscape, "-> %s, outside rootfs/", t)
		}
		t = s
	}
	if t == name || strings.HasPrefix(t, name+"/") {
		return "", reject(raw, ErrHardlinkTarget, "-> %s replaces its own target", t)
	}
	n, ok := c.nodes[c.key(t)]
	if !ok || n.kind == kRemoved || n.kind == kDir || t == "." {
		return "", reject(raw, ErrHardlinkTarget, "-> %s", t)
	}
	newest, err := c.ancestors(raw, path.Dir(t), false)
	if err != nil {
		return "", err
	}
	if newest > n.serial {
		// A directory on the target's path was replaced after it was written.
		return "", reject(raw, ErrHardlinkTarget, "-> %s no longer exists", t)
	}
	return t, nil
}

// written reports whether this archive wrote name (explicitly, or as an
// implicit parent of an entry) and did not white it out since.
func (c *checker) written(name string) bool {
	n, ok := c.nodes[c.key(name)]
	return ok && n.kind != kRemoved
}
