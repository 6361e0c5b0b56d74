package tarball

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// writeBenchArchive writes an image-like archive of about size bytes: a few
// hundred directories, files from 1 KiB to 1 MiB of incompressible content,
// some symlinks and hard links.
func writeBenchArchive(b *testing.B, path string, size int64) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	rng := rand.New(rand.NewChaCha8([32]byte{1}))
	buf := make([]byte, 1<<20)
	var total int64
	for i := 0; total < size; i++ {
		d := fmt.Sprintf("usr/lib/pkg%03d", i/20)
		if i%20 == 0 {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: testTime}); err != nil {
				b.Fatal(err)
			}
		}
		n := 1024 << rng.IntN(11) // 1 KiB .. 1 MiB
		name := fmt.Sprintf("%s/file%05d.so", d, i)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(n), ModTime: testTime}); err != nil {
			b.Fatal(err)
		}
		for j := range buf[:n] {
			buf[j] = byte(rng.Uint32())
		}
		if _, err := tw.Write(buf[:n]); err != nil {
			b.Fatal(err)
		}
		total += int64(n)
		if i%50 == 0 {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name + ".abs", Linkname: "/" + name, ModTime: testTime})
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: name + ".hard", Linkname: name, ModTime: testTime})
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkValidateExtract measures Validate then Extract of a ~200 MB
// archive against GNU `tar -x` of the same file in the same run, and
// reports the ratio (ours / tar). Each iteration extracts into a fresh
// directory; both sides read the archive from the page cache.
//
//	go test -tags '...' -run '^$' -bench ValidateExtract -benchtime 5x ./fetcher/tarball/
func BenchmarkValidateExtract(b *testing.B) {
	requireGNUTar(b)
	work := b.TempDir()
	archive := filepath.Join(work, "bench.tar")
	writeBenchArchive(b, archive, 200<<20)
	fi, err := os.Stat(archive)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(fi.Size())

	var valTime, extTime time.Duration
	ctx := context.Background()
	tarTime, n := againstTar(b, work, archive, func(dir string) {
		f, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		t0 := time.Now()
		rep, err := Validate(ctx, f, Limits{})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			b.Fatal(err)
		}
		if _, err := ExtractDir(ctx, f, dir, ExtractOptions{StripRootfs: rep.HasRootfs}); err != nil {
			b.Fatal(err)
		}
		valTime += t1.Sub(t0)
		extTime += time.Since(t1)
	})
	b.ReportMetric(float64(valTime+extTime)/float64(tarTime), "ratio-vs-tar-x")
	b.ReportMetric(float64(extTime)/float64(tarTime), "extract-ratio-vs-tar-x")
	b.ReportMetric(float64(fi.Size())/1e6/(valTime.Seconds()/float64(n)), "validate-MB/s")
}

// againstTar runs ours and GNU `tar -x` of archive, each into a fresh
// folder under work, once per iteration of b.Loop, taking turns at going
// first so that neither always pays for the other's dirty pages being
// written back. ours times itself; againstTar returns the time tar took in
// all and the number of iterations.
func againstTar(b *testing.B, work, archive string, ours func(dir string)) (tarTime time.Duration, n int) {
	for b.Loop() {
		n++
		oursDir, tarDir := filepath.Join(work, fmt.Sprint("ours-", n)), filepath.Join(work, fmt.Sprint("tar-", n))
		for _, d := range []string{oursDir, tarDir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		runTar := func() {
			t0 := time.Now()
			if out, err := exec.Command("tar", "-C", tarDir, "-xf", archive).CombinedOutput(); err != nil {
				b.Fatalf("tar -x: %v: %s", err, out)
			}
			tarTime += time.Since(t0)
		}
		if n%2 == 1 {
			runTar()
			ours(oursDir)
		} else {
			ours(oursDir)
			runTar()
		}
		os.RemoveAll(oursDir)
		os.RemoveAll(tarDir)
	}
	return tarTime, n
}

// BenchmarkSmallFiles extracts an archive of 20,000 files of 100 to 1,000
// bytes in 200 directories, where what each entry costs (the system calls
// around a file) outweighs its bytes, as in a layer of source files or
// Python and Node packages. It runs against GNU `tar -x` of the same file
// in the same run, the two taking turns, and reports the ratio (ours /
// tar). With TMPDIR on a tmpfs the file system's own work is left out.
//
//	TMPDIR=/dev/shm go test -tags '...' -run '^$' -bench SmallFiles -benchtime 10x ./fetcher/tarball/
func BenchmarkSmallFiles(b *testing.B) {
	requireGNUTar(b)
	work := b.TempDir()
	archive := filepath.Join(work, "small.tar")
	f, err := os.Create(archive)
	if err != nil {
		b.Fatal(err)
	}
	tw := tar.NewWriter(f)
	body := make([]byte, 1000)
	for i := range body {
		body[i] = byte(i*7 + 1)
	}
	for i := range 20000 {
		if i%100 == 0 {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("site-packages/p%03d/", i/100), Mode: 0o755, ModTime: testTime}); err != nil {
				b.Fatal(err)
			}
		}
		n := 100 + i%901
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("site-packages/p%03d/m%05d.py", i/100, i), Mode: 0o644, Size: int64(n), ModTime: testTime}); err != nil {
			b.Fatal(err)
		}
		if _, err := tw.Write(body[:n]); err != nil {
			b.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var ours time.Duration
	gnu, n := againstTar(b, work, archive, func(dir string) {
		f, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		t0 := time.Now()
		st, err := ExtractDir(ctx, f, dir, ExtractOptions{})
		if err != nil || st.Files != 20000 {
			b.Fatalf("extract: %d files, %v", st.Files, err)
		}
		ours += time.Since(t0)
	})
	b.ReportMetric(float64(ours)/float64(gnu), "ratio-vs-tar-x")
	b.ReportMetric(float64(n)*20000/ours.Seconds(), "files/s")
}
