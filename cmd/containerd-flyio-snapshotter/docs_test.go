package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"
)

const binName = "containerd-flyio-snapshotter"

// docCommandFiles are the operator documents whose command lines
// TestDocsCommandsExist checks, the alert rules' runbooks among them.
func docCommandFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("../../contrib/systemd/*.service")
	if err != nil {
		t.Fatal(err)
	}
	return append(append(files, more...), "../../README.md", "../../config.toml.example",
		"../../contrib/prometheus/alerts.yml", "../../contrib/containerd/config.toml.snippet")
}

var (
	// docBinCall is the daemon's binary named with what follows it, up to
	// the end of a code span, a comment, a quoted string (a rule's
	// annotation) or the line.
	docBinCall = regexp.MustCompile(`(?:^|[\s/` + "`" + `(])` + binName + ` ([^` + "`" + `#|;&"]*)`)
	// docSpan is an inline code span.
	docSpan = regexp.MustCompile("`([^`]+)`")
)

// docCommand is a command line of the documents.
type docCommand struct {
	words []string
	// span: a code span that starts with a subcommand's name, without the
	// binary's; it may be a log message that starts with the same word.
	span bool
}

// docCommands returns, for each command line of the documents (the binary
// named in a code block or span, or a code span starting with one of its
// subcommands), its words and where it is.
func docCommands(t *testing.T) map[string]docCommand {
	t.Helper()
	names := cli.Names()
	out := map[string]docCommand{}
	for _, file := range docCommandFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		// A shell line ending in a backslash goes on on the next.
		text := strings.ReplaceAll(string(b), "\\\n", " ")
		for i, line := range strings.Split(text, "\n") {
			where := file + ":" + strconv.Itoa(i+1)
			for _, m := range docBinCall.FindAllStringSubmatch(line, -1) {
				// A command at the end of a sentence of prose ends
				// with its full stop.
				words := strings.Fields(strings.TrimRight(strings.TrimSpace(m[1]), ".,:"))
				out[where+": "+strings.TrimSpace(m[0])] = docCommand{words: words}
			}
			for _, m := range docSpan.FindAllStringSubmatch(line, -1) {
				words := strings.Fields(m[1])
				if len(words) > 1 && slices.Contains(names, words[0]) {
					out[where+": `"+m[1]+"`"] = docCommand{words: words, span: true}
				}
			}
		}
	}
	return out
}

// TestDocsCommandsExist: every command the docs show (`containerd-flyio-snapshotter
// pool status`, `pull --namespace k8s.io`, ...) is a subcommand, and every
// flag written after it is one its --help lists.
func TestDocsCommandsExist(t *testing.T) {
	names := cli.Names()
	helps := map[string]string{} // "pool status" -> its --help, "" when not a command
	help := func(path []string) string {
		key := strings.Join(path, " ")
		if h, ok := helps[key]; ok {
			return h
		}
		code, out, _ := runCommand(t, nil, append(slices.Clone(path), "--help")...)
		if code != 0 || !strings.HasPrefix(out, "Usage: "+binName+" "+key+" ") {
			out = ""
		}
		helps[key] = out
		return out
	}
	checked := 0
	for where, c := range docCommands(t) {
		words := c.words
		if len(words) == 0 || !slices.Contains(names, words[0]) {
			continue // a service or a job named like the binary, or COMMAND
		}
		path, rest := words[:1], words[1:]
		for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") && help(append(slices.Clone(path), rest[0])) != "" {
			path, rest = append(path, rest[0]), rest[1:]
		}
		h := help(path)
		if h == "" {
			t.Errorf("%s: %q is not a command", where, strings.Join(path, " "))
			continue
		}
		if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") && strings.Contains(h, "\nSubcommands:\n") {
			// A word after a command that has subcommands must be one
			// of them; "a|b|c" (escaped "a\|b" in a table) names several.
			alts := strings.Split(strings.ReplaceAll(rest[0], `\|`, "|"), "|")
			if len(alts) > 1 {
				for _, a := range alts {
					if help(append(slices.Clone(path), a)) == "" {
						t.Errorf("%s: %q is not a subcommand of %s", where, a, strings.Join(path, " "))
					}
				}
				checked++
			} else if !c.span {
				t.Errorf("%s: %q is not a subcommand of %s", where, rest[0], strings.Join(path, " "))
			}
			continue
		}
		checked++
		for _, w := range rest {
			if !strings.HasPrefix(w, "-") || w == "-" || w == "--help" || w == "--version" {
				continue
			}
			flag, _, _ := strings.Cut(w, "=")
			if !strings.Contains(h, "\n  "+flag+" ") && !strings.Contains(h, "\n  "+flag+"\n") {
				t.Errorf("%s: %s has no flag %s", where, strings.Join(path, " "), flag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no command found in the docs: the patterns are wrong")
	}
}
