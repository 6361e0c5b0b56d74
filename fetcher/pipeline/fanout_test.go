package pipeline

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

// failAfter accepts limit bytes, then fails with err.
type failAfter struct {
	n, limit int
	err      error
}

func (w *failAfter) Write(b []byte) (int, error) {
	if w.n+len(b) > w.limit {
		return 0, w.err
	}
	w.n += len(b)
	return len(b), nil
}

// TestCopyFanOut: every writer gets the whole stream, in order, whatever
// the source's read sizes; the first failure (source's, or a writer's own
// error value) ends the copy.
func TestCopyFanOut(t *testing.T) {
	data := make([]byte, 3*fanOutChunk+12345)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	var a, b bytes.Buffer
	h := sha256.New()
	n, err := copyFanOut(iotest.HalfReader(bytes.NewReader(data)), &a, h, &b)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("copy: %d, %v", n, err)
	}
	if !bytes.Equal(a.Bytes(), data) || !bytes.Equal(b.Bytes(), data) || "sha256:"+hex.EncodeToString(h.Sum(nil)) != sha(data) {
		t.Fatal("a writer did not get the stream as read")
	}

	rejected := errors.New("rejected")
	_, err = copyFanOut(bytes.NewReader(data), io.Discard, &failAfter{limit: fanOutChunk, err: rejected})
	if err != rejected {
		t.Errorf("writer failure: err %v, want the writer's own error value", err)
	}
	cut := errors.New("connection reset")
	n, err = copyFanOut(io.MultiReader(bytes.NewReader(data[:1000]), iotest.ErrReader(cut)), &a)
	if !errors.Is(err, cut) || n != 1000 {
		t.Errorf("source failure: %d, %v; want 1000 bytes and the source's error", n, err)
	}
	n, err = copyFanOut(iotest.ErrReader(io.ErrUnexpectedEOF), io.Discard)
	if err != io.ErrUnexpectedEOF || n != 0 {
		t.Errorf("a source's io.ErrUnexpectedEOF is an error, not the end: %d, %v", n, err)
	}
}
