package tarball

import (
	"strconv"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/escape"
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
// has none (escape.String). The package applies it to messages made
// elsewhere (the file system's errors, archive/tar's) that may carry an
// archive's names; callers printing other untrusted text beside a
// rejection (a file's name) use it too.
func Escape(s string) string { return escape.String(s) }

// escapedError is an error from outside the package whose message may
// carry an archive's names: Error escapes it (Escape), Unwrap keeps
// the chain for errors.Is and errors.As.
type escapedError struct{ err error }

func (e *escapedError) Error() string { return Escape(e.err.Error()) }
func (e *escapedError) Unwrap() error { return e.err }
