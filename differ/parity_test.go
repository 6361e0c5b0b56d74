package differ

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

var (
	parityCases = flag.Int("differ.parity-cases", 1000, "TestApplyMatchesContainerdApplier: how many random layer stacks to apply both ways")
	paritySeed  = flag.Uint64("differ.parity-seed", 1, "TestApplyMatchesContainerdApplier: the seed of the first stack (each case adds one)")
)

// TestApplyMatchesContainerdApplier applies the same random stacks of
// registry layers both ways, with containerd's applier (archive.Apply, what
// containerd runs for a devmapper snapshot) and with ours (the extraction
// Apply runs, with DefaultConfig's rules), each onto a directory of its
// own, and compares what a container would see: every path's type,
// permission bits, owner, content, symlink target, device number, user.*
// extended attributes and modification time, and which names share an
// inode. The layers mix files, directories, symlinks, hard links,
// whiteouts, opaque markers, fifos and device nodes over a few names, so
// that entries replace, hide and reach one another through the lower
// layers. A layer ours refuses must break one of the rules operating.md
// says are stricter than containerd's; a layer containerd refuses must be
// refused by ours too. Either refusal ends the stack.
//
// -differ.parity-cases and -differ.parity-seed run more stacks, or one
// again: a failure names its seed.
func TestApplyMatchesContainerdApplier(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("applying owners and device nodes takes root: run the tests as root")
	}
	limits := DefaultConfig().Limits()
	// The rules operating.md lists as stricter than containerd's applier.
	stricter := []error{tarball.ErrSymlinkEscape, tarball.ErrThroughSymlink}
	ctx := context.Background()
	for i := range *parityCases {
		seed := *paritySeed + uint64(i)
		rng := rand.New(rand.NewPCG(seed, seed))
		layers := make([][]parityEntry, 1+rng.IntN(3))
		for j := range layers {
			layers[j] = parityLayer(rng)
		}
		theirs, ours := t.TempDir(), t.TempDir()
		times := true
		for j, l := range layers {
			raw := parityTar(t, l)
			_, cerr := archive.Apply(ctx, theirs, bytes.NewReader(raw))
			_, oerr := tarball.ExtractDir(ctx, bytes.NewReader(raw), ours, tarball.ExtractOptions{Limits: limits, KeepRootMetadata: true})
			if oerr != nil && !tarball.IsRejection(oerr) {
				t.Fatalf("seed %d, layer %d: ours failed, not as a refusal: %v\n%s", seed, j, oerr, parityDescribe(layers[:j+1]))
			}
			if oerr != nil && cerr == nil && !slices.ContainsFunc(stricter, func(r error) bool { return errors.Is(oerr, r) }) {
				t.Fatalf("seed %d, layer %d: ours refused what containerd applies, by a rule not documented as stricter: %v\n%s", seed, j, oerr, parityDescribe(layers[:j+1]))
			}
			if cerr != nil && oerr == nil {
				// containerd's applier sets the times of the layer's
				// directory entries after all its entries, through the
				// names as they then resolve, and fails the layer when
				// one no longer leads to a directory. What it applied is
				// then whole: the trees must match but for times.
				if diff := parityCompare(t, theirs, ours, false); diff != "" {
					t.Fatalf("seed %d, layer %d: containerd refused (%v), ours applied, and the trees differ (containerd's, then ours):\n%s\nlayers:\n%s", seed, j, cerr, diff, parityDescribe(layers[:j+1]))
				}
			}
			if cerr != nil || oerr != nil {
				break
			}
			// containerd's applier sets a directory entry's times once the
			// layer is applied, on whatever its name then leads to: a file
			// that replaced the directory later in the same layer takes
			// the directory's times. Ours gives each entry its own; the
			// times of such a stack are not compared from there on.
			times = times && !parityDirReplaced(theirs, l)
			if diff := parityCompare(t, theirs, ours, times); diff != "" {
				t.Fatalf("seed %d, layer %d: the trees differ (containerd's, then ours):\n%s\nlayers:\n%s", seed, j, diff, parityDescribe(layers[:j+1]))
			}
		}
	}
}

// parityEntry is one tar entry of a generated layer.
type parityEntry struct {
	hdr  tar.Header
	body string
}

// parityNames are the names the layers write over: few, so that entries
// meet. Directories and files take the same names in turn.
var parityNames = []string{"a", "b", "c", "a/d", "a/e", "b/d", "a/d/f", "c/g"}

// parityLinks are the symlink targets: names in the tree, under it, above
// it, absolute, and missing.
var parityLinks = []string{"a", "b", "a/d", "d", "..", "../b", "/b", "/a/d", ".", "missing", "../../x"}

var parityEpoch = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

func parityLayer(rng *rand.Rand) []parityEntry {
	var out []parityEntry
	for range 1 + rng.IntN(8) {
		name := parityNames[rng.IntN(len(parityNames))]
		h := tar.Header{Name: name, Mode: 0o644, Format: tar.FormatPAX,
			Uid: []int{0, 1000}[rng.IntN(2)], Gid: []int{0, 1000}[rng.IntN(2)],
			ModTime: parityEpoch.Add(time.Duration(rng.IntN(1000)) * time.Hour)}
		e := parityEntry{}
		switch k := rng.IntN(20); {
		case k < 7:
			h.Typeflag, e.body = tar.TypeReg, fmt.Sprintf("%s-%d", name, rng.IntN(100))
			h.Mode = []int64{0o644, 0o755, 0o600, 0o4755, 0o2755, 0}[rng.IntN(6)]
			if rng.IntN(4) == 0 {
				h.PAXRecords = map[string]string{"SCHILY.xattr.user.k": fmt.Sprint(rng.IntN(10))}
			}
		case k < 11:
			h.Typeflag, h.Name = tar.TypeDir, name+"/"
			h.Mode = []int64{0o755, 0o700, 0o1777, 0o2775}[rng.IntN(4)]
		case k < 14:
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, parityLinks[rng.IntN(len(parityLinks))], 0o777
		case k < 16:
			h.Typeflag, h.Linkname = tar.TypeLink, parityNames[rng.IntN(len(parityNames))]
		case k < 18:
			h.Typeflag, h.Name = tar.TypeReg, filepath.Join(filepath.Dir(name), ".wh."+filepath.Base(name))
		case k < 19:
			h.Typeflag, h.Name = tar.TypeReg, filepath.Join(name, ".wh..wh..opq")
		default:
			h.Typeflag, h.Mode = []byte{tar.TypeFifo, tar.TypeChar}[rng.IntN(2)], 0o640
			if h.Typeflag == tar.TypeChar {
				h.Devmajor, h.Devminor = 1, 3
			}
		}
		h.Size = int64(len(e.body))
		e.hdr = h
		if !parityFits(out, h) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// parityFits reports whether h may follow the entries of layer as a tool
// that writes layers would list it: each name once, nothing below a name
// the layer makes something other than a directory, no whiteout of the
// layer's own entries (a whiteout applies to the lower layers only), and
// opaque markers before the entries they could hide (writers put one
// right after its directory's entry; containerd's applier, given one
// after an entry below it, removes the directories that entry's name
// made). Layers that break these are hostile input, whose rules other
// tests hold.
func parityFits(layer []parityEntry, h tar.Header) bool {
	name := filepath.Clean(h.Name)
	hidden, isWhiteout := parityWhiteoutOf(h.Name)
	if filepath.Base(name) == ".wh..wh..opq" && slices.ContainsFunc(layer, func(o parityEntry) bool {
		_, w := parityWhiteoutOf(o.hdr.Name)
		return !w
	}) {
		return false
	}
	for _, o := range layer {
		other := filepath.Clean(o.hdr.Name)
		switch {
		case other == name:
			return false
		case h.Typeflag != tar.TypeDir && parityUnder(other, name):
			return false
		case o.hdr.Typeflag != tar.TypeDir && parityUnder(name, other):
			return false
		case isWhiteout && parityUnder(other, hidden):
			return false
		}
	}
	return true
}

// parityWhiteoutOf returns what the whiteout name hides: the sibling it
// names, or for an opaque marker its directory.
func parityWhiteoutOf(name string) (string, bool) {
	dir, base := filepath.Split(name)
	switch {
	case base == ".wh..wh..opq":
		return filepath.Clean(dir), true
	case strings.HasPrefix(base, ".wh."):
		return filepath.Join(dir, strings.TrimPrefix(base, ".wh.")), true
	}
	return "", false
}

// parityUnder reports whether the entry name is target or below it.
func parityUnder(name, target string) bool {
	name = filepath.Clean(name)
	return name == target || strings.HasPrefix(name, target+"/")
}

func parityTar(t *testing.T, entries []parityEntry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %q: %v", h.Name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func parityDescribe(layers [][]parityEntry) string {
	var sb strings.Builder
	for j, l := range layers {
		fmt.Fprintf(&sb, "  layer %d:\n", j)
		for _, e := range l {
			h := e.hdr
			fmt.Fprintf(&sb, "    %c %-14q mode %o uid %d gid %d", h.Typeflag, h.Name, h.Mode, h.Uid, h.Gid)
			if h.Linkname != "" {
				fmt.Fprintf(&sb, " -> %q", h.Linkname)
			}
			if e.body != "" {
				fmt.Fprintf(&sb, " body %q", e.body)
			}
			if len(h.PAXRecords) > 0 {
				fmt.Fprintf(&sb, " %v", h.PAXRecords)
			}
			sb.WriteString("\n")
		}
	}
	return sb.String()
}

// parityDirReplaced reports whether a directory entry of layer names a
// path that is not a directory in the tree at root once it is applied.
func parityDirReplaced(root string, layer []parityEntry) bool {
	for _, e := range layer {
		if e.hdr.Typeflag != tar.TypeDir {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(root, e.hdr.Name)); err != nil || !fi.IsDir() {
			return true
		}
	}
	return false
}

// parityNode is what a container sees of one path.
type parityNode struct {
	desc  string // type, permission bits, owner, content or target, device
	mtime time.Time
	ino   uint64
}

func parityWalk(t *testing.T, root string) map[string]parityNode {
	nodes := map[string]parityNode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("type %o perm %04o owner %d:%d", st.Mode&unix.S_IFMT, st.Mode&0o7777, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" content %q", b)
		case unix.S_IFLNK:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc = fmt.Sprintf("type %o owner %d:%d -> %q", st.Mode&unix.S_IFMT, st.Uid, st.Gid, l)
		case unix.S_IFCHR, unix.S_IFBLK:
			desc += fmt.Sprintf(" dev %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			if v, err := unix.Lgetxattr(p, "user.k", make([]byte, 64)); err == nil {
				desc += fmt.Sprintf(" user.k (%d bytes)", v)
			}
		}
		nodes[rel] = parityNode{desc: desc, mtime: time.Unix(st.Mtim.Unix()), ino: st.Ino}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

// parityCompare describes how the trees at theirs and ours differ, or
// returns "". A modification time is compared where either side has one
// from a layer; one both sides took from the clock (a directory a later
// entry changed, or one made as a parent) is not.
func parityCompare(t *testing.T, theirs, ours string, times bool) string {
	a, b := parityWalk(t, theirs), parityWalk(t, ours)
	var diffs []string
	fromLayer := func(m time.Time) bool { return m.Before(parityEpoch.Add(2000 * time.Hour)) }
	for _, p := range slices.Sorted(mapKeys(a, b)) {
		x, okx := a[p]
		y, oky := b[p]
		switch {
		case !okx:
			diffs = append(diffs, fmt.Sprintf("  %s: missing; ours: %s", p, y.desc))
		case !oky:
			diffs = append(diffs, fmt.Sprintf("  %s: %s; ours: missing", p, x.desc))
		case x.desc != y.desc:
			diffs = append(diffs, fmt.Sprintf("  %s: %s; ours: %s", p, x.desc, y.desc))
		case times && p != "." && (fromLayer(x.mtime) || fromLayer(y.mtime)) && !x.mtime.Equal(y.mtime):
			diffs = append(diffs, fmt.Sprintf("  %s: mtime %s; ours: %s", p, x.mtime.UTC(), y.mtime.UTC()))
		}
	}
	if ga, gb := parityLinkGroups(a), parityLinkGroups(b); !slices.Equal(ga, gb) {
		diffs = append(diffs, fmt.Sprintf("  names sharing an inode: %q; ours: %q", ga, gb))
	}
	return strings.Join(diffs, "\n")
}

func mapKeys(ms ...map[string]parityNode) func(func(string) bool) {
	return func(yield func(string) bool) {
		seen := map[string]bool{}
		for _, m := range ms {
			for k := range m {
				if !seen[k] {
					seen[k] = true
					if !yield(k) {
						return
					}
				}
			}
		}
	}
}

// parityLinkGroups lists the sets of names that share an inode, each as
// its sorted names joined by spaces.
func parityLinkGroups(nodes map[string]parityNode) []string {
	byIno := map[uint64][]string{}
	for p, n := range nodes {
		byIno[n.ino] = append(byIno[n.ino], p)
	}
	var groups []string
	for _, ps := range byIno {
		if len(ps) > 1 {
			slices.Sort(ps)
			groups = append(groups, strings.Join(ps, " "))
		}
	}
	slices.Sort(groups)
	return groups
}
