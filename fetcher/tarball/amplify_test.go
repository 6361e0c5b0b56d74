package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Layers that cost far more to read than they weigh: extended attributes
// by the ten thousand, and zeros after the end-of-archive marker.

const (
	heavyEntries = 300
	heavyXattrs  = 25_000 // about what one 1 MiB PAX header holds
)

// Keys of the records of a heavy layer: extended attributes, or PAX
// records of no meaning (which cost as much to parse).
const (
	xattrKeys = "SCHILY.xattr.user."
	junkKeys  = "junk."
)

// recordHeavy generates, as it is read, a layer of heavyEntries files with
// heavyXattrs PAX records each, keys prefix and a number: ~225 MB of tar,
// a few hundred KiB compressed.
func recordHeavy(prefix string) (io.Reader, func()) {
	records := make(map[string]string, heavyXattrs)
	for i := range heavyXattrs {
		records[prefix+strconv.Itoa(i)] = "v"
	}
	return streamed(func(tw *tar.Writer) error {
		for i := range heavyEntries {
			h := &tar.Header{Typeflag: tar.TypeReg, Name: "f" + strconv.Itoa(i), Mode: 0o644, Format: tar.FormatPAX, PAXRecords: records}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestRecordHeavyLayerRefused: the layer of 300 entries with 25,000 xattr
// records each is refused at its first entry, before any record is
// applied, by Validate and Extract alike; so is the same layer with
// records of no meaning instead. (Their CPU cost is measured by
// BenchmarkRecordHeavyLayer.)
func TestRecordHeavyLayerRefused(t *testing.T) {
	for prefix, rule := range map[string]error{xattrKeys: ErrTooManyXattrs, junkKeys: ErrTooManyPAXRecords} {
		want := hostile{rule: rule, entry: "f0"}
		r, stop := recordHeavy(prefix)
		rep, err := Validate(context.Background(), r, Limits{})
		stop()
		checkRejection(t, "Validate", err, want)
		if rep.Entries != 1 {
			t.Errorf("%s: Validate read %d entries, want the first only", prefix, rep.Entries)
		}
		s := newSandbox(t)
		r, stop = recordHeavy(prefix)
		st, err := ExtractDir(context.Background(), r, s.target, ExtractOptions{NoChown: true})
		stop()
		checkRejection(t, "Extract", err, want)
		if st.XattrBytes != 0 || st.Files != 0 {
			t.Errorf("%s: Extract applied %d bytes of xattrs to %d files before refusing", prefix, st.XattrBytes, st.Files)
		}
		s.intact(t)
	}
}

// TestXattrsAgainstDataBudget: extended attributes take space, so they
// count with file data against ExtractOptions.MaxDataBytes, before any is
// set; the entry that crosses the budget is refused and removed.
func TestXattrsAgainstDataBudget(t *testing.T) {
	var ents []ent
	for i := range 20 {
		// "user.k" and 94 bytes: 100 bytes per entry, no file data.
		ents = append(ents, file("f"+strconv.Itoa(i), "").pax("SCHILY.xattr.user.k", strings.Repeat("v", 94)))
	}
	b := build(t, ents...)
	rep, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
	if err != nil || rep.XattrBytes != 2000 || rep.TotalBytes != 0 {
		t.Fatalf("Validate: %+v, %v; want 2000 bytes of xattrs, no file data", rep, err)
	}
	s := newSandbox(t)
	st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{NoChown: true, MaxDataBytes: 1000})
	var pe *PolicyError
	if !errors.As(err, &pe) || !errors.Is(err, ErrOverBudget) || pe.Entry != "f10" {
		t.Fatalf("Extract: %v; want ErrOverBudget on entry f10 (the 11th 100 bytes)", err)
	}
	if st.Written+st.XattrBytes > 1000 {
		t.Errorf("%d bytes of data and %d of xattrs past a budget of 1000", st.Written, st.XattrBytes)
	}
	if _, err := os.Lstat(filepath.Join(s.target, "f10")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("entry f10 left behind: %v", err)
	}
	s.intact(t)
}

// TestValidateAndExtractAgreeOnXattrs: on the same archives, Validate and
// Extract accept the same ones and refuse the others with the same rule
// at the same entry, whatever the xattr limits.
func TestValidateAndExtractAgreeOnXattrs(t *testing.T) {
	archives := map[string][]ent{
		"few":        {dir("d/").pax("SCHILY.xattr.user.a", "1"), withXattrs(file("d/f", "data"), 3, 10)},
		"many":       {file("a", "x"), withXattrs(file("b", "y"), 40, 1), file("c", "z")},
		"large":      {withXattrs(file("a", ""), 4, 300), withXattrs(dir("d/"), 2, 2000)},
		"total":      {file("a", strings.Repeat("a", 900)), withXattrs(file("b", "b"), 5, 40)},
		"non-user":   {file("a", "x").pax("SCHILY.xattr.trusted.t", "1").pax("SCHILY.xattr.security.selinux", "system_u")},
		"on-symlink": {symlink("l", "target").pax("SCHILY.xattr.user.a", strings.Repeat("v", 500))},
	}
	limitSets := []Limits{{}, {MaxXattrs: 4}, {MaxXattrBytes: 1500}, {MaxTotalSize: 1000}, {MaxXattrs: 3, MaxXattrBytes: 100}}
	outcome := func(err error) string {
		var pe *PolicyError
		switch {
		case err == nil:
			return "accepted"
		case errors.As(err, &pe):
			return fmt.Sprintf("%s at %q", pe.Rule, pe.Entry)
		default:
			return "error " + err.Error()
		}
	}
	refused := 0
	for name, ents := range archives {
		b := build(t, ents...)
		for _, l := range limitSets {
			_, verr := Validate(context.Background(), bytes.NewReader(b), l)
			_, xerr := ExtractDir(context.Background(), bytes.NewReader(b), t.TempDir(), ExtractOptions{Limits: l, NoChown: true})
			if v, x := outcome(verr), outcome(xerr); v != x {
				t.Errorf("%s with %+v: Validate %s, Extract %s", name, l, v, x)
			}
			if verr != nil {
				refused++
			}
		}
	}
	if refused == 0 {
		t.Fatal("no archive refused: the comparison proves nothing")
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// TestZeroTailBounded: 8 GiB of zeros after a valid tar (made as it is
// read, never stored) are refused once MaxPadding is passed, by Validate
// and Extract; what they read of the source is bounded by the padding
// bound, the read buffer and what the readahead stages hold, not by the
// tail. (Timed by
// BenchmarkZeroTail.)
func TestZeroTailBounded(t *testing.T) {
	tarBytes := build(t, file("a", "x"))
	bound := int64(len(tarBytes)) + MaxPadding + 2*readBufferSize + readaheadBuffers*readaheadChunk
	want := hostile{rule: ErrTrailingData, entry: "a"}
	src := &countingReader{r: io.MultiReader(bytes.NewReader(tarBytes), io.LimitReader(zeros{}, 8<<30))}
	_, err := Validate(context.Background(), src, Limits{})
	checkRejection(t, "Validate", err, want)
	if src.n > bound {
		t.Errorf("Validate read %d bytes, want at most %d", src.n, bound)
	}
	s := newSandbox(t)
	src = &countingReader{r: io.MultiReader(bytes.NewReader(tarBytes), io.LimitReader(zeros{}, 8<<30))}
	_, err = ExtractDir(context.Background(), src, s.target, ExtractOptions{NoChown: true})
	checkRejection(t, "Extract", err, want)
	if src.n > bound {
		t.Errorf("Extract read %d bytes, want at most %d", src.n, bound)
	}
	s.intact(t)
}

// TestPaddingAccepted: the padding real writers leave (a 10 KiB record,
// a large blocking factor) up to MaxPadding is accepted and in the diff
// ID; one zero more is not.
func TestPaddingAccepted(t *testing.T) {
	tarBytes := build(t, file("a", "x"))
	for _, n := range []int{0, 10240 - len(tarBytes)%10240, 1 << 20, MaxPadding} {
		b := append(bytes.Clone(tarBytes), make([]byte, n)...)
		rep, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
		if err != nil || rep.DiffID != sha(b) {
			t.Errorf("%d bytes of padding: %v (diff ID %s, want %s)", n, err, rep.DiffID, sha(b))
		}
		if _, err := ExtractDir(context.Background(), bytes.NewReader(b), t.TempDir(), ExtractOptions{NoChown: true}); err != nil {
			t.Errorf("%d bytes of padding: Extract: %v", n, err)
		}
	}
	b := append(bytes.Clone(tarBytes), make([]byte, MaxPadding+1)...)
	if _, err := Validate(context.Background(), bytes.NewReader(b), Limits{}); !errors.Is(err, ErrTrailingData) {
		t.Errorf("MaxPadding+1 bytes of padding: %v, want ErrTrailingData", err)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRecordHeavyLayer reports the CPU time (the whole process's:
// the generator included) of refusing the 300 x 25,000 xattr layer, and
// the same with records of no meaning, next to an anchor: Validate of the
// xattr layer with the limits lifted, which has to parse every header
// (what validation cost before the limits; extraction then made one
// system call per record on top).
//
//	go test -tags 'sqlite_omit_load_extension osusergo netgo' ./fetcher/tarball/ -run '^$' -bench RecordHeavy -benchtime 3x
func BenchmarkRecordHeavyLayer(b *testing.B) {
	lifted := Limits{MaxXattrs: MaxLimitCount, MaxXattrBytes: MaxLimitBytes, MaxTotalSize: MaxLimitBytes}
	run := func(b *testing.B, fn func(io.Reader) error, want error) {
		prefix := xattrKeys
		if want == ErrTooManyPAXRecords {
			prefix = junkKeys
		}
		var cpu time.Duration
		for b.Loop() {
			r, stop := recordHeavy(prefix)
			start := cpuTime(b)
			err := fn(r)
			cpu += cpuTime(b) - start
			stop()
			if !errors.Is(err, want) && !(want == nil && err == nil) {
				b.Fatalf("%v, want %v", err, want)
			}
		}
		b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	}
	b.Run("anchor-validate-limits-lifted", func(b *testing.B) {
		run(b, func(r io.Reader) error { _, err := Validate(context.Background(), r, lifted); return err }, nil)
	})
	b.Run("validate-refused", func(b *testing.B) {
		run(b, func(r io.Reader) error { _, err := Validate(context.Background(), r, Limits{}); return err }, ErrTooManyXattrs)
	})
	b.Run("extract-refused", func(b *testing.B) {
		dir := b.TempDir()
		run(b, func(r io.Reader) error {
			_, err := ExtractDir(context.Background(), r, dir, ExtractOptions{NoChown: true})
			return err
		}, ErrTooManyXattrs)
	})
	b.Run("validate-junk-records-refused", func(b *testing.B) {
		run(b, func(r io.Reader) error { _, err := Validate(context.Background(), r, Limits{}); return err }, ErrTooManyPAXRecords)
	})
}

// BenchmarkZeroTail reports the CPU time of refusing a valid tar followed
// by 8 GiB of zeros (made as they are read), next to an anchor: the same
// tar followed by MaxPadding of zeros, accepted.
//
//	go test -tags 'sqlite_omit_load_extension osusergo netgo' ./fetcher/tarball/ -run '^$' -bench ZeroTail -benchtime 3x
func BenchmarkZeroTail(b *testing.B) {
	tarBytes := build(b, file("a", "x"))
	run := func(b *testing.B, tail int64, want error) {
		var cpu time.Duration
		for b.Loop() {
			start := cpuTime(b)
			_, err := Validate(context.Background(), io.MultiReader(bytes.NewReader(tarBytes), io.LimitReader(zeros{}, tail)), Limits{})
			cpu += cpuTime(b) - start
			if !errors.Is(err, want) && !(want == nil && err == nil) {
				b.Fatalf("%v, want %v", err, want)
			}
		}
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	}
	b.Run("anchor-padding-accepted", func(b *testing.B) { run(b, MaxPadding, nil) })
	b.Run("8GiB-tail-refused", func(b *testing.B) { run(b, 8<<30, ErrTrailingData) })
}

// TestHugeLimitsDoNotOverflow: limits at their type's maximum (given in
// code, past what the config accepts) are taken as MaxLimitBytes and
// MaxLimitCount, so the stream bound derived from them stays positive and
// an ordinary layer passes.
func TestHugeLimitsDoNotOverflow(t *testing.T) {
	b := build(t, file("a", "x").pax("SCHILY.xattr.user.k", "v"), file("b", "y"))
	for _, huge := range []Limits{
		{MaxTotalSize: math.MaxInt64 - 1},
		{MaxEntries: 1 << 40, MaxTotalSize: 1 << 62},
		{MaxEntries: math.MaxInt, MaxFileSize: math.MaxInt64, MaxTotalSize: math.MaxInt64, MaxXattrs: math.MaxInt, MaxXattrBytes: math.MaxInt64},
	} {
		if _, err := Validate(context.Background(), bytes.NewReader(b), huge); err != nil {
			t.Errorf("Validate with %+v: %v", huge, err)
		}
		if _, err := ExtractDir(context.Background(), bytes.NewReader(b), t.TempDir(), ExtractOptions{Limits: huge, NoChown: true}); err != nil {
			t.Errorf("Extract with %+v: %v", huge, err)
		}
	}
}
