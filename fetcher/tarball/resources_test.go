package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// withFileLimit runs fn with the soft limit of open files set to n (the
// whole test process shares it, so these tests do not run in parallel).
func withFileLimit(t *testing.T, n uint64, fn func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = n
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}
	}()
	fn()
}

func openFiles(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestDeepPathBoundedDescriptors: paths 2,000 directories deep extract
// under the common limit of 1,024 open files, the extractor holding a
// bounded number of them whatever the depth; climbing back up out of the
// window of open directories, and hard links between deep directories,
// work.
func TestDeepPathBoundedDescriptors(t *testing.T) {
	deep := strings.Repeat("a/", 1999)
	half := strings.Repeat("a/", 1000)
	b := build(t,
		file(deep+"f", "deep"),
		file(half+"g", "half"), // far above the window of open levels
		file(deep+"h", "deep again"),
		hardlink(half+"link", deep+"f"),
		file("top", "top"),
	)
	s := newSandbox(t)
	base := openFiles(t)
	peak := 0
	withFileLimit(t, 1024, func() {
		st, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{
			NoChown:  true,
			Progress: func(Progress) { peak = max(peak, openFiles(t)-base) },
		})
		if err != nil {
			t.Fatalf("Extract: %v", err)
		}
		if st.Files != 4 || st.Hardlinks != 1 {
			t.Errorf("stats %+v", st)
		}
	})
	// The ReadDir of /proc/self/fd itself holds one.
	if peak > maxOpenLevels+4 {
		t.Errorf("%d descriptors open during extraction, want at most %d", peak, maxOpenLevels+4)
	}
	root, err := os.OpenRoot(s.target)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for name, want := range map[string]string{deep + "f": "deep", half + "g": "half", deep + "h": "deep again", half + "link": "deep", "top": "top"} {
		if got, err := root.ReadFile(name); err != nil || string(got) != want {
			t.Errorf("%d levels deep: %q, %v; want %q", strings.Count(name, "/"), got, err, want)
		}
	}
	s.intact(t)
}

// TestExhaustedIsPermanent: running out of descriptors while extracting is
// an ErrExhausted failure naming the entry, which IsPermanent reports, so
// the pipeline gives up instead of retrying.
func TestExhaustedIsPermanent(t *testing.T) {
	b := build(t, file(strings.Repeat("a/", 200)+"f", "x"))
	s := newSandbox(t)
	var err error
	withFileLimit(t, uint64(openFiles(t)+8), func() {
		_, err = ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{NoChown: true})
	})
	if !errors.Is(err, ErrExhausted) || !errors.Is(err, unix.EMFILE) || !IsPermanent(err) {
		t.Fatalf("Extract with 8 spare descriptors: %v; want ErrExhausted and EMFILE, permanent", err)
	}
	if !strings.Contains(err.Error(), `entry "a/a/`) {
		t.Errorf("error does not name the entry: %v", err)
	}
	if IsPermanent(errors.New("connection reset")) {
		t.Error("IsPermanent of an I/O error")
	}
}

// TestDirectoryNamesNotHeld: the memory an extraction holds for the
// directories whose times it sets at the end does not grow with their
// names' length. 3,000 directories named with nearly 4,000 bytes each leave
// the heap within 1 MiB of 3,000 named with 9 bytes; held, the long names
// alone would be 11 MB (a million of them, the differ's limit, 4 GB).
func TestDirectoryNamesNotHeld(t *testing.T) {
	const n = 3000
	heldFor := func(prefix string) uint64 {
		gen := func(tw *tar.Writer) error {
			for i := range n {
				h := &tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("%s%08d/", prefix, i), Mode: 0o755, Format: tar.FormatPAX}
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
			}
			return nil
		}
		r, stop := streamed(gen)
		defer stop()
		var heap uint64
		progress := func(p Progress) {
			if p.Entries == n {
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				heap = ms.HeapAlloc
			}
		}
		if _, err := ExtractDir(context.Background(), r, newSandbox(t).target, ExtractOptions{NoChown: true, Progress: progress}); err != nil {
			t.Fatal(err)
		}
		return heap
	}
	long := strings.Repeat(strings.Repeat("d", 250)+"/", 15)
	short, deep := heldFor(""), heldFor(long)
	if deep > short+1<<20 {
		t.Errorf("heap with %d directories of %d-byte names: %d bytes, with 9-byte names: %d; want the names not held", n, len(long)+9, deep, short)
	}
}
