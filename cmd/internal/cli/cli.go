// Package cli is what the project's command-line binaries share: the
// subcommand registry and dispatch, flag parsing with --help and usage
// errors, the common flags (--config, --db, --format, --control-socket),
// and the subcommands that only talk to the daemon over its control socket
// (pull, activate, rm), which it registers itself. It links the control
// socket's client and package api, none of the daemon, so that a binary
// built on it alone (flyioctl) starts fast; containerd-flyio-snapshotter
// adds the daemon and the commands that open the database or the pool.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/escape"
)

// Program is the name of the running binary in usage and error messages;
// each binary's main sets it before Main.
var Program = "containerd-flyio-snapshotter"

// About is the line under the usage synopsis saying what the binary is.
var About = "A containerd snapshotter on a device-mapper thin pool that can pull images from S3."

// Command is one subcommand. Run receives the arguments after the
// subcommand's name and returns an error to print; an *ExitError carries a
// specific exit status.
type Command struct {
	Name    string
	Summary string
	Run     func(ctx context.Context, args []string) error
}

var commands = map[string]*Command{}

// Register adds a subcommand; it panics on a duplicate name, which is a bug.
func Register(c *Command) {
	if _, dup := commands[c.Name]; dup {
		panic("duplicate subcommand " + c.Name)
	}
	commands[c.Name] = c
}

// Names returns the names of the registered subcommands, sorted.
func Names() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ExitError makes Main return Code after printing Msg (if any) on
// stderr. A usage error names the subcommand whose --help to read (Usage,
// e.g. "db migrate"); Main then adds one line pointing there instead of
// the whole description, so that the problem stays the line a person
// reads.
type ExitError struct {
	Code  int
	Msg   string
	Usage string
}

// Error returns Msg, the text Main prints.
func (e *ExitError) Error() string { return e.Msg }

// NewFlagSet returns a flag set for a subcommand whose usage (the synopsis
// line, the description and the flags, each spelled --name) goes to stdout
// when asked for with -h/--help; a usage error prints only its message and
// where to find this usage (see Main).
func NewFlagSet(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s %s\n\n%s\n", Program, synopsis, strings.TrimSpace(description))
		var hasFlags bool
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(fs.Output(), "\nFlags:")
			printFlags(fs.Output(), fs)
		}
	}
	return fs
}

// printFlags lists fs's flags the way the synopsis spells them (--name
// VALUE, a one-letter flag -x), each with its usage and its default when it has one.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name // -q, as ctr spells it
		}
		if arg != "" {
			line += " " + arg
		}
		line += "\n    \t" + strings.ReplaceAll(text, "\n", "\n    \t")
		switch f.DefValue {
		case "", "0", "false":
		default:
			line += fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

// ParseFlags parses args: -h/--help prints the usage to stdout and becomes
// a clean exit 0; a bad flag becomes a usage error (exit 2) with the
// parser's message.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fs.Usage()
			fs.SetOutput(out)
			return &ExitError{Code: 0}
		}
		return &ExitError{Code: 2, Msg: flagMessage(err), Usage: fs.Name()}
	}
	return nil
}

// flagMessage is the flag package's error message with each flag spelled
// --name, as the usage spells it.
func flagMessage(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag --" + strings.TrimPrefix(name, "-")
	}
	for _, p := range []string{"for flag -", "flag needs an argument: -", "\" for -"} {
		if i := strings.Index(msg, p); i >= 0 {
			return msg[:i+len(p)] + "-" + msg[i+len(p):]
		}
	}
	return msg
}

// UsageError is exit status 2 with msg on stderr and a pointer to the
// --help of fs's subcommand.
func UsageError(fs *flag.FlagSet, msg string) error {
	return &ExitError{Code: 2, Msg: msg, Usage: fs.Name()}
}

// seeHelp is the line after a usage error: where the rules it broke are.
func seeHelp(w io.Writer, subcommand string) {
	cmd := Program
	if subcommand != "" {
		cmd += " " + subcommand
	}
	fmt.Fprintf(w, "See '%s --help'.\n", cmd)
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s <command> [flags] [args]\n", Program)
	fmt.Fprintln(w, "\n"+About)
	fmt.Fprintln(w, "\nCommands:")
	for _, n := range Names() {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].Summary)
	}
	fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags;\n", Program)
	fmt.Fprintf(w, "'%s --version' prints the version.\n", Program)
}

// Main runs the subcommand args name and returns the process's exit
// status: 0, 1 with the error on stderr, or 2 for a usage error.
func Main(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		usage(os.Stdout)
		return 0
	case "--version", "-version":
		args = []string{"version"}
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown command %q\n", Program, args[0])
		seeHelp(os.Stderr, "")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.Run(ctx, args[1:])
	if err == nil {
		return 0
	}
	// An error can carry text neither the CLI nor the daemon wrote (an S3
	// server's error message, relayed by the daemon), which must neither
	// drive the terminal nor overwrite the line; the line breaks of a
	// message of several lines (a configuration's problems) are kept.
	var ee *ExitError
	if errors.As(err, &ee) {
		name := c.Name
		if ee.Usage != "" {
			name = ee.Usage // "pool status", not "pool"
		}
		if ee.Msg != "" {
			fmt.Fprintf(os.Stderr, "%s %s: %s\n", Program, name, escape.Lines(ee.Msg))
		}
		if ee.Usage != "" {
			seeHelp(os.Stderr, ee.Usage)
		}
		return ee.Code
	}
	fmt.Fprintf(os.Stderr, "%s %s: %s\n", Program, c.Name, escape.Lines(err.Error()))
	return 1
}
