package tarball

import (
	"bytes"
	"context"
	"testing"
)

// fuzzLimits keep each fuzz input cheap to extract.
var fuzzLimits = Limits{MaxEntries: 2000, MaxFileSize: 1 << 20, MaxTotalSize: 8 << 20}

// FuzzValidate: Validate never panics; whatever it accepts, Extract into a
// fresh directory extracts without error, and whatever it rejects, Extract
// rejects too; whatever the input, Extract (validated or not) writes nothing
// outside its target.
//
//	go test -tags '...' -run '^$' -fuzz FuzzValidate -fuzztime 5m ./fetcher/tarball/
func FuzzValidate(f *testing.F) {
	const canary = "/nonexistent-fuzz-canary"
	for _, h := range hostileCorpus() {
		if h.ents != nil {
			f.Add(build(f, h.ents(canary)...))
		} else {
			f.Add(h.raw(f))
		}
	}
	rw := realWorld()
	f.Add(build(f, rw...))
	f.Add(build(f, append([]ent{dir("rootfs/")}, prefixed("rootfs/", rw)...)...))
	f.Add(build(f, file(".wh.f", ""), dir("b/"), file("b/.wh..wh..opq", ""), file("b/new", "n"), file("a/.wh.gone", "")))
	f.Add(build(f, dir("d/"), file("d/f", "f"), file("d", "x"), dir("d/"), hardlink("h", "d/f")))
	f.Add(build(f, file("t", "x"), hardlink("h", "t"), symlink("s", "t"), hardlink("h2", "s")))
	f.Add(build(f, dir("d/"), symlink("d/s", canary), file(".wh.d", ""), file("d/s/x", "y")))
	f.Add(build(f, dir("d/"), symlink("d/s", canary), file("d", ""), dir("d/"), file("d/s/x", "y"), symlink("d/s", canary), file("d/s/z", "z")))

	f.Fuzz(func(t *testing.T, b []byte) {
		ctx := context.Background()
		rep, verr := Validate(ctx, bytes.NewReader(b), fuzzLimits)
		if verr != nil && !IsRejection(verr) {
			t.Fatalf("Validate of in-memory bytes failed with a non-rejection: %v", verr)
		}
		s := newSandbox(t)
		_, xerr := ExtractDir(ctx, bytes.NewReader(b), s.target, ExtractOptions{Limits: fuzzLimits, StripRootfs: rep.HasRootfs})
		s.intact(t)
		if verr == nil && xerr != nil {
			t.Fatalf("Validate accepted (report %+v) but Extract failed: %v", rep, xerr)
		}
		if verr != nil && xerr == nil {
			t.Fatalf("Validate rejected (%v) but Extract accepted", verr)
		}
	})
}
