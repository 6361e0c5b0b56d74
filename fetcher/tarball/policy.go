package tarball

import (
	"archive/tar"
	"hash/maphash"
	"math"
	"path"
	"sort"
	"strings"
)

// Default limits of the extraction policy.
const (
	DefaultMaxEntries   = 100_000
	DefaultMaxFileSize  = 1 << 30  // 1 GiB
	DefaultMaxTotalSize = 10 << 30 // 10 GiB
	// DefaultMaxXattrs bounds the extended attributes of one entry. Real
	// images carry a handful (security.capability, a few user.* or
	// trusted.* ones); 128 leaves ample room while bounding the system
	// calls one header can ask for (a 1 MiB PAX header holds ~25,000
	// records).
	DefaultMaxXattrs = 128
	// DefaultMaxXattrBytes bounds the names and values of one entry's
	// extended attributes together: 64 KiB is Linux's largest single
	// value (XATTR_SIZE_MAX) and its limit on the list of one file's
	// names (XATTR_LIST_MAX), far above the few hundred bytes real
	// entries carry.
	DefaultMaxXattrBytes = 64 << 10

	// MaxLimitBytes and MaxLimitCount are the largest values a byte limit
	// and a count limit of Limits may take (larger ones are taken as
	// these): the bound on the tar stream computed from them then stays
	// far from overflowing an int64.
	MaxLimitBytes = 1 << 60 // 1 EiB
	MaxLimitCount = 1<<31 - 1

	// MaxRootEntries is the most entries an archive may give for its root
	// ("." or "./"; ErrTooManyRootEntries past it). An archive lists its
	// root once, or once for each archive concatenated into it; Extract
	// with DetectRootfs holds the root entries it reads before the first
	// other entry, so their number is bounded by this rather than by
	// Limits.MaxEntries.
	MaxRootEntries = 16

	maxNameLen      = 4095 // PATH_MAX without its NUL
	maxComponentLen = 255  // NAME_MAX
	maxOwnerID      = 1<<32 - 2
	whiteoutPrefix  = ".wh."
	whiteoutMeta    = ".wh..wh."
	whiteoutOpaque  = ".wh..wh..opq"
	rootfsDir       = "rootfs"
	xattrPAXPrefix  = "SCHILY.xattr."
	// paxStandardRecords is the allowance of an entry's PAX header for
	// records other than its extended attributes: POSIX defines about 15
	// keywords, GNU sparse files and ACLs add a few.
	paxStandardRecords = 64
	capabilityXattr    = "security.capability"
)

// Limits bounds what an archive may hold. A zero (or negative) field means
// the default; a count above MaxLimitCount or a size above MaxLimitBytes
// means that maximum.
type Limits struct {
	MaxEntries  int   // headers of any kind, and separately the parent directories they imply; default DefaultMaxEntries
	MaxFileSize int64 // bytes of one regular file; default DefaultMaxFileSize
	// MaxTotalSize bounds the bytes of all regular files together, and of
	// all extended attributes (names and values), which take space too;
	// default DefaultMaxTotalSize.
	MaxTotalSize int64
	// MaxXattrs bounds the extended attribute records (PAX SCHILY.xattr.*)
	// of one entry (ErrTooManyXattrs); default DefaultMaxXattrs.
	MaxXattrs int
	// MaxXattrBytes bounds the names and values of one entry's extended
	// attributes together (ErrXattrsTooLarge); default
	// DefaultMaxXattrBytes.
	MaxXattrBytes int64
	// AllowSetID turns off the ErrSetID and ErrFileCapability rules. It is
	// off by default: a hostile image could plant a setuid binary; real distribution images
	// (su, passwd, mount) carry setuid files, so an operator who trusts the
	// source may need it.
	AllowSetID bool
	// AllowDeviceNodes turns off the ErrDeviceNode rule: character and
	// block devices are admitted, and Extract makes them (which takes
	// CAP_MKNOD). Off by default: an image has no need of a device the
	// runtime does not give its containers, and one the runtime's device
	// rules let through is a way to the host's disks. containerd's own
	// applier makes them, so registry layers may carry them.
	AllowDeviceNodes bool
	// LowerHardlinks admits a hard link whose target this archive did not
	// write: a file of the tree the archive is extracted onto, a lower
	// layer's. Extract checks it at the link, in that tree (ErrHardlinkTarget
	// when the target is missing or a directory, ErrThroughSymlink when a
	// directory on its way is a symlink, unless LowerSymlinks), and links
	// the target itself, never what it may point at; Validate, which has
	// no tree, admits it unchecked. A target this archive wrote, whited out
	// or made a directory is still held to the archive's own record.
	LowerHardlinks bool
	// LowerSymlinks makes Extract follow a symlink of the tree extracted
	// onto (a lower layer's) on the way to an entry, a hard link's target
	// or a whiteout, as containerd's applier does, instead of refusing it
	// (ErrThroughSymlink): a layer naming lib/x.so over a lower lib ->
	// usr/lib writes usr/lib/x.so. The target is resolved inside the root
	// (an absolute one from the root, ".." stopping at the root), so
	// nothing is written outside it; more than 40 symlinks on one way are
	// refused. A way through a symlink this archive made is still refused,
	// also where a lower layer's symlink leads to it or the archive made
	// it through one (or made a hard link to it), and an entry's own
	// name is never followed: a symlink there is replaced. Validate, which
	// has no tree, is not concerned.
	LowerSymlinks bool
	// RootRelativeNames takes an absolute entry name or hard link target
	// from the root, as containerd's applier does, instead of refusing it
	// (ErrAbsoluteName, ErrHardlinkEscape): the name is cleaned as an
	// absolute path, so ".." stops at the root, and its leading "/" is
	// dropped; "/" is the root, ".". ko writes every image's binary as
	// /ko-app/<name>. Symlink targets are not concerned: an absolute one
	// is always kept as written.
	RootRelativeNames bool
	// AllowMissingEndMarker accepts a tar stream that ends at an entry's
	// end without the end-of-archive marker, as archive/tar (and so
	// containerd's applier) does: estargz's zstd:chunked layers are made
	// so. A stream cut inside an entry (its header, content or padding)
	// is still malformed. Without the marker a stream cut between two
	// entries cannot be told from a whole one: this is only for streams
	// whose bytes are known whole otherwise, such as a blob checked
	// against its digest.
	AllowMissingEndMarker bool
	// AllowTrailingData accepts any bytes after the end-of-archive
	// marker, as containerd's applier does: it reads the stream to its
	// end once archive/tar has found the marker, and hashes what it reads
	// into the diff ID, as the extraction then does too. Without it, only
	// zeros are accepted there, at most MaxPadding (ErrTrailingData). The
	// stream's length stays bounded by the limits (ErrStreamTooLong).
	AllowTrailingData bool
}

func (l Limits) withDefaults() Limits {
	l.MaxEntries = limit(l.MaxEntries, DefaultMaxEntries, MaxLimitCount)
	l.MaxFileSize = limit(l.MaxFileSize, DefaultMaxFileSize, MaxLimitBytes)
	l.MaxTotalSize = limit(l.MaxTotalSize, DefaultMaxTotalSize, MaxLimitBytes)
	l.MaxXattrs = limit(l.MaxXattrs, DefaultMaxXattrs, MaxLimitCount)
	l.MaxXattrBytes = limit(l.MaxXattrBytes, DefaultMaxXattrBytes, MaxLimitBytes)
	return l
}

// limit is v, or def when v is not positive, at most most.
func limit[T int | int64](v, def, most T) T {
	if v <= 0 {
		return def
	}
	return min(v, most)
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
	opDevice             // make a character or block device (Limits.AllowDeviceNodes)
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
	kDevice
	kRemoved // whited out; a later implicit or explicit entry re-creates it
)

// leaf reports whether k is a name nothing can be below: a file, hard
// link, named pipe or device the archive made.
func (k kind) leaf() bool {
	return k == kReg || k == kHardlink || k == kFifo || k == kDevice
}

type node struct {
	kind kind
	// implicit: a kDir known only as the parent of an entry, which a
	// lower layer's symlink may be (Limits.LowerSymlinks).
	implicit bool
	serial   uint32 // when the name was (re)created; used to tell stale names
}

// entry is a header the checker admitted, with names normalised.
type entry struct {
	op    op
	name  string // root-relative slash path, "." for the root; after stripping
	clean string // the header's name cleaned, before stripping
	link  string // opHardlink: normalised target; opSymlink: target as written
	hdr   *tar.Header
	// xattrBytes is the size of the entry's extended attributes (names
	// and values of its SCHILY.xattr.* records).
	xattrBytes int64
}

// checker applies the extraction policy to a stream of headers. It remembers
// what kind of thing every name is (keyed by a seeded 64-bit hash, so memory
// is a few dozen bytes per name whatever the name lengths) in order to
// refuse writes through symlinks and hard links to unknown names in a single
// pass. The names are the entries and the parent directories they imply;
// the latter are limited to Limits.MaxEntries too, so memory is bounded by
// the entry limit whatever the depth of the paths. Validate and Extract
// share it, so both apply exactly the same rules.
type checker struct {
	limits Limits
	strip  bool // map rootfs/ to the root, refuse entries outside it
	seed   maphash.Seed
	nodes  map[uint64]node
	serial uint32
	anc    ancestorCache

	entries  int
	roots    int // entries naming the archive root ("." cleaned)
	implicit int // directories recorded because an entry implied them
	total    int64
}

func newChecker(limits Limits, strip bool) *checker {
	return &checker{limits: limits.withDefaults(), strip: strip, seed: maphash.MakeSeed(), nodes: make(map[uint64]node)}
}

// rootKey stands for "." in the chain of component hashes.
const rootKey uint64 = 0

// key hashes a clean root-relative name one component at a time, so the
// keys of a name's ancestors are the intermediate values (see step). The
// levels it shares with the last recorded ancestor walk are not hashed
// again.
func (c *checker) key(name string) uint64 {
	if name == "." {
		return rootKey
	}
	k, i := rootKey, 0
	if n := c.anc.shared(name); n > 0 {
		k, i = c.anc.keys[n-1], c.anc.ends[n-1]+1
	}
	for i <= len(name) {
		end := len(name)
		if j := strings.IndexByte(name[i:], '/'); j >= 0 {
			end = i + j
		}
		k = c.step(k, name[i:end])
		i = end + 1
	}
	return k
}

// step is the key of the child comp of the name whose key is parent: the
// component's seeded hash, combined with the parent's key and mixed by a
// bijection (the SplitMix64 finaliser), so that names collide no more
// often than random 64-bit values unless the seed is known.
func (c *checker) step(parent uint64, comp string) uint64 {
	z := parent*0x9e3779b97f4a7c15 + maphash.String(c.seed, comp)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// cleanName turns an archive name into a root-relative clean slash path
// ("." is the root), or names the rule it breaks. With rootRelative an
// absolute name is taken from the root (Limits.RootRelativeNames).
func cleanName(raw string, rootRelative bool) (string, error) {
	if len(raw) <= maxNameLen && isClean(raw) {
		return raw, nil
	}
	if raw == "" {
		return "", ErrInvalidName
	}
	var c string
	switch {
	case strings.HasPrefix(raw, "/") && !rootRelative:
		return "", ErrAbsoluteName
	case strings.HasPrefix(raw, "/"):
		// Cleaned as an absolute path, ".." cannot climb above the root.
		if c = path.Clean(raw)[1:]; c == "" {
			c = "."
		}
	default:
		c = path.Clean(raw)
	}
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

// isClean reports, in one pass over the bytes, whether name is already a
// clean relative path of components of at most 255 bytes, none "." or
// "..": what most archive names are, so they skip path.Clean and the
// component checks, whose cost per component would dominate for deep paths.
func isClean(name string) bool {
	start := 0
	for i := 0; i <= len(name); i++ {
		if i < len(name) && name[i] != '/' {
			continue
		}
		switch n := i - start; {
		case n == 0 || n > maxComponentLen:
			return false
		case name[start] == '.' && (n == 1 || (n == 2 && name[start+1] == '.')):
			return false
		}
		start = i + 1
	}
	return true
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
		return entry{op: opSkip, hdr: hdr}, c.paxRecords(raw, hdr)
	}
	name, err := cleanName(raw, c.limits.RootRelativeNames)
	if err != nil {
		return entry{}, reject(raw, err, "")
	}
	clean := name
	if clean == "." {
		// Extract with DetectRootfs holds the root entries it reads
		// before deciding: their number is bounded whatever the decision.
		c.roots++
		if c.roots > MaxRootEntries {
			return entry{}, reject(raw, ErrTooManyRootEntries, "more than %d", MaxRootEntries)
		}
	}
	// above is the archive root above a stripped rootfs/: it is checked
	// and recorded as the root is without stripping, so that the verdict on
	// it and what the checker remembers do not depend on the strip
	// decision (DetectRootfs admits it before deciding), and then skipped.
	above := c.strip && clean == "."
	if c.strip && !above {
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
	xattrBytes, err := c.xattrs(raw, hdr)
	if err != nil {
		return entry{}, err
	}

	base := path.Base(name)
	if strings.HasPrefix(base, whiteoutPrefix) {
		e, err := c.admitWhiteout(raw, name, base, hdr)
		e.clean, e.xattrBytes = clean, xattrBytes
		return e, err
	}

	e := entry{name: name, clean: clean, hdr: hdr, xattrBytes: xattrBytes}
	var k kind
	switch hdr.Typeflag {
	case tar.TypeDir:
		e.op, k = opDir, kDir
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse, tar.TypeCont:
		e.op, k = opReg, kReg
		if hdr.Size > c.limits.MaxFileSize {
			return entry{}, reject(raw, ErrFileTooLarge, "%d bytes, limit %d", hdr.Size, c.limits.MaxFileSize)
		}
		if err := c.add(raw, hdr.Size); err != nil {
			return entry{}, err
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
			return entry{}, reject(raw, ErrSymlinkEscape, "-> %s", quote(e.link))
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
		if !c.limits.AllowDeviceNodes {
			return entry{}, reject(raw, ErrDeviceNode, "%d:%d", hdr.Devmajor, hdr.Devminor)
		}
		if hdr.Devmajor < 0 || hdr.Devmajor > math.MaxUint32 || hdr.Devminor < 0 || hdr.Devminor > math.MaxUint32 {
			return entry{}, reject(raw, ErrDeviceNumber, "%d:%d", hdr.Devmajor, hdr.Devminor)
		}
		e.op, k = opDevice, kDevice
	default:
		return entry{}, reject(raw, ErrUnsupportedType, "type %q", hdr.Typeflag)
	}
	if name == "." && e.op != opDir {
		return entry{}, reject(raw, ErrRootNotDir, "")
	}
	if !c.limits.AllowSetID {
		if hdr.Mode&04000 != 0 || (hdr.Mode&02000 != 0 && e.op != opDir) {
			return entry{}, reject(raw, ErrSetID, "mode %04o", hdr.Mode&07777)
		}
	}
	newest, err := c.ancestors(raw, path.Dir(name), true)
	if err != nil {
		return entry{}, err
	}
	key := c.key(name)
	if old, ok := c.nodes[key]; !(ok && old.serial >= newest && old.kind == kDir && k == kDir) {
		c.serial++
		c.set(name, key, node{kind: k, serial: c.serial})
	} else if old.implicit {
		old.implicit = false
		c.nodes[key] = old
	}
	if above {
		e.op = opSkip
	}
	return e, nil
}

// xattrs checks an entry's extended attribute records against the
// per-entry limits (and its PAX records in number), and counts their
// bytes against MaxTotalSize (they take space as file data does),
// returning those bytes. Every record counts, whether or not extraction
// can apply it: Validate cannot know which the target's file system
// accepts, and must agree with Extract.
func (c *checker) xattrs(raw string, hdr *tar.Header) (int64, error) {
	var n int
	var size int64
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPAXPrefix)
		if !ok {
			continue
		}
		n++
		size += int64(len(name) + len(v))
	}
	if n > c.limits.MaxXattrs {
		return 0, reject(raw, ErrTooManyXattrs, "%d records, limit %d", n, c.limits.MaxXattrs)
	}
	if err := c.paxRecords(raw, hdr); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	if size > c.limits.MaxXattrBytes {
		return 0, reject(raw, ErrXattrsTooLarge, "%d bytes, limit %d", size, c.limits.MaxXattrBytes)
	}
	return size, c.add(raw, size)
}

// paxRecords checks the number of records of an entry's PAX header
// (ErrTooManyPAXRecords), whatever their keys.
func (c *checker) paxRecords(raw string, hdr *tar.Header) error {
	if most := 2*c.limits.MaxXattrs + paxStandardRecords; len(hdr.PAXRecords) > most {
		return reject(raw, ErrTooManyPAXRecords, "%d records, limit %d", len(hdr.PAXRecords), most)
	}
	return nil
}

// add counts n bytes of files or extended attributes against MaxTotalSize.
// n is at most MaxLimitBytes and so is the total before it, so the sum
// cannot overflow.
func (c *checker) add(raw string, n int64) error {
	c.total += n
	if c.total > c.limits.MaxTotalSize {
		return reject(raw, ErrTotalTooLarge, "more than %d bytes of files and extended attributes", c.limits.MaxTotalSize)
	}
	return nil
}

// admitWhiteout checks a whiteout: an entry whose base name starts with
// ".wh.". What it is follows from the name alone, whatever the entry's
// type, as containerd's applier decides it: Docker on aufs wrote the
// second and later whiteouts of a layer as hard links to the first, and
// its layers carry the aufs metadata directory ".wh..wh.plnk/". So a
// whiteout's type, link target, mode and body are never used: it removes
// what it names and creates nothing but its directory when missing (as
// containerd's applier makes an entry's parents first), and a hard link
// among them links nothing. Its confinement is checked as any entry's: its
// directory must be one the archive may write in, and the name it removes
// one entry of that directory.
func (c *checker) admitWhiteout(raw, name, base string, hdr *tar.Header) (entry, error) {
	dir := path.Dir(name)
	// The walk checks dir itself too: the directory a whiteout is in
	// must not be a symlink or a file any more than its parents. Those
	// missing are recorded, as Extract makes them.
	if _, err := c.ancestors(raw, dir, true); err != nil {
		return entry{}, err
	}
	if base == whiteoutOpaque {
		return entry{op: opOpaque, name: dir, hdr: hdr}, nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		// aufs metadata (.wh..wh.plnk/, .wh..wh.aufs): nothing to create
		// or remove. Entries below such a directory are ordinary ones,
		// written as containerd's applier writes them: a layer's hard
		// links may name the files aufs kept in .wh..wh.plnk/.
		return entry{op: opSkip, hdr: hdr}, nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return entry{}, reject(raw, ErrWhiteoutEscape, "target %s", quote(target))
	}
	t := path.Join(dir, target)
	c.serial++
	c.set(t, c.key(t), node{kind: kRemoved, serial: c.serial})
	return entry{op: opWhiteout, name: t, hdr: hdr}, nil
}

// ancestors checks every proper ancestor of a name (dir is path.Dir of it):
// none may be a symlink or a non-directory. With record, ancestors unknown or
// whited out are recorded as (implicit) directories, as extraction will make
// them, and count against the implicit-directory budget. It returns the
// newest serial among the ancestors.
//
// Archives list neighbouring names one after another, so the levels of the
// last recorded walk are cached (all of them known directories): a name
// sharing them costs one comparison of the shared part plus a lookup per
// component below it, whatever its depth.
func (c *checker) ancestors(raw, dir string, record bool) (uint32, error) {
	if dir == "." {
		return 0, nil
	}
	a := &c.anc
	k := a.shared(dir)
	key, newest, i := rootKey, uint32(0), 0
	if k > 0 {
		key, newest, i = a.keys[k-1], a.newest[k-1], a.ends[k-1]+1
	}
	if record {
		a.truncate(k)
		a.dir = dir
	}
	for i <= len(dir) {
		end := len(dir)
		if j := strings.IndexByte(dir[i:], '/'); j >= 0 {
			end = i + j
		}
		key = c.step(key, dir[i:end])
		n, ok := c.nodes[key]
		if ok && n.serial < newest {
			// Recorded before a directory above it was made again
			// (whited out, or replaced, then written): that name is
			// gone.
			n, ok = node{}, false
		}
		switch {
		case ok && n.kind == kSymlink:
			return 0, reject(raw, ErrThroughSymlink, "%s is a symlink", quote(dir[:end]))
		case ok && n.kind.leaf():
			return 0, reject(raw, ErrParentNotDir, "%s", quote(dir[:end]))
		case (!ok || n.kind == kRemoved) && record:
			c.implicit++
			if c.implicit > c.limits.MaxEntries {
				return 0, reject(raw, ErrTooManyDirs, "more than %d directories not listed in the archive", c.limits.MaxEntries)
			}
			c.serial++
			n = node{kind: kDir, implicit: true, serial: c.serial}
			c.nodes[key] = n
		}
		newest = max(newest, n.serial)
		if record {
			a.ends = append(a.ends, end)
			a.keys = append(a.keys, key)
			a.newest = append(a.newest, newest)
		}
		i = end + 1
	}
	return newest, nil
}

// ancestorCache holds the levels of the last recorded ancestor walk.
// Level i is dir[:ends[i]], its key keys[i], and newest[i] the newest
// serial of levels 0..i. Every cached level is a directory in the
// checker's nodes until set() changes that name, which truncates the cache.
type ancestorCache struct {
	dir    string
	ends   []int
	keys   []uint64
	newest []uint32
}

// shared returns how many cached levels are ancestors of dir (or dir).
func (a *ancestorCache) shared(dir string) int {
	if len(a.ends) == 0 {
		return 0
	}
	isAncestor := func(i int) bool {
		e := a.ends[i]
		return len(dir) >= e && (len(dir) == e || dir[e] == '/') && dir[:e] == a.dir[:e]
	}
	if isAncestor(len(a.ends) - 1) {
		return len(a.ends)
	}
	return sort.Search(len(a.ends), func(i int) bool { return !isAncestor(i) })
}

func (a *ancestorCache) truncate(k int) {
	a.ends, a.keys, a.newest = a.ends[:k], a.keys[:k], a.newest[:k]
}

// forget drops name and the levels below it from the cache: its kind is
// about to change.
func (a *ancestorCache) forget(name string) {
	if len(a.ends) == 0 || !strings.HasPrefix(a.dir, name) || (len(a.dir) > len(name) && a.dir[len(name)] != '/') {
		return
	}
	if i := sort.SearchInts(a.ends, len(name)); i < len(a.ends) {
		a.truncate(i)
	}
}

// set records what name now is.
func (c *checker) set(name string, key uint64, n node) {
	c.anc.forget(name)
	c.nodes[key] = n
}

// linkTarget checks a hard link's target: inside the root, an earlier
// non-directory entry still in place (or, with Limits.LowerHardlinks, a
// name this archive has not written, left to Extract to find in the
// tree), not under the link itself.
func (c *checker) linkTarget(raw, name, linkname string) (string, error) {
	t, err := cleanName(linkname, c.limits.RootRelativeNames)
	if err != nil {
		if err == ErrNameTooLong || err == ErrInvalidName {
			return "", reject(raw, err, "hard link target %s", quote(linkname))
		}
		return "", reject(raw, ErrHardlinkEscape, "-> %s", quote(linkname))
	}
	if c.strip {
		s, ok := underRootfs(t)
		if !ok {
			return "", reject(raw, ErrHardlinkEscape, "-> %s, outside rootfs/", quote(t))
		}
		t = s
	}
	if t == name || strings.HasPrefix(t, name+"/") {
		return "", reject(raw, ErrHardlinkTarget, "-> %s replaces its own target", quote(t))
	}
	n, ok := c.nodes[c.key(t)]
	if ok && n.kind == kDir && n.implicit && c.limits.LowerSymlinks {
		// A name this archive knows only as an entry's parent may be a
		// lower layer's symlink, to which containerd's applier makes a
		// second name: as for a name this archive has not written, the
		// extraction finds out what it is, and refuses a directory.
		n, ok = node{}, false
	}
	lower := !ok && c.limits.LowerHardlinks
	if (!ok && !lower) || n.kind == kRemoved || n.kind == kDir || t == "." {
		return "", reject(raw, ErrHardlinkTarget, "-> %s", quote(t))
	}
	newest, err := c.ancestors(raw, path.Dir(t), false)
	if err != nil {
		return "", err
	}
	if !lower && newest > n.serial {
		// A directory on the target's path was replaced after it was written.
		return "", reject(raw, ErrHardlinkTarget, "-> %s no longer exists", quote(t))
	}
	return t, nil
}

// written reports whether this archive wrote name (explicitly, or as an
// implicit parent of an entry) and did not white it out since.
func (c *checker) written(name string) bool {
	n, ok := c.nodes[c.key(name)]
	return ok && n.kind != kRemoved
}
