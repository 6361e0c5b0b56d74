package tarball

import (
	"hash/maphash"
	"testing"
)

// TestIncrementalPrefixKeys: ancestors relies on an incremental hash of the
// components giving the same key as hashing the prefix at once.
func TestIncrementalPrefixKeys(t *testing.T) {
	c := newChecker(Limits{}, false)
	for _, name := range []string{"a", "usr/lib/x86_64-linux-gnu/perl/5.36", "a/b/c/d/e/f/g/h/" + string(make([]byte, 300))} {
		var h maphash.Hash
		h.SetSeed(c.seed)
		for i := range len(name) {
			h.WriteByte(name[i])
			if i+1 == len(name) || name[i+1] == '/' {
				if got, want := h.Sum64(), c.key(name[:i+1]); got != want {
					t.Fatalf("prefix %q: incremental key %x, key %x", name[:i+1], got, want)
				}
			}
		}
	}
}
