package tarball

import (
	"archive/tar"
	"context"
	"io"
	"strings"
)

// Report describes an archive Validate accepted (or the part read before a
// rejection).
type Report struct {
	Entries      int   // headers read, of every kind
	Files        int   // regular files
	Dirs         int   // directories
	Symlinks     int   // symbolic links
	Hardlinks    int   // hard links
	Fifos        int   // named pipes
	Devices      int   // character and block devices (Limits.AllowDeviceNodes)
	Whiteouts    int   // OCI whiteouts (.wh.<name> and .wh..wh..opq)
	TotalBytes   int64 // sum of the regular files' sizes
	XattrBytes   int64 // sum of the entries' extended attributes (names and values), counted with TotalBytes against Limits.MaxTotalSize
	ArchiveBytes int64 // bytes of the tar stream, end marker and padding after it included (decompressed)

	// Compression is how the bytes read were stored: plain, gzip or zstd.
	Compression Compression
	// DiffID is "sha256:<hex>" of the whole tar stream (decompressed, for
	// a compressed layer): the layer's identity in containerd's sense, the
	// same whether the layer is stored plain or compressed. Set only when
	// Validate returns nil, and with CallerHashesPlain only for a
	// compressed layer.
	DiffID string

	// HasRootfs is true when the archive keeps the image under a top-level
	// rootfs/ folder: at least one entry is named "rootfs" (a directory) or
	// lies under "rootfs/", and every entry is either that, or the archive
	// root itself ("." / "./"). A leading "./" is ignored throughout. Such an
	// archive is extracted with ExtractOptions.StripRootfs.
	HasRootfs bool
}

// ValidateOption tunes Validate.
type ValidateOption func(*validateConfig)

type validateConfig struct {
	callerHashesPlain bool
	tee               io.Writer
	gzipCommand       string
}

// CallerHashesPlain tells Validate that the caller computes the SHA-256 of
// the bytes it reads: a plain layer's Report.DiffID is then left empty
// (it is the caller's digest), so those bytes are hashed once.
func CallerHashesPlain() ValidateOption {
	return func(c *validateConfig) { c.callerHashesPlain = true }
}

// TeeTar has Validate write the tar stream of a compressed layer to w as
// it decompresses it, padding after the end marker included: once Validate
// returns nil, w has had exactly the bytes whose SHA-256 is Report.DiffID.
// A plain layer writes nothing (its bytes are its tar stream already). The
// copy may run ahead of the checks, so after a rejection w holds bytes
// nobody may use. A Write error of w stops the copy, not the validation:
// the caller learns of it from its own writer.
func TeeTar(w io.Writer) ValidateOption {
	return func(c *validateConfig) { c.tee = w }
}

// InflateWith has Validate inflate a gzip layer with the program at path
// (see ExtractOptions.GzipCommand); "" is the built-in inflater, the
// default. The verdict is the same either way.
func InflateWith(path string) ValidateOption {
	return func(c *validateConfig) { c.gzipCommand = path }
}

// Validate reads a whole tar stream once (decompressing a gzip or zstd
// one, recognised by its first bytes, on the way; the decompressed stream is
// bounded by the limits too, see ErrStreamTooLong), with memory bounded by the limits
// and not by the archive's size, and checks its structure and every rule of
// the extraction policy (see the package documentation). It returns nil only
// if Extract of the same bytes into an empty directory applies no rejection;
// a rejection is a *PolicyError or *FormatError naming the entry (see
// IsRejection); other errors come from reading r or from ctx. A nil error
// means r was read to its end: the padding after the end-of-archive marker
// is bounded (ErrTrailingData), and so is what a compressed layer may hold
// after its compressed data (nothing).
func Validate(ctx context.Context, r io.Reader, limits Limits, opts ...ValidateOption) (Report, error) {
	var cfg validateConfig
	for _, o := range opts {
		o(&cfg)
	}
	hash := hashAll
	if cfg.callerHashesPlain {
		hash = hashCompressed
	}
	var rep Report
	s := newStream(ctx, r, limits, hash, cfg.tee, cfg.gzipCommand)
	defer s.close()
	rep.Compression = s.comp
	chk := newChecker(limits, false)
	var (
		sawRootfs    = false
		allInRootfs  = true
		rootfsEscape string // first relative symlink leaving rootfs/
	)
	for {
		hdr, err := s.next()
		rep.ArchiveBytes = s.cnt.n
		if err == io.EOF {
			break
		}
		if err != nil {
			return rep, err
		}
		rep.Entries++
		e, err := chk.admit(hdr)
		if err != nil {
			return rep, err
		}
		rep.XattrBytes += e.xattrBytes
		if hdr.Typeflag != tar.TypeXGlobalHeader {
			switch n := e.clean; {
			case n == ".":
			case n == rootfsDir:
				sawRootfs = true
				allInRootfs = allInRootfs && e.op == opDir
			case strings.HasPrefix(n, rootfsDir+"/"):
				sawRootfs = true
			default:
				allInRootfs = false
			}
		}
		switch e.op {
		case opDir:
			rep.Dirs++
		case opReg:
			rep.Files++
			rep.TotalBytes += hdr.Size
		case opSymlink:
			rep.Symlinks++
			if rootfsEscape == "" && !strings.HasPrefix(e.link, "/") {
				if s, ok := underRootfs(e.name); ok && s != "." && escapes(s, e.link) {
					rootfsEscape = hdr.Name
				}
			}
		case opHardlink:
			rep.Hardlinks++
		case opFifo:
			rep.Fifos++
		case opDevice:
			rep.Devices++
		case opWhiteout, opOpaque:
			rep.Whiteouts++
		}
		if _, err := io.Copy(io.Discard, body{s}); err != nil {
			return rep, err
		}
	}
	rep.HasRootfs = sawRootfs && allInRootfs
	if rep.HasRootfs && rootfsEscape != "" {
		return rep, reject(rootfsEscape, ErrSymlinkEscape, "climbs above rootfs/, which is stripped")
	}
	err := s.drain()
	rep.ArchiveBytes = s.cnt.n
	if err != nil {
		return rep, err
	}
	rep.DiffID = s.diffID()
	return rep, nil
}
