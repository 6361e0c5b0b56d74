package tarball

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"strings"
)

// cursor is the extractor's way down the tree: a stack of open directories
// from the root to the directory entries are being created in, each opened
// from its parent by one component after an Lstat proved it a real
// directory. So no symlink is ever followed (os.Root would confine it, but
// we refuse it outright), and moving between neighbouring directories, as
// tar archives do, costs a system call per component changed rather than
// a walk from the root for every entry.
//
// Only the root and the deepest maxOpenLevels levels hold a descriptor, so
// a path thousands of directories deep costs a bounded number of open
// files; a level whose descriptor was closed is opened again from the
// nearest open one above it when the cursor climbs back to it.
type cursor struct {
	stack []level // stack[0] is the root itself
	// follow resolves a symlink met on the way (a lower layer's) inside
	// the root instead of refusing it: Limits.LowerSymlinks.
	follow bool
	// made reports whether the symlink at a root-relative path (where it
	// really is, lower symlinks resolved) is one this archive made. The
	// checker refuses a way through one by the name the archive gives;
	// the archive may make it, or reach it, through a lower layer's
	// symlink under another name, so the cursor asks by where it is
	// before following it, and refuses it if the archive made it.
	made func(name string) bool
	// step is the checker's key of a child from its parent's (checker.step):
	// every level carries the key of its real path.
	step func(parent uint64, comp string) uint64
	// leave, unless nil, is called with a level about to lose its
	// descriptor while it may still exist: popped, or closed out of the
	// window of open levels. Nothing is written in a directory but while
	// it is the cursor's top, so its content is settled until the cursor
	// comes back to it (the extractor sets its times then).
	leave func(l *level) error
}

// maxSymlinkHops bounds the symlinks one cd follows, as the kernel's
// ELOOP bound does a path lookup.
const maxSymlinkHops = 40

// maxOpenLevels bounds the directories the cursor keeps open below the
// root: enough for the depth real images reach, far below the usual limit
// of 1,024 descriptors a process may be given.
const maxOpenLevels = 64

type level struct {
	name string   // root-relative path ("." for the root)
	key  uint64   // the checker's key of name
	comp string   // last component ("" for the root)
	r    *os.Root // the directory, confined; nil while closed (never the root)
	f    *os.File // the directory as a file, for *at calls; opened on demand
}

func newCursor(root *os.Root, follow bool, made func(name string) bool, step func(uint64, string) uint64) *cursor {
	return &cursor{stack: []level{{name: ".", key: rootKey, r: root}}, follow: follow, made: made, step: step}
}

func (c *cursor) top() *level { return &c.stack[len(c.stack)-1] }

// fd returns a descriptor of the current directory (for *at system calls on
// a single component).
func (l *level) fd() (int, error) {
	if l.f == nil {
		f, err := l.r.Open(".")
		if err != nil {
			return -1, err
		}
		l.f = f
	}
	return int(l.f.Fd()), nil
}

func (l *level) close(isRoot bool) {
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	if !isRoot && l.r != nil {
		l.r.Close()
		l.r = nil
	}
}

// pop closes levels until depth levels remain, telling leave of each
// (but the root) when leaving; it returns leave's first error.
func (c *cursor) pop(depth int, leaving bool) error {
	var first error
	for len(c.stack) > depth {
		if err := c.left(len(c.stack)-1, leaving); err != nil && first == nil {
			first = err
		}
		c.stack[len(c.stack)-1].close(len(c.stack) == 1)
		c.stack = c.stack[:len(c.stack)-1]
	}
	return first
}

// left tells leave of level i, an open level other than the root, when
// leaving.
func (c *cursor) left(i int, leaving bool) error {
	if !leaving || c.leave == nil || i == 0 || c.stack[i].r == nil {
		return nil
	}
	return c.leave(&c.stack[i])
}

func (c *cursor) close() { c.pop(0, false) }

// cd moves to dir (a clean root-relative path), checking every component it
// enters is a real directory: a symlink is a rejection (ErrThroughSymlink),
// a non-directory too (ErrParentNotDir). With create, missing directories
// are made (mode 0755); without, a missing one returns (nil, nil). raw is
// the entry named in a rejection. With follow, a symlink is followed
// instead, inside the root (inRoot), and the levels are those of the
// directories it leads to, unless the archive made it (made): that is
// refused (ErrThroughSymlink) wherever it is met.
func (c *cursor) cd(raw, dir string, create bool) (*level, error) {
	return c.walk(raw, dir, create, 0)
}

func (c *cursor) walk(raw, dir string, create bool, hops int) (*level, error) {
	var comps []string
	if dir != "." {
		comps = strings.Split(dir, "/")
	}
	k := 0
	for k < len(comps) && k+1 < len(c.stack) && c.stack[k+1].comp == comps[k] {
		k++
	}
	if err := c.pop(k+1, true); err != nil {
		return nil, err
	}
	if err := c.reopen(raw); err != nil {
		return nil, err
	}
	for i, comp := range comps[k:] {
		t := c.top()
		name := comp
		if t.name != "." {
			name = t.name + "/" + comp
		}
		fi, err := t.r.Lstat(comp)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if !create {
				return nil, nil
			}
			// The mode is set after Mkdir, as containerd's applier sets
			// it: a directory the archive implies is 0755 whatever the
			// daemon's umask, and not setgid below a setgid directory.
			if err := t.r.Mkdir(comp, 0o755); err != nil {
				return nil, err
			}
			if err := t.r.Chmod(comp, 0o755); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, err
		case fi.Mode()&fs.ModeSymlink != 0 && c.follow:
			if c.made != nil && c.made(name) {
				return nil, reject(raw, ErrThroughSymlink, "%s is a symlink this archive made", quote(name))
			}
			if hops == maxSymlinkHops {
				return nil, reject(raw, ErrThroughSymlink, "%s: more than %d symlinks on the way", quote(name), maxSymlinkHops)
			}
			target, err := t.r.Readlink(comp)
			if err != nil {
				return nil, err
			}
			rest := path.Join(append([]string{inRoot(t.name, target)}, comps[k+i+1:]...)...)
			return c.walk(raw, rest, create, hops+1)
		case fi.Mode()&fs.ModeSymlink != 0:
			return nil, reject(raw, ErrThroughSymlink, "%s is a symlink", quote(name))
		case !fi.IsDir():
			return nil, reject(raw, ErrParentNotDir, "%s", quote(name))
		}
		sub, err := t.r.OpenRoot(comp)
		if err != nil {
			return nil, err
		}
		key := rootKey
		if c.step != nil {
			key = c.step(t.key, comp)
		}
		if err := c.push(level{name: name, key: key, comp: comp, r: sub}); err != nil {
			return nil, err
		}
	}
	return c.top(), nil
}

// inRoot is where a symlink in directory dir (root-relative) pointing at
// target leads, as a clean root-relative path: an absolute target is taken
// from the root, and ".." stops at the root, as a path lookup does inside
// a container's root (and containerd's applier resolves it). So no target
// leads outside the root.
func inRoot(dir, target string) string {
	if !path.IsAbs(target) {
		target = path.Join("/", dir, target)
	}
	if p := strings.TrimPrefix(path.Clean(target), "/"); p != "" {
		return p
	}
	return "."
}

// push adds an open level below the top, closing the descriptor of the
// level that falls out of the window (after telling leave of it).
func (c *cursor) push(l level) error {
	if t := c.top(); t.f != nil { // only the deepest level needs its file
		t.f.Close()
		t.f = nil
	}
	c.stack = append(c.stack, l)
	if i := len(c.stack) - 2 - maxOpenLevels; i > 0 {
		err := c.left(i, true)
		c.stack[i].close(false)
		return err
	}
	return nil
}

// reopen gives the top level a descriptor again if it was closed, opening
// each closed level from its parent by one component, checked to be a real
// directory as when it was first entered.
func (c *cursor) reopen(raw string) error {
	if c.top().r != nil {
		return nil
	}
	j := len(c.stack) - 1
	for c.stack[j].r == nil {
		j--
	}
	for i := j + 1; i < len(c.stack); i++ {
		p, l := &c.stack[i-1], &c.stack[i]
		fi, err := p.r.Lstat(l.comp)
		switch {
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return reject(raw, ErrThroughSymlink, "%s is a symlink", quote(l.name))
		case !fi.IsDir():
			return reject(raw, ErrParentNotDir, "%s", quote(l.name))
		}
		if l.r, err = p.r.OpenRoot(l.comp); err != nil {
			return err
		}
		if i-1 > 0 && len(c.stack)-1-(i-1) > maxOpenLevels {
			err := c.left(i-1, true)
			p.close(false)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// removed drops the levels at or below the removed directory name.
func (c *cursor) removed(name string) {
	for i := 1; i < len(c.stack); i++ {
		if n := c.stack[i].name; n == name || strings.HasPrefix(n, name+"/") {
			c.pop(i, false) // removed: nothing to settle
			return
		}
	}
}
