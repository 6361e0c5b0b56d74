package tarball

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"
)

// TestIncrementalPrefixKeys: ancestors derives each prefix's key from its
// parent's, and must land on the key of the prefix hashed at once.
func TestIncrementalPrefixKeys(t *testing.T) {
	c := newChecker(Limits{}, false)
	for _, dir := range []string{"a", "usr/lib/x86_64-linux-gnu/perl/5.36", "a/b/c/d/e/f/g/h/" + strings.Repeat("x", 200)} {
		if _, err := c.ancestors(dir, dir, true); err != nil {
			t.Fatal(err)
		}
		if len(c.anc.ends) != strings.Count(dir, "/")+1 {
			t.Fatalf("%q: %d cached levels", dir, len(c.anc.ends))
		}
		for i, end := range c.anc.ends {
			if got, want := c.anc.keys[i], c.key(dir[:end]); got != want {
				t.Fatalf("prefix %q: incremental key %x, key %x", dir[:end], got, want)
			}
		}
	}
}

// TestAncestorCacheForgetsReplaced: a directory of the cached walk later
// replaced by a symlink must not be trusted by the next entry below it.
func TestAncestorCacheForgetsReplaced(t *testing.T) {
	deep := strings.Repeat("d/", 50)
	for _, tc := range []struct {
		name string
		repl ent
		rule error
	}{
		{"symlink", symlink(deep+"x", "/etc"), ErrThroughSymlink},
		{"file", file(deep+"x", "x"), ErrParentNotDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker(Limits{}, false)
			for _, e := range []ent{file(deep+"x/y/f", "f"), tc.repl} {
				if _, err := c.admit(&e.hdr); err != nil {
					t.Fatal(err)
				}
			}
			g := file(deep+"x/y/g", "g")
			_, err := c.admit(&g.hdr)
			if !errors.Is(err, tc.rule) {
				t.Fatalf("entry below the replaced directory: %v, want %v", err, tc.rule)
			}
		})
	}
}

// TestImplicitDirBudget: unique deep paths imply a directory per
// component; past MaxEntries of them the archive is refused, naming the
// rule, instead of the checker growing by the depth on every entry.
func TestImplicitDirBudget(t *testing.T) {
	c := newChecker(Limits{MaxEntries: 10_000}, false)
	deep := strings.Repeat("a/", 1000)
	var err error
	n := 0
	for ; n < 100 && err == nil; n++ {
		e := file(fmt.Sprintf("%d/%sf", n, deep), "")
		_, err = c.admit(&e.hdr)
	}
	if !errors.Is(err, ErrTooManyDirs) {
		t.Fatalf("after %d entries: %v, want %v", n, err, ErrTooManyDirs)
	}
	if !strings.Contains(err.Error(), "more than 10000 directories") || n != 10 {
		t.Errorf("after %d entries: %v", n, err)
	}
	if len(c.nodes) > 10_100 {
		t.Errorf("%d names remembered, budget 10,000", len(c.nodes))
	}
}

// TestAncestorCacheKeepsStaleness: a directory whited out and made again
// while its path is cached is new for hard links: a link to a file it
// held before is refused.
func TestAncestorCacheKeepsStaleness(t *testing.T) {
	c := newChecker(Limits{}, false)
	for _, e := range []ent{file("d/x/f", "f"), file("d/.wh.x", ""), file("d/x/g", "g")} {
		if _, err := c.admit(&e.hdr); err != nil {
			t.Fatal(err)
		}
	}
	h := hardlink("h", "d/x/f")
	if _, err := c.admit(&h.hdr); !errors.Is(err, ErrHardlinkTarget) {
		t.Fatalf("link to a file of a re-made directory: %v, want %v", err, ErrHardlinkTarget)
	}
	h = hardlink("h2", "d/x/g")
	if _, err := c.admit(&h.hdr); err != nil {
		t.Fatalf("link to a file of the new directory: %v", err)
	}
}

// TestIsCleanAgreesWithPathClean: the fast path of cleanName takes a name
// as it is only when path.Clean would leave it unchanged and no rule
// applies to it.
func TestIsCleanAgreesWithPathClean(t *testing.T) {
	for _, n := range []string{"a", "a/b", "usr/lib/x.so", ".", "./a", "a/", "a//b", "a/./b", "a/..", "../a", "..a/b..", ".a/.b",
		"/a", "", "a/" + strings.Repeat("c", 256), strings.Repeat("d/", 10) + "e"} {
		got, want := isClean(n), n != "" && path.Clean(n) == n && !strings.HasPrefix(n, "/") && n != "." &&
			!strings.HasPrefix(n, "../") && n != ".." && !strings.Contains(n, strings.Repeat("c", 256))
		if got != want {
			t.Errorf("isClean(%.30q) = %v, want %v", n, got, want)
		}
	}
}
