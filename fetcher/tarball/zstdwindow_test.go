package tarball

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// zstdRawFrame wraps b (at most 128 KiB) in a zstd frame of one raw block
// whose header declares a window of 1<<windowLog bytes, as zstd's
// --ultra -22 and --long (27) do for 128 MiB.
func zstdRawFrame(t *testing.T, b []byte, windowLog int) []byte {
	t.Helper()
	if len(b) > 128<<10 {
		t.Fatalf("a raw block holds at most 128 KiB, not %d bytes", len(b))
	}
	frame := append([]byte(nil), zstdMagic...)
	// Frame header descriptor 0: a window descriptor follows, no content
	// size, no checksum, no dictionary. The window is 1<<(10+exponent).
	frame = append(frame, 0x00, byte(windowLog-10)<<3)
	h := 1 | len(b)<<3 // last block, raw, its size
	frame = append(frame, byte(h), byte(h>>8), byte(h>>16))
	return append(frame, b...)
}

// TestZstdWindowOfEveryZstdLevel: a zstd layer whose frame declares the
// 128 MiB window of zstd's highest levels (--ultra -22) and of its long
// mode is read; a larger one is refused with an error that names the
// limit, not as corrupt data.
func TestZstdWindowOfEveryZstdLevel(t *testing.T) {
	plain := build(t, realWorld()...)
	rep, err := Validate(context.Background(), bytes.NewReader(zstdRawFrame(t, plain, 27)), Limits{})
	if err != nil || rep.Compression != Zstd || rep.DiffID != sha(plain) {
		t.Fatalf("a layer with a 128 MiB zstd window: %+v, %v; want it read as zstd with diff ID %s", rep, err, sha(plain))
	}
	_, err = Validate(context.Background(), bytes.NewReader(zstdRawFrame(t, plain, 28)), Limits{})
	if err == nil || !strings.Contains(err.Error(), "window") || !strings.Contains(err.Error(), "128 MiB") || strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("a layer with a 256 MiB zstd window: %v; want it refused naming the 128 MiB window limit", err)
	}
}
