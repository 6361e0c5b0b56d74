package s3test

import (
	"bytes"
	"compress/gzip"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// Gzip returns b compressed as one gzip stream, the bytes of a .tar.gz
// layer object; it fails tb if compressing fails.
func Gzip(tb testing.TB, b []byte) []byte {
	tb.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		tb.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// Zstd returns b compressed as one zstd frame, the bytes of a .tar.zst
// layer object; it fails tb if compressing fails.
func Zstd(tb testing.TB, b []byte) []byte {
	tb.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := zw.Write(b); err != nil {
		tb.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}
