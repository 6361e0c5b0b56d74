package tarball

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// TestCompressedLayers: the same archive stored plain, gzip and zstd is
// recognised by its bytes, validated with the same report and the same diff
// ID (the plain tar's SHA-256), and extracts to the same tree.
func TestCompressedLayers(t *testing.T) {
	plain := build(t, realWorld()...)
	want := sha(plain)
	for _, c := range []struct {
		comp Compression
		b    []byte
	}{{Plain, plain}, {Gzip, s3test.Gzip(t, plain)}, {Zstd, s3test.Zstd(t, plain)}} {
		t.Run(c.comp.String(), func(t *testing.T) {
			rep, err := Validate(context.Background(), bytes.NewReader(c.b), Limits{})
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if rep.Compression != c.comp || rep.DiffID != want || rep.ArchiveBytes != int64(len(plain)) || rep.Entries != len(realWorld()) {
				t.Fatalf("report %+v; want compression %s, diff ID %s, %d tar bytes, %d entries", rep, c.comp, want, len(plain), len(realWorld()))
			}
			s := newSandbox(t)
			st, err := ExtractDir(context.Background(), bytes.NewReader(c.b), s.target, ExtractOptions{NoChown: true})
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if st.Entries != len(realWorld()) {
				t.Errorf("extracted %d entries, want %d", st.Entries, len(realWorld()))
			}
			got, err := os.ReadFile(filepath.Join(s.target, "etc/os-release"))
			if err != nil || string(got) != "ID=test\n" {
				t.Errorf("etc/os-release: %q, %v", got, err)
			}
			if l, err := os.Readlink(filepath.Join(s.target, "usr/bin/vi")); err != nil || l != "/etc/alternatives/vi" {
				t.Errorf("usr/bin/vi -> %q, %v", l, err)
			}
			s.intact(t)
		})
	}
}

// TestCompressedPaddingInDiffID: the diff ID covers the bytes after the
// end-of-archive marker too (GNU tar pads to 10 KiB records), as
// containerd's diff ID of the same layer does.
func TestCompressedPaddingInDiffID(t *testing.T) {
	plain := append(build(t, file("a", "x")), make([]byte, 8192)...)
	rep, err := Validate(context.Background(), bytes.NewReader(s3test.Gzip(t, plain)), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DiffID != sha(plain) || rep.ArchiveBytes != int64(len(plain)) {
		t.Fatalf("diff ID %s over %d bytes, want %s over %d", rep.DiffID, rep.ArchiveBytes, sha(plain), len(plain))
	}
}

// TestCorruptCompressedRejected: compressed data that does not decode,
// is cut short, or fails its checksum is a malformed archive (a rejection,
// never retried), for Extract too (it reads the stream to its end).
func TestCorruptCompressedRejected(t *testing.T) {
	plain := build(t, file("a", strings.Repeat("payload ", 20000)), file("b", "end"))
	gz, zs := s3test.Gzip(t, plain), s3test.Zstd(t, plain)
	flip := func(b []byte, at int) []byte {
		c := bytes.Clone(b)
		c[at] ^= 0xff
		return c
	}
	cases := map[string][]byte{
		"gzip truncated":    gz[:len(gz)/2],
		"gzip bad data":     flip(gz, len(gz)/2),
		"gzip bad checksum": flip(gz, len(gz)-6), // the CRC-32 of the trailer
		"gzip bad header":   flip(gz, 3)[:12],
		"zstd truncated":    zs[:len(zs)/2],
		"zstd bad data":     flip(zs, len(zs)/2),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Validate: %v; want a malformed archive", err)
			}
			s := newSandbox(t)
			_, err = ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{NoChown: true})
			if !IsRejection(err) {
				t.Fatalf("Extract: %v; want a rejection", err)
			}
		})
	}
}

// TestCompressedSourceErrorIsNotRejection: the source failing under a
// decompressor stays an I/O error the caller may retry.
func TestCompressedSourceErrorIsNotRejection(t *testing.T) {
	plain := build(t, file("a", strings.Repeat("z", 10000)+strings.Repeat("y", 10000)))
	for name, b := range map[string][]byte{"gzip": s3test.Gzip(t, plain), "zstd": s3test.Zstd(t, plain)} {
		_, err := Validate(context.Background(), &failingReader{r: bytes.NewReader(b), n: len(b) / 2}, Limits{})
		if !errors.Is(err, errSource) || IsRejection(err) {
			t.Errorf("%s: Validate: %v; want the source's error, not a rejection", name, err)
		}
	}
}

// TestDecompressionBomb: a small compressed object whose tar stream goes on
// far past what the limits admit (zeros after the end marker) is refused
// once the stream passes the bound, without reading the rest.
func TestDecompressionBomb(t *testing.T) {
	limits := Limits{MaxEntries: 10, MaxTotalSize: 1 << 20}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	writeEntries(t, zw, []ent{file("a", "x")})
	chunk := make([]byte, 1<<20)
	for range 64 { // 64 MiB of zeros after the archive
		zw.Write(chunk)
	}
	zw.Close()
	if buf.Len() > 1<<20 {
		t.Fatalf("bomb is %d bytes compressed", buf.Len())
	}
	rep, err := Validate(context.Background(), bytes.NewReader(buf.Bytes()), limits)
	if !errors.Is(err, ErrStreamTooLong) || !IsRejection(err) {
		t.Fatalf("Validate: %v; want ErrStreamTooLong", err)
	}
	if max := maxStreamBytes(limits); rep.ArchiveBytes > max {
		t.Errorf("read %d bytes of tar stream, more than the bound %d", rep.ArchiveBytes, max)
	}

	// Entry bodies count too: headers claiming huge PAX records.
	bomb, stop := streamed(func(tw *tar.Writer) error {
		for i := range 9 {
			h := &tar.Header{Typeflag: tar.TypeReg, Name: "f" + string(rune('a'+i)), Size: 1,
				PAXRecords: map[string]string{"SCHILY.xattr.user.big": strings.Repeat("z", 500<<10)}, Format: tar.FormatPAX}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if _, err := tw.Write([]byte("x")); err != nil {
				return err
			}
		}
		return nil
	})
	defer stop()
	_, err = Validate(context.Background(), bomb, Limits{MaxEntries: 10, MaxTotalSize: 1000})
	if !errors.Is(err, ErrStreamTooLong) {
		t.Fatalf("Validate of PAX-heavy headers: %v; want ErrStreamTooLong", err)
	}
}

// TestOtherCompressionNamed: an xz or bzip2 layer is refused with a message
// saying what it is and what is read.
func TestOtherCompressionNamed(t *testing.T) {
	for name, b := range map[string][]byte{"xz": append(bytes.Clone(xzMagic), make([]byte, 600)...), "bzip2": append([]byte("BZh91AY&SY"), make([]byte, 600)...)} {
		_, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), name+" data; only gzip and zstd") {
			t.Errorf("%s: %v", name, err)
		}
	}
	_, err := Validate(context.Background(), io.MultiReader(bytes.NewReader(s3test.Gzip(t, []byte("hello, not a tar")))), Limits{})
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "gzip data that is not a tar archive") {
		t.Errorf("gzip of text: %v", err)
	}
}

// failAfter accepts n bytes, then fails every write: a spool whose disk
// filled up.
type failAfter struct {
	n   int
	buf bytes.Buffer
}

func (f *failAfter) Write(p []byte) (int, error) {
	if f.buf.Len()+len(p) > f.n {
		return 0, errors.New("no space left on the spool")
	}
	return f.buf.Write(p)
}

// TestTeeTar: Validate with TeeTar hands over a compressed layer's whole
// tar stream, the bytes the diff ID names (end padding included), so that
// it can be extracted without decompressing the layer again; with and
// without the stages; a plain layer hands over nothing; a copy that fails
// leaves the validation and its diff ID as they would be without it.
func TestTeeTar(t *testing.T) {
	plain := build(t, realWorld()...)
	plain = append(plain, make([]byte, 8<<10)...) // a tar writer's record padding
	want := sha(plain)
	for _, stages := range []bool{true, false} {
		for _, c := range []struct {
			comp Compression
			b    []byte
		}{{Plain, plain}, {Gzip, s3test.Gzip(t, plain)}, {Zstd, s3test.Zstd(t, plain)}} {
			t.Run(fmt.Sprintf("%s/stages=%v", c.comp, stages), func(t *testing.T) {
				defer func(old bool) { readaheadEnabled = old }(readaheadEnabled)
				readaheadEnabled = stages
				var tee bytes.Buffer
				rep, err := Validate(context.Background(), bytes.NewReader(c.b), Limits{}, CallerHashesPlain(), TeeTar(&tee))
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if c.comp == Plain {
					if tee.Len() != 0 {
						t.Fatalf("a plain layer's tee got %d bytes, want none", tee.Len())
					}
					return
				}
				if rep.DiffID != want || !bytes.Equal(tee.Bytes(), plain) {
					t.Fatalf("tee got %d bytes hashing to %s, diff ID %s; want the %d-byte tar stream, %s", tee.Len(), sha(tee.Bytes()), rep.DiffID, len(plain), want)
				}
				broken := &failAfter{n: len(plain) / 3}
				rep, err = Validate(context.Background(), bytes.NewReader(c.b), Limits{}, CallerHashesPlain(), TeeTar(broken))
				if err != nil || rep.DiffID != want {
					t.Fatalf("with a failing tee: diff ID %s, %v; want %s and no error", rep.DiffID, err, want)
				}
				if broken.buf.Len() > len(plain)/3 {
					t.Fatalf("the failing tee kept %d bytes, more than it accepted", broken.buf.Len())
				}
			})
		}
	}
}
