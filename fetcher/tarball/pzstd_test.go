package tarball

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
)

// pzstdLayer is a tar of etc/ and etc/hello ("hello\n") compressed by
// pzstd 1.5.4 (`pzstd -p 2`), zstd's parallel compressor: its output puts
// a skippable frame (magic 0x184D2A50, holding the next frame's size)
// before every zstd frame, so it opens with no zstd frame's magic. The tar
// stream's SHA-256 is pzstdDiffID.
const (
	pzstdLayer = "" +
		"UCpNGAQAAAB2AAAAKLUv/QRYTQMA0gQOFJC16aQ+GI3U/zN+W/ltw2IvUlQGwYRG2M7fnn8aSqWioJXm8yAWIMAj3N7mm297Nf53" +
		"wz8LWikSAJljxwBYOJj7X20AA6oZIDpadeCxCnNgQhKgAAqA4RJIJwDZYAUAx8pleAJaucYa+A=="
	pzstdDiffID = "sha256:6a6ed6802fed9fa8c122e22a55c3b53756b584fb049c6bab172b79d90dc69b9b"
)

// TestZstdOpeningWithSkippableFrame: a zstd layer whose first frame is a
// skippable one (pzstd's output, and any zstd stream carrying metadata
// ahead of its data) is zstd, as the zstd format and containerd's
// decompressor have it: validated and extracted with the tar stream's
// diff ID, not refused as a tar archive it never was.
func TestZstdOpeningWithSkippableFrame(t *testing.T) {
	b, err := base64.StdEncoding.DecodeString(pzstdLayer)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Validate(context.Background(), bytes.NewReader(b), Limits{})
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if rep.Compression != Zstd || rep.DiffID != pzstdDiffID || rep.ArchiveBytes != 10240 {
		t.Errorf("report %+v; want zstd, diff ID %s over 10240 tar bytes", rep, pzstdDiffID)
	}
	s := newSandbox(t)
	if _, err := ExtractDir(context.Background(), bytes.NewReader(b), s.target, ExtractOptions{NoChown: true}); err != nil {
		t.Fatalf("ExtractDir: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(s.target, "etc/hello")); err != nil || string(got) != "hello\n" {
		t.Errorf("etc/hello = %q, %v; want \"hello\\n\"", got, err)
	}
	s.intact(t)
}
