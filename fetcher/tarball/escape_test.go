package tarball

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// evil is what a crafted name carries to act on the terminal that prints
// a rejection: return to the line's start, erase it, print a green "ok",
// reverse the text's direction.
const evil = "\r\x1b[2K\x1b[32mok\x1b[0m\u202e\n"

// rawControl returns the first control or format character of msg, if any.
func rawControl(msg string) (rune, bool) {
	for _, r := range msg {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return r, true
		}
	}
	return 0, false
}

// TestRejectionsEscapeArchiveStrings: every string of an archive a
// rejection names (the entry, a symlink or hard link target, a directory
// on the way, a whiteout's target) reaches the message escaped, for
// Validate and Extract alike: no raw ESC, CR, LF or bidi override.
func TestRejectionsEscapeArchiveStrings(t *testing.T) {
	cases := []struct {
		name string
		ents []ent
		rule error
	}{
		{"entry-name", []ent{file("su"+evil, "x").mode(0o4755)}, ErrSetID},
		{"symlink-target", []ent{symlink("l", "../"+evil)}, ErrSymlinkEscape},
		{"hardlink-target-unknown", []ent{hardlink("h", "etc/"+evil)}, ErrHardlinkTarget},
		{"hardlink-target-outside", []ent{hardlink("h", "../"+evil)}, ErrHardlinkEscape},
		{"hardlink-target-long", []ent{hardlink("h", strings.Repeat(evil, 400))}, ErrNameTooLong},
		{"dir-through-symlink", []ent{symlink("d"+evil, "/tmp"), file("d"+evil+"/x", "x")}, ErrThroughSymlink},
		{"parent-not-dir", []ent{file("f"+evil, "x"), file("f"+evil+"/g", "y")}, ErrParentNotDir},
		{"whiteout-dir-symlink", []ent{symlink("w"+evil, "/tmp"), file("w"+evil+"/.wh.x", "")}, ErrThroughSymlink},
		{"xattr-entry", []ent{withXattrs(file("x"+evil, ""), DefaultMaxXattrs+1, 1)}, ErrTooManyXattrs},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := build(t, c.ents...)
			_, verr := Validate(context.Background(), bytes.NewReader(b), Limits{})
			_, xerr := ExtractDir(context.Background(), bytes.NewReader(b), t.TempDir(), ExtractOptions{NoChown: true})
			for what, err := range map[string]error{"Validate": verr, "Extract": xerr} {
				if !errors.Is(err, c.rule) {
					t.Fatalf("%s: %v, want %v", what, err, c.rule)
				}
				if r, ok := rawControl(err.Error()); ok {
					t.Errorf("%s: message carries a raw %U: %q", what, r, err.Error())
				}
			}
			if !strings.Contains(verr.Error(), `\x1b`) {
				t.Errorf("message %q does not show the escape it removed", verr)
			}
		})
	}
}

// TestFormatErrorEscapesEntry: a malformed archive names its last entry
// escaped too.
func TestFormatErrorEscapesEntry(t *testing.T) {
	b := build(t, file("a"+evil, strings.Repeat("x", 4096)))
	_, err := Validate(context.Background(), bytes.NewReader(b[:len(b)-1024-2048]), Limits{}) // cut in the body
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("Validate: %v, want a malformed archive", err)
	}
	if r, ok := rawControl(err.Error()); ok {
		t.Errorf("message carries a raw %U: %q", r, err.Error())
	}
}

// TestEscapedErrorKeepsChain: a file system error naming an archive's
// path is escaped and still matches its cause.
func TestEscapedErrorKeepsChain(t *testing.T) {
	cause := &fs.PathError{Op: "openat", Path: "etc/" + evil, Err: fs.ErrNotExist}
	err := &escapedError{cause}
	if r, ok := rawControl(err.Error()); ok {
		t.Errorf("message carries a raw %U: %q", r, err.Error())
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false", err)
	}
	plain := &fs.PathError{Op: "openat", Path: "etc/passwd", Err: fs.ErrNotExist}
	if got := (&escapedError{plain}).Error(); got != plain.Error() {
		t.Errorf("printable message changed: %q, want %q", got, plain.Error())
	}
	if q := quote(evil); strings.ContainsAny(q, "\r\n\x1b") {
		t.Errorf("quote(%q) = %q", evil, q)
	} else if back, err := strconv.Unquote(q); err != nil || back != evil {
		t.Errorf("quote does not round-trip: %q, %v", back, err)
	}
}
