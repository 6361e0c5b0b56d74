package tarball

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// deepLevels is the depth of every path of the deep archive of
// BenchmarkDeepPaths: 2,000 components, one byte each (so that the name
// stays within PATH_MAX).
const deepLevels = 2000

// writeTreeArchive writes n empty regular files named
// <prefix>d/d/d/d/f<i>, the four d being the first digits of i: unique
// paths, in the order tar lists a tree. The directories are implied, as in
// archives made without directory entries.
func writeTreeArchive(tb testing.TB, file, prefix string, n int) {
	f, err := os.Create(file)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(w)
	for i := range n {
		d := fmt.Sprintf("%05d", i)
		name := fmt.Sprintf("%s%c/%c/%c/%c/f%s", prefix, d[0], d[1], d[2], d[3], d)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, ModTime: testTime, Format: tar.FormatPAX}); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
}

// peakHeap samples the heap's live objects every millisecond while fn runs
// and returns the highest value seen.
func peakHeap(fn func()) uint64 {
	runtime.GC()
	var peak atomic.Uint64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	fn()
	close(done)
	<-stopped
	return peak.Load()
}

// readHeaders is the anchor of BenchmarkDeepPaths: archive/tar reading
// every header of the archive and nothing else.
func readHeaders(tb testing.TB, archive string) time.Duration {
	f, err := os.Open(archive)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	t0 := time.Now()
	tr := tar.NewReader(bufio.NewReaderSize(f, readBufferSize))
	for {
		_, err := tr.Next()
		if err == io.EOF {
			return time.Since(t0)
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkDeepPaths validates and extracts 100,000 entries with unique
// paths 2,000 levels deep, and the same tree 5 levels deep, and validates
// 100,000 entries whose 2,000-level paths share nothing (each implies 1,999
// new directories). It reports the peak heap of validation and the time
// per entry of validation and extraction.
//
// It fails if validating either deep archive needs 128 MiB of heap or
// more, if the archive of disjoint paths is not refused with
// ErrTooManyDirs, if extracting a deep entry (with the common limit of
// 1,024 open files) costs more than 3 times a shallow one, or if
// validating a deep entry costs more than 3 times reading its header with
// archive/tar alone (the anchor, timed in the same run). A deep header
// costs archive/tar itself about 15 times a shallow one (it checks the
// name component by component with filepath.IsLocal), so the
// deep/shallow ratio of validation is reported, not bounded.
//
//	go test -tags '...' -run '^$' -bench DeepPaths -benchtime 1x ./fetcher/tarball/
func BenchmarkDeepPaths(b *testing.B) {
	const entries = 100_000
	work := b.TempDir()
	deep, shallow := filepath.Join(work, "deep.tar"), filepath.Join(work, "shallow.tar")
	writeTreeArchive(b, deep, strings.Repeat("a/", deepLevels-5), entries)
	writeTreeArchive(b, shallow, "", entries)

	ctx := context.Background()
	type result struct {
		val, ext, anchor time.Duration
		heap             uint64
	}
	run := func(archive string, i int) result {
		var r result
		r.anchor = readHeaders(b, archive)
		f, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		r.heap = peakHeap(func() {
			t0 := time.Now()
			rep, err := Validate(ctx, f, Limits{})
			r.val = time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if rep.Files != entries {
				b.Fatalf("%s: %d files validated", archive, rep.Files)
			}
		})
		if _, err := f.Seek(0, 0); err != nil {
			b.Fatal(err)
		}
		dir := filepath.Join(work, fmt.Sprintf("x%d-%s", i, filepath.Base(archive)))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		var old unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			b.Fatal(err)
		}
		lim := old
		lim.Cur = min(old.Cur, 1024)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		st, err := ExtractDir(ctx, f, dir, ExtractOptions{NoChown: true})
		r.ext = time.Since(t0)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			b.Fatal(err)
		}
		if err != nil {
			b.Fatal(err)
		}
		if st.Files != entries {
			b.Fatalf("%s: %d files extracted", archive, st.Files)
		}
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
		return r
	}
	// disjoint validates the hostile archive, generated on the fly.
	disjoint := func() (uint64, error) {
		spine := strings.Repeat("a/", deepLevels-2)
		r, stop := streamed(func(tw *tar.Writer) error {
			for i := range entries {
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%d/%sf", i, spine), Mode: 0o644, ModTime: testTime}); err != nil {
					return err
				}
			}
			return nil
		})
		defer stop()
		var err error
		heap := peakHeap(func() { _, err = Validate(ctx, r, Limits{}) })
		return heap, err
	}
	var d, s result
	var hostileHeap uint64
	i := 0
	for b.Loop() {
		i++
		// Alternate the order so neither side always runs on a warmer cache.
		var rd, rs result
		if i%2 == 1 {
			rd, rs = run(deep, i), run(shallow, i)
		} else {
			rs, rd = run(shallow, i), run(deep, i)
		}
		d.val, d.ext, d.anchor, d.heap = d.val+rd.val, d.ext+rd.ext, d.anchor+rd.anchor, max(d.heap, rd.heap)
		s.val, s.ext, s.anchor, s.heap = s.val+rs.val, s.ext+rs.ext, s.anchor+rs.anchor, max(s.heap, rs.heap)
		h, err := disjoint()
		if !errors.Is(err, ErrTooManyDirs) {
			b.Errorf("%d entries of disjoint %d-level paths: %v, want %v", entries, deepLevels, err, ErrTooManyDirs)
		}
		hostileHeap = max(hostileHeap, h)
	}
	per := func(t time.Duration) float64 { return float64(t.Nanoseconds()) / float64(i*entries) }
	b.Logf("validate ns/entry: deep %.0f (archive/tar alone %.0f), shallow %.0f (archive/tar alone %.0f)", per(d.val), per(d.anchor), per(s.val), per(s.anchor))
	b.Logf("extract ns/entry: deep %.0f, shallow %.0f", per(d.ext), per(s.ext))
	b.Logf("validate peak heap MiB: deep %.1f, shallow %.1f, disjoint deep (refused) %.1f", float64(d.heap)/(1<<20), float64(s.heap)/(1<<20), float64(hostileHeap)/(1<<20))
	b.ReportMetric(per(d.val), "deep-validate-ns/entry")
	b.ReportMetric(per(s.val), "shallow-validate-ns/entry")
	b.ReportMetric(per(d.ext), "deep-extract-ns/entry")
	b.ReportMetric(per(s.ext), "shallow-extract-ns/entry")
	b.ReportMetric(float64(d.heap)/(1<<20), "deep-peak-heap-MiB")
	b.ReportMetric(float64(s.heap)/(1<<20), "shallow-peak-heap-MiB")
	b.ReportMetric(float64(hostileHeap)/(1<<20), "disjoint-peak-heap-MiB")
	vr, va, er := per(d.val)/per(s.val), float64(d.val)/float64(d.anchor), per(d.ext)/per(s.ext)
	b.ReportMetric(vr, "validate-deep/shallow")
	b.ReportMetric(va, "validate-deep/archive-tar")
	b.ReportMetric(er, "extract-deep/shallow")
	if d.heap >= 128<<20 || hostileHeap >= 128<<20 {
		b.Errorf("validating %d entries %d levels deep took %d MiB (disjoint: %d MiB) of heap, limit 128", entries, deepLevels, d.heap>>20, hostileHeap>>20)
	}
	if va > 3 || er > 3 {
		b.Errorf("a deep entry costs %.1f times reading its header (validate) and %.1f times a shallow entry (extract), limit 3", va, er)
	}
}
