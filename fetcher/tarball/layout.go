package tarball

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
)

// layoutRules holds every layout rule; newLayoutRule adds one.
var layoutRules []error

func newLayoutRule(msg string) error {
	r := errors.New(msg)
	layoutRules = append(layoutRules, r)
	return r
}

// LayoutRules returns every rule a *LayoutError can carry (the ErrLayout*
// values, once each).
func LayoutRules() []error { return slices.Clone(layoutRules) }

// Layout rules checked by VerifyLayout (applied to an image whole, through
// its activation, after rootfs/ was stripped from its layers).
var (
	// ErrLayoutMissing: a required top-level directory is absent.
	ErrLayoutMissing = newLayoutRule("required directory missing")
	// ErrLayoutNotDir: a required top-level name is not a real directory
	// (a symlink or a file).
	ErrLayoutNotDir = newLayoutRule("not a directory")
	// ErrLayoutWorldWritable: a critical directory is writable by everyone.
	ErrLayoutWorldWritable = newLayoutRule("world-writable")
)

// RequiredDirs must be real directories at the top of an image's tree,
// unless the caller names its own list (VerifyLayoutOf).
var RequiredDirs = []string{"etc", "usr", "var"}

// protectedDirs must not be world-writable.
var protectedDirs = []string{"etc", "usr"}

// LayoutError names the path and the layout rule it breaks.
type LayoutError struct {
	Path string // relative to the tree's root
	Rule error  // ErrLayoutMissing, ErrLayoutNotDir or ErrLayoutWorldWritable
}

// Error names the path and the layout rule it broke.
func (e *LayoutError) Error() string {
	return fmt.Sprintf("layout: %s: %v", Escape(e.Path), e.Rule)
}

// Unwrap returns the rule broken.
func (e *LayoutError) Unwrap() error { return e.Rule }

// VerifyLayout checks the final tree of an image (the top of its unpacked
// chain; a lower layer alone may lack these): etc/, usr/ and var/ are real
// directories, and etc/ and usr/ are not world-writable. It returns the
// first *LayoutError found, or an I/O error.
func VerifyLayout(root *os.Root) error {
	return VerifyLayoutOf(root, RequiredDirs)
}

// VerifyLayoutOf is VerifyLayout with required as the top-level names that
// must be real directories (an empty list requires none, as for an image
// built FROM scratch). etc/ and usr/, whenever they are real directories,
// must not be world-writable.
func VerifyLayoutOf(root *os.Root, required []string) error {
	for _, d := range required {
		fi, err := root.Lstat(d)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return &LayoutError{Path: d, Rule: ErrLayoutMissing}
		case err != nil:
			return fmt.Errorf("verify layout of %s: %w", root.Name(), err)
		case !fi.IsDir():
			return &LayoutError{Path: d, Rule: ErrLayoutNotDir}
		}
	}
	for _, d := range protectedDirs {
		fi, err := root.Lstat(d)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Errorf("verify layout of %s: %w", root.Name(), err)
		case fi.IsDir() && fi.Mode().Perm()&0o002 != 0:
			return &LayoutError{Path: d, Rule: ErrLayoutWorldWritable}
		}
	}
	return nil
}

// VerifyLayoutDir is VerifyLayout of the directory dir.
func VerifyLayoutDir(dir string) error {
	return VerifyLayoutDirOf(dir, RequiredDirs)
}

// VerifyLayoutDirOf is VerifyLayoutOf of the directory dir.
func VerifyLayoutDirOf(dir string, required []string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("verify layout: %w", err)
	}
	defer root.Close()
	return VerifyLayoutOf(root, required)
}
