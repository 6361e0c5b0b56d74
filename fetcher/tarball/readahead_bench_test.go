package tarball

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	carchive "github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/opencontainers/go-digest"
)

// BenchmarkExtractStages extracts one gzip layer (about 96 MiB of
// image-like files, hashed for its diff ID as a streamed pull does) four
// ways in each round, alternating their order: on one goroutine (the
// decompression, the SHA-256 and the writes one after another), with the
// readahead stages (each on its own goroutine), with GNU `tar -xzf`,
// which runs gzip as a second process, the anchor a user would reach for,
// and as containerd's own applier does when it unpacks a registry layer
// (its decompressor, the diff ID hashed by a tee on the same goroutine,
// archive.Apply), which must find the same diff ID. It reports each way
// against tar, the stages' speed-up and containerd's applier against the
// stages; on a machine with one free core the stages cannot gain.
//
//	go test -tags '...' -run '^$' -bench ExtractStages -benchtime 3x ./fetcher/tarball/
func BenchmarkExtractStages(b *testing.B) {
	requireGNUTar(b)
	work := b.TempDir()
	archive := filepath.Join(work, "layer.tar.gz")
	writeGzipLayer(b, archive, 96<<20)
	ctx := context.Background()
	var diffID string // the stages' result, which containerd's must match
	igzipPath := igzip(b)
	extract := func(dir string, stages bool, gzipCommand string) time.Duration {
		f, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		readaheadEnabled = stages
		defer func() { readaheadEnabled = true }()
		t0 := time.Now()
		st, err := ExtractDir(ctx, f, dir, ExtractOptions{HashStream: true, GzipCommand: gzipCommand})
		if err != nil || st.DiffID == "" {
			b.Fatalf("extract (stages %v): %v, diff ID %q", stages, err, st.DiffID)
		}
		diffID = st.DiffID
		return time.Since(t0)
	}
	containerdApply := func(dir string) time.Duration {
		f, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		t0 := time.Now()
		ds, err := compression.DecompressStream(f)
		if err != nil {
			b.Fatal(err)
		}
		defer ds.Close()
		dg := digest.Canonical.Digester()
		rc := io.TeeReader(ds, dg.Hash())
		if _, err := carchive.Apply(ctx, dir, rc); err != nil {
			b.Fatalf("containerd's archive.Apply: %v", err)
		}
		if _, err := io.Copy(io.Discard, rc); err != nil {
			b.Fatal(err)
		}
		took := time.Since(t0)
		if diffID != "" && dg.Digest().String() != diffID {
			b.Fatalf("containerd's applier hashed %s, the stages %s", dg.Digest(), diffID)
		}
		return took
	}
	ways := []struct {
		name string
		run  func(dir string) time.Duration
	}{
		{"one goroutine", func(dir string) time.Duration { return extract(dir, false, "") }},
		{"stages", func(dir string) time.Duration { return extract(dir, true, "") }},
		{"tar -xzf", func(dir string) time.Duration {
			t0 := time.Now()
			if out, err := exec.Command("tar", "-C", dir, "-xzf", archive).CombinedOutput(); err != nil {
				b.Fatalf("tar -xzf: %v: %s", err, out)
			}
			return time.Since(t0)
		}},
		{"containerd's applier", containerdApply},
		{"stages, igzip inflating", func(dir string) time.Duration { return extract(dir, true, igzipPath) }},
	}
	took := make([]time.Duration, len(ways))
	round := 0
	for b.Loop() {
		for k := range ways {
			i := (k + round) % len(ways)
			dir := filepath.Join(work, fmt.Sprintf("x-%d-%d", round, i))
			if err := os.Mkdir(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			took[i] += ways[i].run(dir)
			os.RemoveAll(dir)
		}
		round++
	}
	b.ReportMetric(float64(took[0])/float64(took[2]), "one-goroutine/tar")
	b.ReportMetric(float64(took[1])/float64(took[2]), "stages/tar")
	b.ReportMetric(float64(took[0])/float64(took[1]), "speedup")
	b.ReportMetric(float64(took[3])/float64(took[1]), "containerd-applier/stages")
	b.ReportMetric(float64(took[4])/float64(took[1]), "igzip-stages/stages")
}

// writeGzipLayer writes a gzip-compressed tar of about size bytes of
// image-like files (imageLikeBytes), from 4 KiB to 1 MiB each.
func writeGzipLayer(b *testing.B, path string, size int) {
	content := imageLikeBytes(size)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for i, off := 0, 0; off < len(content); i++ {
		n := min(4096<<(i%9), len(content)-off)
		if i%40 == 0 {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("usr/share/d%03d/", i/40), Mode: 0o755, ModTime: testTime})
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("usr/share/d%03d/f%05d", i/40, i), Mode: 0o644, Size: int64(n), ModTime: testTime}); err != nil {
			b.Fatal(err)
		}
		tw.Write(content[off : off+n])
		off += n
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	zw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
}
