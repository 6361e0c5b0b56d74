package tarball

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// ustarHeader is one 512-byte USTAR header block (archive/tar's writer
// refuses to write the sparse records these tests need).
func ustarHeader(name string, typ byte, size int64) []byte {
	h := make([]byte, 512)
	copy(h[0:], name)
	copy(h[100:], "0000644\x00")
	copy(h[108:], "0000000\x00")
	copy(h[116:], "0000000\x00")
	copy(h[124:], fmt.Sprintf("%011o\x00", size))
	copy(h[136:], fmt.Sprintf("%011o\x00", testTime.Unix()))
	h[156] = typ
	copy(h[257:], "ustar\x0000")
	copy(h[148:], "        ")
	sum := 0
	for _, b := range h {
		sum += int(b)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	return h
}

func pad(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }

// paxRecord is one "<len> key=value\n" record, len counting itself.
func paxRecord(k, v string) string {
	rest := " " + k + "=" + v + "\n"
	n := len(rest) + 1
	for len(strconv.Itoa(n))+len(rest) != n {
		n++
	}
	return strconv.Itoa(n) + rest
}

// sparseBomb is a PAX (GNU 1.0) sparse entry named name claiming size
// bytes, of which only data, at the very end, is stored: a few KB of
// archive for a file of any size.
func sparseBomb(name string, size int64, data []byte) []byte {
	recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", name) + paxRecord("GNU.sparse.realsize", strconv.FormatInt(size, 10))
	var out []byte
	out = append(out, ustarHeader("PaxHeaders/"+name, 'x', int64(len(recs)))...)
	out = append(out, pad([]byte(recs))...)
	smap := pad(fmt.Appendf(nil, "1\n%d\n%d\n", size-int64(len(data)), len(data)))
	body := append(smap, data...)
	out = append(out, ustarHeader("GNUSparseFile.0/"+name, '0', int64(len(body)))...)
	return append(out, pad(body)...)
}

func endArchive(b []byte) []byte { return append(b, make([]byte, 1024)...) }

// allocated is the space a file takes on disk.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestSparseBombStaysSparse: a 10 KB archive of 1 GiB sparse files
// allocates only its real data, the holes kept, and reads back right.
func TestSparseBombStaysSparse(t *testing.T) {
	data := bytes.Repeat([]byte("real"), 1024)
	var b []byte
	for i := range 3 {
		b = append(b, sparseBomb(fmt.Sprintf("bomb%d", i), 1<<30, data)...)
	}
	b = endArchive(b)
	if len(b) > 20<<10 {
		t.Fatalf("archive of %d bytes", len(b))
	}
	rep, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if rep.TotalBytes != 3<<30 {
		t.Fatalf("Validate counted %d bytes, want the logical 3 GiB", rep.TotalBytes)
	}
	s := newSandbox(t)
	st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{NoChown: true})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if st.Written != 3*int64(len(data)) {
		t.Errorf("written %d bytes, want %d", st.Written, 3*len(data))
	}
	for i := range 3 {
		p := filepath.Join(s.target, fmt.Sprintf("bomb%d", i))
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != 1<<30 {
			t.Errorf("%s: size %d", p, fi.Size())
		}
		if a := allocated(t, p); a > 64<<10 {
			t.Errorf("%s: %d bytes allocated for %d of data", p, a, len(data))
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		tail := make([]byte, len(data))
		_, err = f.ReadAt(tail, 1<<30-int64(len(data)))
		head := make([]byte, 4096)
		_, herr := f.ReadAt(head, 1<<20)
		f.Close()
		if err != nil || herr != nil || !bytes.Equal(tail, data) || !bytes.Equal(head, zeroBlock[:]) {
			t.Errorf("%s: content wrong (%v, %v)", p, err, herr)
		}
	}
	s.intact(t)
}

// TestOverBudgetRefused: an archive with more data than the caller's
// budget is refused naming the entry and the rule, and the entry that
// crossed the budget is not left behind.
func TestOverBudgetRefused(t *testing.T) {
	b := build(t, file("a", string(bytes.Repeat([]byte("a"), 6000))), file("b", string(bytes.Repeat([]byte("b"), 6000))))
	s := newSandbox(t)
	st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{NoChown: true, MaxDataBytes: 10000})
	var pe *PolicyError
	if !errors.As(err, &pe) || !errors.Is(err, ErrOverBudget) || pe.Entry != "b" || !IsPermanent(err) {
		t.Fatalf("Extract: %v; want ErrOverBudget on entry b", err)
	}
	if _, err := os.Lstat(filepath.Join(s.target, "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("entry b left behind: %v", err)
	}
	if st.Written > 10000 {
		t.Errorf("%d bytes written past a budget of 10000", st.Written)
	}
	s.intact(t)
}
