package tarball

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
)

const readBufferSize = 1 << 20

// counter counts the bytes archive/tar consumes and remembers the first few,
// to recognise a compressed file in an error message.
type counter struct {
	r     io.Reader
	n     int64
	magic [4]byte
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.n < int64(len(c.magic)) {
		copy(c.magic[c.n:], p[:n])
	}
	c.n += int64(n)
	return n, err
}

// stream reads a tar archive header by header, turning structural problems
// into *FormatError (with the offset and the entry) and insisting on the
// end-of-archive marker, so a stream cut at an entry boundary is reported as
// truncated rather than accepted as a shorter archive.
type stream struct {
	ctx  context.Context
	cnt  *counter
	tr   *tar.Reader
	cur  string // entry being read ("" before the first header)
	mark int64  // offset when Next was last called
}

func newStream(ctx context.Context, r io.Reader) *stream {
	c := &counter{r: bufio.NewReaderSize(r, readBufferSize)}
	return &stream{ctx: ctx, cnt: c, tr: tar.NewReader(c)}
}

// next returns the next header, or io.EOF after a complete archive.
func (s *stream) next() (*tar.Header, error) {
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
		if s.cnt.n-s.mark < 1024 {
			return nil, s.formatErr(errors.New("archive ends without its end-of-archive marker (truncated?)"))
		}
		return nil, io.EOF
	default:
		return nil, s.wrap(err)
	}
}

// wrap classifies an error from archive/tar: structural errors become a
// *FormatError; anything else (the source failing) is wrapped with where it
// happened and stays retryable.
func (s *stream) wrap(err error) error {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrFieldTooLong) {
		if s.cnt.n <= 512 && s.cur == "" {
			switch {
			case s.cnt.magic[0] == 0x1f && s.cnt.magic[1] == 0x8b:
				err = fmt.Errorf("%w (this is gzip data; decompress it first)", err)
			case s.cnt.magic == [4]byte{0x28, 0xb5, 0x2f, 0xfd}:
				err = fmt.Errorf("%w (this is zstd data; decompress it first)", err)
			case err == io.ErrUnexpectedEOF || errors.Is(err, tar.ErrHeader):
				err = fmt.Errorf("%w (not a tar archive)", err)
			}
		}
		return s.formatErr(err)
	}
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
