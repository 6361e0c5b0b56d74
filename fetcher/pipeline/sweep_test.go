package pipeline

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestResumeServesPastALeftoverItCannotRemove: a start-up finds a
// download temp file of a run no longer live that it cannot remove (here
// a directory with a file in it stands at its path). The daemon still
// starts, pulls, and leaves the leftover for the next start.
func TestResumeServesPastALeftoverItCannotRemove(t *testing.T) {
	e := newPullEnv(t, nil)
	stuck := filepath.Join(e.p.opts.tmpDir(), "obj-gone.partial")
	if err := os.MkdirAll(stuck, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stuck, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.p.sweep(context.Background()); err == nil {
		t.Fatal("the sweep removed a non-empty directory: the test does not make the leftover it means to")
	}
	e.p = e.reopen(nil) // fails the test if Resume does
	e.srv.Put(t, "img/1.tar", layerTar(t, "img", 3000))
	e.mustPull("img/", "img")
	if _, err := os.Stat(stuck); err != nil {
		t.Errorf("the leftover: %v, want it left for the next start", err)
	}
}
