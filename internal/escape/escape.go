// Package escape makes text that no part of the project wrote (an
// archive's names, an S3 server's error message) safe to print: its
// control and format characters (ESC, CR, a bidi override) and invalid
// UTF-8 appear as the escapes of a Go string, so that the text can
// neither drive the terminal that shows it nor forge a line of output.
// Text with none of them is left as it is. It imports nothing of the
// project, so any package may use it.
package escape

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// String is s with the characters strconv.Quote would escape (control and
// format characters, invalid UTF-8) escaped as it does, line breaks
// included, and unchanged when it has none.
func String(s string) string {
	if printable(s) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// Lines is msg with each of its lines escaped as String escapes them,
// keeping the line breaks: for a message of several lines (a
// configuration's problems, one a line) that its own writer broke.
func Lines(msg string) string {
	lines := strings.Split(msg, "\n")
	for i, l := range lines {
		lines[i] = String(l)
	}
	return strings.Join(lines, "\n")
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
