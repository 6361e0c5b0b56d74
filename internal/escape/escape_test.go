package escape

import "testing"

// evil is what a hostile string carries to act on the terminal that
// prints it: return to the line's start, erase it, print a green "ok",
// reverse the text's direction, start a new line.
const evil = "\r\x1b[2K\x1b[32mok\x1b[0m\u202e\n"

// TestString: control and format characters and invalid UTF-8 are
// escaped, a line break too; printable text, '"' and '\\' included, is
// left as it is.
func TestString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain/name.tar", "plain/name.tar"},
		{`say "hi" \ there`, `say "hi" \ there`},
		{"héllo wörld", "héllo wörld"},
		{"a" + evil + "b", `a\r\x1b[2K\x1b[32mok\x1b[0m\u202e\nb`},
		{"bad\xffutf8", `bad\xffutf8`},
		{`"` + "\t", `\"\t`},
	} {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestLines: each line is escaped as String escapes it and the line
// breaks stay; a message with nothing to escape is unchanged.
func TestLines(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"one\ntwo", "one\ntwo"},
		{"a: bad\nb: \x1b[2Kworse\r", "a: bad\nb: \\x1b[2Kworse\\r"},
		{"x\xff\ny\n", "x\\xff\ny\n"},
	} {
		if got := Lines(c.in); got != c.want {
			t.Errorf("Lines(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
