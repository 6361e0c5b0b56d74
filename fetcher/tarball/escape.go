package tarball

import (
	"strconv"
	"unicode/utf8"
)

// quote is how every string taken from an archive (entry names, symlink
// and hard link targets, directory names, xattr names) appears in a
// message: Go-quoted, so that control characters (ESC, CR, ...), invisible
// format characters and invalid UTF-8 show as escapes. A message is
// printed by validate, recorded as a pull's failure reason and logged;
// raw, an archive's bytes could rewrite the terminal that shows it or
// forge a line of output.
func quote(s string) string { return strconv.Quote(s) }

// Escape is s with the characters quote would escape (control and format
// characters, invalid UTF-8) escaped as quote does, and unchanged when it
// has none. The package applies it to messages made elsewhere (the file
// system's errors, archive/tar's) that may carry an archive's names;
// callers printing other untrusted text beside a rejection (a file's
// name) use it too.
func Escape(s string) string {
	if printable(s) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// printable reports whether s is valid UTF-8 of printable characters only
// (strconv.IsPrint: what strconv.Quote leaves as it is, but for '"' and
// '\\').
func printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}

// escapedError is an error from outside the package whose message may
// carry an archive's names: Error escapes it (Escape), Unwrap keeps
// the chain for errors.Is and errors.As.
type escapedError struct{ err error }

func (e *escapedError) Error() string { return Escape(e.err.Error()) }
func (e *escapedError) Unwrap() error { return e.err }
