package tarball

import (
	"bytes"
	stdgzip "compress/gzip"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	kgzip "github.com/klauspost/compress/gzip"
)

// imageLikeBytes is about size bytes shaped like a layer's content: text
// (words from a small vocabulary, as source files, scripts and manifests
// are) interleaved with incompressible runs (as compiled code and already
// compressed files are), so that it compresses about as well as real
// images (gzip -6 leaves roughly 40%).
func imageLikeBytes(size int) []byte {
	rng := rand.New(rand.NewChaCha8([32]byte{7}))
	words := []string{"the", "include", "return", "static", "const", "usr", "lib", "share", "func", "if", "else", "for", "int", "char", "void", "error", "value", "config", "path", "name"}
	var b bytes.Buffer
	for b.Len() < size {
		if rng.IntN(3) == 0 {
			run := make([]byte, 512+rng.IntN(4096))
			for i := range run {
				run[i] = byte(rng.Uint32())
			}
			b.Write(run)
			continue
		}
		for range 200 + rng.IntN(800) {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(" \n\t"[rng.IntN(3)])
		}
	}
	return b.Bytes()[:size]
}

// BenchmarkInflate measures the two pure-Go gzip inflaters on the same
// 64 MiB image-like stream in one run, the standard library's and
// klauspost/compress's, which newStream uses, and igzip as a gzip command
// runs it. It reports each one's throughput and the speed-ups that decide
// the choices: klauspost/stdlib, and igzip/klauspost.
//
//	go test -tags '...' -run '^$' -bench Inflate -benchtime 3x ./fetcher/tarball/
func BenchmarkInflate(b *testing.B) {
	raw := imageLikeBytes(64 << 20)
	var gz bytes.Buffer
	zw := stdgzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	inflaters := []struct {
		name string
		open func(io.Reader) (io.Reader, error)
	}{
		{"stdlib", func(r io.Reader) (io.Reader, error) { return stdgzip.NewReader(r) }},
		{"klauspost", func(r io.Reader) (io.Reader, error) { return kgzip.NewReader(r) }},
		// igzip as daemon.gzip_command runs it: fed and read through
		// pipes, the end mark checked.
		{"igzip", func(r io.Reader) (io.Reader, error) { return startInflateCommand(igzip(b), r) }},
	}
	took := make([]time.Duration, len(inflaters))
	for range b.N {
		// Alternate the two in each iteration so that machine load falls
		// on both alike.
		for i, in := range inflaters {
			start := time.Now()
			r, err := in.open(bytes.NewReader(gz.Bytes()))
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, r)
			if err != nil || n != int64(len(raw)) {
				b.Fatalf("%s: %d bytes, %v", in.name, n, err)
			}
			took[i] += time.Since(start)
		}
	}
	for i, in := range inflaters {
		b.ReportMetric(float64(len(raw))*float64(b.N)/took[i].Seconds()/1e6, in.name+"-MB/s")
	}
	b.ReportMetric(float64(took[0])/float64(took[1]), "klauspost/stdlib-speedup")
	b.ReportMetric(float64(took[1])/float64(took[2]), "igzip/klauspost-speedup")
	b.ReportMetric(float64(gz.Len())/float64(len(raw)), "gzip-ratio")
}
