package tarball

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDirListedTwiceKeepsLastTimes: a directory the archive lists twice
// (again after its files, or after a file replaced it) ends with its last
// entry's mode and times, as containerd's applier leaves it.
func TestDirListedTwiceKeepsLastTimes(t *testing.T) {
	t1 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	t2 := time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(e ent, mtime time.Time) ent { e.hdr.ModTime = mtime; return e }
	for name, ents := range map[string][]ent{
		"listed twice": {at(dir("d/"), t1), file("d/f", "x"), at(dir("d/").mode(0o750), t2)},
		"replaced":     {at(dir("d/"), t1), file("d", "x"), at(dir("d/").mode(0o750), t2)},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSandbox(t)
			if _, err := ExtractDir(context.Background(), bytes.NewReader(build(t, ents...)), s.target, ExtractOptions{}); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(filepath.Join(s.target, "d"))
			if err != nil || !fi.IsDir() {
				t.Fatalf("d: %v, %v; want a directory", fi, err)
			}
			if !fi.ModTime().Equal(t2) || fi.Mode().Perm() != 0o750 {
				t.Errorf("d: mtime %v, mode %o; want the last entry's %v, 750", fi.ModTime().UTC(), fi.Mode().Perm(), t2)
			}
		})
	}
}
