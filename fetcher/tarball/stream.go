package tarball

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

const readBufferSize = 1 << 20

// blockSize is a tar block's: headers, contents with their padding and
// the end-of-archive marker fill whole blocks. The marker is two blocks of
// zeros.
const (
	blockSize  = 512
	markerSize = 2 * blockSize
)

// Compression names how a layer's bytes are stored: a plain tar, or a tar
// compressed with gzip or zstd. It is recognised by the stream's first
// bytes (magic numbers), never by a file or key name.
type Compression string

// The compressions Validate and Extract read.
const (
	Plain Compression = ""
	Gzip  Compression = "gzip"
	Zstd  Compression = "zstd"
)

// String is "plain", "gzip" or "zstd".
func (c Compression) String() string {
	if c == Plain {
		return "plain"
	}
	return string(c)
}

var (
	gzipMagic  = []byte{0x1f, 0x8b}
	zstdMagic  = []byte{0x28, 0xb5, 0x2f, 0xfd}
	xzMagic    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	bzip2Magic = []byte("BZh")
)

// zstdSkippable and zstdSkippableMask tell a zstd skippable frame by its
// first four bytes, little-endian 0x184D2A50 to 0x184D2A5F. The zstd
// format lets a stream open with one (pzstd writes one before every
// frame, holding its size), and the decoder skips them; containerd's
// decompressor takes such a stream as zstd too.
const (
	zstdSkippable     = 0x184D2A50
	zstdSkippableMask = 0xFFFFFFF0
)

// DetectCompression says how a layer whose bytes begin with b is stored,
// as ExtractDir and Validate tell it: gzip, zstd (a zstd frame, or a
// skippable frame opening a zstd stream) or, for anything else, Plain.
// Four bytes are enough to tell.
func DetectCompression(b []byte) Compression {
	switch {
	case bytes.HasPrefix(b, gzipMagic):
		return Gzip
	case bytes.HasPrefix(b, zstdMagic),
		len(b) >= 4 && binary.LittleEndian.Uint32(b)&zstdSkippableMask == zstdSkippable:
		return Zstd
	}
	return Plain
}

// zstdMaxWindow bounds the memory one zstd stream may ask for (its window):
// 128 MiB (window log 27) admits every level of the zstd tool, --ultra -22
// included, and its long mode at its default (--long, 27), while a hostile
// frame header cannot make the decoder allocate more. containerd's own
// decoder admits up to 512 MiB; a layer asking for more than this is
// refused with an error that names the limit (corruptError).
const zstdMaxWindow = 128 << 20

// entryAllowance is how many bytes of the decompressed stream each entry
// the limits admit may take besides its file's content: its header, the
// long-name and PAX records before it, and the padding after it. With
// Limits.MaxTotalSize it bounds the whole decompressed stream (see
// maxStreamBytes), so that a small compressed object cannot make us read an
// unbounded tar (zeros after the end marker, huge PAX records).
const entryAllowance = 8 << 10

// MaxPadding is the most bytes, all zeros, accepted after a tar archive's
// end-of-archive marker (ErrTrailingData past it). tar writers pad the
// archive to their record size: 10 KiB for GNU and BSD tar by default,
// larger with a bigger blocking factor (-b 2048 is 1 MiB); 4 MiB admits
// all of them.
const MaxPadding = 4 << 20

// maxStreamBytes is the most bytes of tar stream (decompressed, for a
// compressed layer) an archive within l may need. The limits are clamped
// (MaxLimitBytes, MaxLimitCount), so the sum is far below the largest
// int64.
func maxStreamBytes(l Limits) int64 {
	l = l.withDefaults()
	return l.MaxTotalSize + int64(l.MaxEntries+1)*entryAllowance
}

// counter counts the bytes of tar stream archive/tar consumes, writes them
// to sink when asked (the diff ID's hash, a tee), and refuses to give more
// than max.
type counter struct {
	r    io.Reader
	n    int64
	max  int64
	sink io.Writer // nil: nothing sees the bytes
	// zeros is how many of the last bytes read are zeros, counted up to
	// the end-of-archive marker's length: stream.next tells the marker
	// from a stream cut after a header archive/tar reads ahead of an
	// entry's own (PAX records, a GNU long name) by it.
	zeros int
}

// errStreamTooLong is counter's refusal; stream.wrap turns it into a
// *PolicyError naming the entry.
var errStreamTooLong = errors.New("tar stream longer than the limits allow")

func (c *counter) Read(p []byte) (int, error) {
	if c.n >= c.max {
		return 0, errStreamTooLong
	}
	if rest := c.max - c.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := c.r.Read(p)
	if c.sink != nil {
		c.sink.Write(p[:n])
	}
	c.n += int64(n)
	c.zeroTail(p[:n])
	return n, err
}

// zeroTail updates c.zeros with p, the bytes just read; it looks at no
// more than the marker's length of them.
func (c *counter) zeroTail(p []byte) {
	i := len(p)
	for i > 0 && len(p)-i < markerSize && p[i-1] == 0 {
		i--
	}
	if i == 0 {
		c.zeros = min(c.zeros+len(p), markerSize)
	} else {
		c.zeros = len(p) - i
	}
}

// source remembers the error of the underlying reader, so that an error of
// a decompressor can be told apart: the source failing (worth a retry) or
// corrupt compressed data (a malformed archive). It returns that error as
// a *sourceError, which stream.wrap tells from archive/tar's own errors
// whatever the source's error wraps (io.ErrUnexpectedEOF for a cut
// transfer, which from archive/tar means a truncated archive).
type source struct {
	r   io.Reader
	err error
}

func (s *source) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = &sourceError{err}
		s.err = err
	}
	return n, err
}

// sourceError is a failure of the reader an archive is read from, not a
// verdict on the archive; it reads as, and unwraps to, that failure.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// decoded is a decompressor's output; its errors are classified with src.
type decoded struct {
	r    io.Reader
	src  *source
	comp Compression
}

// corruptError is compressed data a decompressor refused.
type corruptError struct {
	comp Compression
	err  error
}

func (e *corruptError) Error() string {
	if errors.Is(e.err, zstd.ErrWindowSizeExceeded) {
		return fmt.Sprintf("zstd data asks for a window larger than %d MiB, the most accepted (zstd --ultra -22 and --long use 128 MiB), so that one layer cannot take more memory: %v",
			zstdMaxWindow>>20, e.err)
	}
	return fmt.Sprintf("corrupt %s data: %v", e.comp, e.err)
}
func (e *corruptError) Unwrap() error { return e.err }

func (d *decoded) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	var se *sourceError
	switch {
	case err == nil || err == io.EOF:
	case errors.As(err, &se):
		// The decompressor's own reading failed (a gzip command's output
		// could not be read), not the source, nor the data.
	case d.src.err != nil && errors.Is(err, d.src.err):
		err = d.src.err
	case d.src.err != nil:
		err = fmt.Errorf("%s stream: %w", d.comp, d.src.err)
	default:
		err = &corruptError{comp: d.comp, err: err}
	}
	return n, err
}

// stream reads a tar archive header by header, turning structural problems
// into *FormatError (with the offset and the entry) and insisting on the
// end-of-archive marker, so a stream cut at an entry boundary is reported as
// truncated rather than accepted as a shorter archive (unless noMarker); a
// stream cut inside an entry always is. A gzip or zstd
// stream is decompressed on the way; offsets are in the tar stream.
type stream struct {
	ctx   context.Context
	cnt   *counter
	tr    *tar.Reader
	comp  Compression
	other string // a compression we do not read, named in errors
	zr    *zstd.Decoder
	cmd   *inflateCommand // the gzip command inflating the stream, if one does
	h     hash.Hash       // the tar stream's SHA-256 (diffID), nil when not hashed
	ra    *readahead      // the stages reading (and hashing) the tar stream, when on
	raw   io.Reader       // the source's bytes, before decompression
	cur   string          // entry being read ("" before the first header)
	mark  int64           // offset when Next was last called
	err   error           // opening the decompressor failed
	// noMarker accepts an archive ending at an entry's end without the
	// end-of-archive marker (Limits.AllowMissingEndMarker).
	noMarker bool
	// trailing accepts any bytes after the marker
	// (Limits.AllowTrailingData).
	trailing bool
}

// hashing says which tar streams newStream hashes (diffID).
type hashing int

const (
	hashNone hashing = iota
	hashAll
	// hashCompressed hashes a decompressed stream only: a plain stream's
	// diff ID is the SHA-256 of the bytes given, which a caller that hashes
	// them already has (and SHA-256 is, with decompression, the costliest
	// work per byte of a pull: hashing the same bytes twice would double
	// it for a plain layer).
	hashCompressed
)

// newStream reads r, decompressed when its first bytes say it is gzip
// (inflated by the program gzipCommand unless it is "", see gzipcmd.go)
// or zstd; the tar stream's SHA-256 is kept (diffID) as hash says, and
// the tar stream of a compressed r is copied to tee unless it is nil.
func newStream(ctx context.Context, r io.Reader, limits Limits, hash hashing, tee io.Writer, gzipCommand string) *stream {
	src := &source{r: r}
	br := bufio.NewReaderSize(src, readBufferSize)
	s := &stream{ctx: ctx, raw: br, noMarker: limits.AllowMissingEndMarker, trailing: limits.AllowTrailingData}
	magic, _ := br.Peek(6)
	var tarBytes io.Reader = br
	switch comp := DetectCompression(magic); {
	case comp == Gzip:
		// klauspost/compress's inflater, not the standard library's: the
		// same format and checks (header, CRC-32 and size at the end,
		// concatenated members), 1.7 times the throughput on image-like
		// data (BenchmarkInflate), and inflating is one core's work that
		// bounds a pull.
		s.comp = Gzip
		if gzipCommand != "" {
			c, err := startInflateCommand(gzipCommand, br)
			if err != nil {
				s.err = err
			} else {
				s.cmd = c
				tarBytes = &decoded{r: c, src: src, comp: Gzip}
			}
			break
		}
		zr, err := gzip.NewReader(br)
		if err != nil {
			s.err = s.openErr(src, err)
		} else {
			tarBytes = &decoded{r: zr, src: src, comp: Gzip}
		}
	case comp == Zstd:
		s.comp = Zstd
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			s.err = s.openErr(src, err)
		} else {
			s.zr = zr
			tarBytes = &decoded{r: zr, src: src, comp: Zstd}
		}
	case bytes.HasPrefix(magic, xzMagic):
		s.other = "xz"
	case bytes.HasPrefix(magic, bzip2Magic):
		s.other = "bzip2"
	}
	s.cnt = &counter{r: tarBytes, max: maxStreamBytes(limits)}
	if hash == hashAll || hash == hashCompressed && s.comp != Plain {
		s.h = sha256.New()
	}
	var sink io.Writer
	switch {
	case tee != nil && s.comp != Plain && s.h != nil:
		sink = io.MultiWriter(s.h, &teeWriter{w: tee})
	case tee != nil && s.comp != Plain:
		sink = &teeWriter{w: tee}
	case s.h != nil:
		sink = s.h
	}
	if readaheadEnabled && s.err == nil && (s.comp != Plain || sink != nil) {
		// Decompressing and hashing run on goroutines of their own; the
		// decompressor is closed by the stage that reads it.
		var done func()
		if s.zr != nil {
			done = s.zr.Close
		}
		s.ra = newReadahead(tarBytes, sink, done)
		s.cnt.r = s.ra
	} else {
		s.cnt.sink = sink
	}
	s.tr = tar.NewReader(s.cnt)
	return s
}

// teeWriter copies a tar stream to w until w fails once, then drops the
// rest; it never fails itself, so a copy that cannot be kept (a full disk)
// never stops the reading it rides on.
type teeWriter struct {
	w      io.Writer
	failed bool
}

func (t *teeWriter) Write(p []byte) (int, error) {
	if !t.failed {
		if _, err := t.w.Write(p); err != nil {
			t.failed = true
		}
	}
	return len(p), nil
}

func (s *stream) openErr(src *source, err error) error {
	if src.err != nil {
		return fmt.Errorf("read %s stream: %w", s.comp, src.err)
	}
	return &FormatError{Err: &corruptError{comp: s.comp, err: err}}
}

// close releases the decompressor, or stops the stages that own it.
func (s *stream) close() {
	if s.cmd != nil {
		// Stopped first, so that a stage reading its output returns.
		s.cmd.stop()
		defer s.cmd.reap()
	}
	switch {
	case s.ra != nil:
		s.ra.close()
	case s.zr != nil:
		s.zr.Close()
	}
}

// drain reads what follows the end-of-archive marker: padding to the
// writer's record size, at most MaxPadding bytes of zeros (ErrTrailingData
// otherwise; anything, with Limits.AllowTrailingData), so that the diff ID covers the whole stream and a compressed
// stream's own end (gzip's checksum) is checked. For a compressed layer it
// then checks that nothing follows the compressed data either, so that a
// nil error means r was read to its end.
func (s *stream) drain() error {
	buf := make([]byte, 32<<10)
	end := s.cnt.n // the end of the marker
	for {
		if err := s.ctx.Err(); err != nil {
			return err
		}
		n, err := s.cnt.Read(buf)
		if i := nonZero(buf[:n]); i >= 0 && !s.trailing {
			off := s.cnt.n - int64(n) + int64(i)
			return reject(s.cur, ErrTrailingData, "a byte that is not zero at offset %d, %d bytes after the marker", off, off-end)
		}
		if !s.trailing && s.cnt.n-end > MaxPadding {
			return reject(s.cur, ErrTrailingData, "more than %d bytes of padding", MaxPadding)
		}
		if err == io.EOF {
			return s.sourceEnded()
		}
		if err != nil {
			return s.wrap(err)
		}
	}
}

// sourceEnded checks, for a compressed layer whose decompressed stream
// ended, that the source has no bytes left (the decompressors read to the
// source's end and refuse what they cannot decode, so this is a guard of
// the promise that a nil error means the whole source was read).
func (s *stream) sourceEnded() error {
	if s.comp == Plain {
		return nil
	}
	var b [1]byte
	switch _, err := io.ReadFull(s.raw, b[:]); err {
	case nil:
		return s.formatErr(fmt.Errorf("data after the end of the %s stream", s.comp))
	case io.EOF:
		return nil
	default:
		return fmt.Errorf("read %s stream: %w", s.comp, err)
	}
}

// nonZero is the index of the first byte of p that is not zero, or -1.
// Whole blocks are compared at once; padding is mostly zeros.
func nonZero(p []byte) int {
	off := 0
	for len(p)-off >= len(zeroBlock) && bytes.Equal(p[off:off+len(zeroBlock)], zeroBlock[:]) {
		off += len(zeroBlock)
	}
	for ; off < len(p); off++ {
		if p[off] != 0 {
			return off
		}
	}
	return -1
}

// diffID is "sha256:<hex>" of the tar stream read so far (hashed streams).
func (s *stream) diffID() string {
	if s.h == nil {
		return ""
	}
	return "sha256:" + hex.EncodeToString(s.h.Sum(nil))
}

// next returns the next header, or io.EOF after a complete archive.
func (s *stream) next() (*tar.Header, error) {
	if s.err != nil {
		return nil, s.err
	}
	if err := s.ctx.Err(); err != nil {
		return nil, err
	}
	s.mark = s.cnt.n
	hdr, err := s.tr.Next()
	if errors.Is(err, tar.ErrInsecurePath) && hdr != nil {
		err = nil // our own policy judges names
	}
	switch {
	case err == nil:
		s.cur = hdr.Name
		return hdr, nil
	case err == io.EOF:
		// Next consumed the previous entry's padding (< 512 bytes) and then
		// the two zero blocks of the end marker, if they were there.
		switch {
		case s.cnt.n%blockSize != 0:
			// A stream cut inside the previous entry's padding, which
			// archive/tar reads as the end too: every entry, padding
			// included, fills whole blocks.
			return nil, s.formatErr(errors.New("archive ends inside an entry's padding (truncated?)"))
		case (s.cnt.n-s.mark < markerSize || s.cnt.zeros < markerSize) && !s.noMarker:
			// Next reads a PAX or long-name header and its records, and
			// then finds the stream's end where the entry's own header
			// should be, as io.EOF too: what it read was no marker.
			return nil, s.formatErr(errors.New("archive ends without its end-of-archive marker (truncated?)"))
		}
		return nil, io.EOF
	default:
		return nil, s.wrap(err)
	}
}

// wrap classifies an error from archive/tar: structural errors and
// corrupt compressed data become a *FormatError, a stream longer than the
// limits a *PolicyError; anything else (the source failing, whatever its
// error wraps) is wrapped with where it happened and stays retryable.
func (s *stream) wrap(err error) error {
	if errors.Is(err, errStreamTooLong) {
		return reject(s.cur, ErrStreamTooLong, "more than %d bytes of tar stream", s.cnt.max)
	}
	var se *sourceError
	var ce *corruptError
	switch {
	case errors.As(err, &se):
		return s.ioErr(err)
	case errors.As(err, &ce):
		return s.formatErr(err)
	}
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrFieldTooLong) {
		if s.cnt.n <= 512 && s.cur == "" {
			switch {
			case s.other != "":
				err = fmt.Errorf("%w (this is %s data; only gzip and zstd are decompressed)", err, s.other)
			case s.comp != Plain:
				err = fmt.Errorf("%w (%s data that is not a tar archive once decompressed)", err, s.comp)
			default:
				err = fmt.Errorf("%w (not a tar archive)", err)
			}
		}
		return s.formatErr(err)
	}
	return s.ioErr(err)
}

// ioErr is err, a failure to read the stream, with where it happened.
func (s *stream) ioErr(err error) error {
	if s.cur == "" {
		return fmt.Errorf("read tar at offset %d: %w", s.cnt.n, err)
	}
	return fmt.Errorf("read tar at offset %d (entry %q): %w", s.cnt.n, s.cur, err)
}

func (s *stream) formatErr(err error) error {
	return &FormatError{Offset: s.cnt.n, Entry: s.cur, Err: err}
}

// body is the current entry's content; a read error is classified by wrap,
// and the context is checked on every read.
type body struct{ s *stream }

func (b body) Read(p []byte) (int, error) {
	if err := b.s.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := b.s.tr.Read(p)
	if err != nil && err != io.EOF {
		err = b.s.wrap(err)
	}
	return n, err
}
