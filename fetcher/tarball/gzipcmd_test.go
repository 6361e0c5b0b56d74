package tarball

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// igzip is the program GzipCommand is made for (ISA-L's inflater, Debian's
// package isal, which scripts/install-deps.sh installs).
func igzip(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("igzip")
	if err != nil {
		t.Fatalf("igzip, the gzip command under test, is not installed (Debian package isal; scripts/install-deps.sh installs it): %v", err)
	}
	return p
}

// layerFile writes b to a file of the test's and returns it open, as the
// pipelines hand layer files to Validate and Extract.
func layerFile(t testing.TB, b []byte) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layer")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// mixedTree is an archive of many entries of every kind, with files large
// enough to span many reads of the program's output.
func mixedTree(t testing.TB) []byte {
	ents := []ent{dir("etc"), dir("usr"), dir("var"), dir("usr/bin")}
	for i := range 200 {
		body := strings.Repeat("line "+strconv.Itoa(i)+" of a text file\n", 50*(i%7+1))
		ents = append(ents, file("usr/bin/f"+strconv.Itoa(i), body))
	}
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i*7919 + i/4096)
	}
	ents = append(ents, file("var/big", string(big)), symlink("etc/link", "../usr/bin/f1"))
	return build(t, ents...)
}

// TestGzipCommandSameAsBuiltin: a layer inflated by igzip validates to the
// same report and extracts to the same tree as with the built-in
// inflater, from a file and from a stream.
func TestGzipCommandSameAsBuiltin(t *testing.T) {
	ctx := context.Background()
	gz := s3test.Gzip(t, mixedTree(t))
	want, err := Validate(ctx, bytes.NewReader(gz), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]func() io.Reader{
		"file":   func() io.Reader { return layerFile(t, gz) },
		"stream": func() io.Reader { return struct{ io.Reader }{bytes.NewReader(gz)} },
	} {
		got, err := Validate(ctx, r(), Limits{}, InflateWith(igzip(t)))
		if err != nil {
			t.Fatalf("%s: Validate through igzip: %v", name, err)
		}
		if got != want {
			t.Errorf("%s: report through igzip %+v, built-in %+v", name, got, want)
		}
	}
	builtin, viaCmd := t.TempDir(), t.TempDir()
	stb, err := ExtractDir(ctx, bytes.NewReader(gz), builtin, ExtractOptions{NoChown: true, HashStream: true})
	if err != nil {
		t.Fatal(err)
	}
	stc, err := ExtractDir(ctx, layerFile(t, gz), viaCmd, ExtractOptions{NoChown: true, HashStream: true, GzipCommand: igzip(t)})
	if err != nil {
		t.Fatalf("Extract through igzip: %v", err)
	}
	if stc != stb {
		t.Errorf("stats through igzip %+v, built-in %+v", stc, stb)
	}
	gotTree, wantTree := describeTree(t, viaCmd), describeTree(t, builtin)
	delete(gotTree, ".") // the test's own directories
	delete(wantTree, ".")
	diffTrees(t, "extracted through igzip", gotTree, wantTree)
}

// TestHostileCorpusThroughGzipCommand: every archive of the hostile corpus,
// gzipped (those that are not already), gets the same rejection, naming
// the same entry, when igzip inflates it, and leaves the sandbox as the
// built-in inflater does.
func TestHostileCorpusThroughGzipCommand(t *testing.T) {
	gzc := igzip(t)
	for _, h := range hostileCorpus() {
		t.Run(h.name, func(t *testing.T) {
			s := newSandbox(t)
			b := h.archive(t, s)
			switch {
			case bytes.HasPrefix(b, gzipMagic):
			case bytes.HasPrefix(b, zstdMagic):
				return // not gzip: the command has no part in it
			default:
				b = s3test.Gzip(t, b)
			}
			_, want := Validate(context.Background(), bytes.NewReader(b), h.limits)
			checkRejection(t, "built-in Validate", want, h)
			_, err := Validate(context.Background(), layerFile(t, b), h.limits, InflateWith(gzc))
			checkRejection(t, "Validate through igzip", err, h)
			_, err = ExtractDir(context.Background(), layerFile(t, b), s.target, ExtractOptions{Limits: h.limits, GzipCommand: gzc})
			checkRejection(t, "Extract through igzip", err, h)
			s.intact(t)
			if h.absent != "" {
				if _, err := os.Lstat(filepath.Join(s.target, h.absent)); err == nil {
					t.Errorf("Extract through igzip left %s in the target", h.absent)
				}
			}
		})
	}
}

// TestGzipCommandEndOfStream: what igzip and unpigz ignore and the
// built-in inflater refuses (bytes after the gzip stream, a gzip member
// after them) is refused through them too; several members, which all
// take, are accepted with the same report.
func TestGzipCommandEndOfStream(t *testing.T) {
	ctx := context.Background()
	plain := mixedTree(t)
	one := s3test.Gzip(t, plain)
	half := len(plain) / 2
	members := append(s3test.Gzip(t, plain[:half]), s3test.Gzip(t, plain[half:])...)
	after := func(tail ...[]byte) []byte { return bytes.Join(append([][]byte{one}, tail...), nil) }
	cases := map[string][]byte{
		"two members":                 members,
		"garbage after":               after([]byte("garbage")),
		"zeros after":                 after(make([]byte, 4096)),
		"a lone magic byte after":     after([]byte{0x1f}),
		"garbage, then a member":      after([]byte("garbage"), s3test.Gzip(t, []byte("more"))),
		"an empty member after":       after(s3test.Gzip(t, nil)),
		"a member of zeros after":     after(s3test.Gzip(t, make([]byte, 1024))),
		"a member of non-zeros after": after(s3test.Gzip(t, []byte("not padding"))),
	}
	programs := []string{igzip(t)}
	if p, err := exec.LookPath("unpigz"); err == nil {
		programs = append(programs, p)
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			want, werr := Validate(ctx, bytes.NewReader(b), Limits{})
			for _, prog := range programs {
				got, err := Validate(ctx, struct{ io.Reader }{bytes.NewReader(b)}, Limits{}, InflateWith(prog))
				switch {
				case werr == nil && err != nil:
					t.Errorf("through %s: %v; built in it is accepted", prog, err)
				case werr == nil && got != want:
					t.Errorf("report through %s %+v, built-in %+v", prog, got, want)
				case werr != nil && !sameVerdict(err, werr):
					t.Errorf("through %s: %v; built in: %v", prog, err, werr)
				}
			}
		})
	}
}

// sameVerdict reports whether a refusal through a gzip command is the
// built-in inflater's: a malformed archive both, the program's words for
// corrupt data aside, or the same rule on the same entry.
func sameVerdict(err, builtin error) bool {
	switch {
	case !IsRejection(err) || !IsRejection(builtin):
		return false
	case errors.Is(builtin, ErrMalformed):
		return errors.Is(err, ErrMalformed)
	}
	return err.Error() == builtin.Error()
}

// TestGzipCommandCorruptAndCut: corrupt gzip data is a malformed archive
// through igzip as built in, naming the program's complaint; the source
// failing stays the source's error, retryable.
func TestGzipCommandCorruptAndCut(t *testing.T) {
	ctx := context.Background()
	gz := s3test.Gzip(t, mixedTree(t))
	flip := func(at int) []byte {
		c := bytes.Clone(gz)
		c[at] ^= 0xff
		return c
	}
	for name, b := range map[string][]byte{
		"truncated":    gz[:len(gz)/2],
		"bad data":     flip(len(gz) / 2),
		"bad checksum": flip(len(gz) - 6),
		"bad header":   flip(3)[:12],
	} {
		_, err := Validate(ctx, layerFile(t, b), Limits{}, InflateWith(igzip(t)))
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Validate through igzip: %v; want a malformed archive", name, err)
		}
		s := newSandbox(t)
		_, err = ExtractDir(ctx, layerFile(t, b), s.target, ExtractOptions{NoChown: true, GzipCommand: igzip(t)})
		if !IsRejection(err) {
			t.Errorf("%s: Extract through igzip: %v; want a rejection", name, err)
		}
	}
	_, err := Validate(ctx, &failingReader{r: bytes.NewReader(gz), n: len(gz) / 2}, Limits{}, InflateWith(igzip(t)))
	if !errors.Is(err, errSource) || IsRejection(err) {
		t.Errorf("source failing under igzip: %v; want the source's error, not a rejection", err)
	}
	_, err = Validate(ctx, bytes.NewReader(gz), Limits{}, InflateWith("/nonexistent/igzip"))
	if err == nil || IsRejection(err) || !strings.Contains(err.Error(), "/nonexistent/igzip") {
		t.Errorf("missing program: %v; want an error naming it, not a rejection", err)
	}
}

// TestGzipCommandEndsWithTheLayer: a layer refused early, or whose read is
// canceled, leaves no program running once Validate or Extract returns.
func TestGzipCommandEndsWithTheLayer(t *testing.T) {
	var ents []ent
	for i := range 20000 {
		ents = append(ents, file("f"+strconv.Itoa(i), strings.Repeat("x", 1000+i%100)))
	}
	gz := s3test.Gzip(t, build(t, ents...))
	_, err := Validate(context.Background(), layerFile(t, gz), Limits{MaxEntries: 10}, InflateWith(igzip(t)))
	if !errors.Is(err, ErrTooManyEntries) {
		t.Fatalf("Validate: %v; want too many entries", err)
	}
	if kids := children(t); len(kids) > 0 {
		t.Errorf("after a rejection, programs still running: %v", kids)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := newSandbox(t)
	_, err = ExtractDir(ctx, layerFile(t, gz), s.target, ExtractOptions{NoChown: true, GzipCommand: igzip(t),
		Progress: func(p Progress) {
			if p.Entries == 100 {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Extract: %v; want canceled", err)
	}
	if kids := children(t); len(kids) > 0 {
		t.Errorf("after a cancel, programs still running: %v", kids)
	}
}

// children lists the test process's child processes (zombies included:
// one not waited for is a leak too).
func children(t testing.TB) []string {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	me := strconv.Itoa(os.Getpid())
	var kids []string
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(b[i+1:])); len(f) > 1 && f[1] == me {
			kids = append(kids, string(b[:i+1]))
		}
	}
	return kids
}

// TestGzipCommandKilledIsNotAVerdict: a gzip command ended by a signal
// sent from outside (systemd's SIGTERM to every process of the unit at a
// stop, the OOM killer's SIGKILL) says nothing of the layer's data, so the
// extraction fails retryably instead of refusing the layer as malformed.
func TestGzipCommandKilledIsNotAVerdict(t *testing.T) {
	var ents []ent
	for i := range 20000 {
		ents = append(ents, file("f"+strconv.Itoa(i), strings.Repeat("x", 1000+i%100)))
	}
	gz := s3test.Gzip(t, build(t, ents...))
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		s := newSandbox(t)
		killed := false
		_, err := ExtractDir(context.Background(), layerFile(t, gz), s.target, ExtractOptions{NoChown: true, GzipCommand: igzip(t),
			Progress: func(p Progress) {
				if killed || p.Entries < 100 {
					return
				}
				killed = true
				for _, k := range children(t) {
					pid, _ := strconv.Atoi(strings.Fields(k)[0])
					syscall.Kill(pid, sig)
				}
			}})
		if !killed {
			t.Fatalf("%v: the extraction ended before the program could be signalled: %v", sig, err)
		}
		if err == nil || IsRejection(err) || IsPermanent(err) {
			t.Errorf("%v sent to the gzip command: %v; want a retryable error, not a verdict on the layer", sig, err)
		}
	}
}
