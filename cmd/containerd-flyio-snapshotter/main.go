// Command containerd-flyio-snapshotter is the daemon (serve) and the operator
// tool (pull, activate, rm, ls, db, pool, validate, version) of the flyio
// snapshotter. Each subcommand lives in its own file and registers itself with
// register; main only dispatches.
package main

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
)

// version and commit are set at build time with -ldflags "-X
// main.version=... -X main.commit=..." (the Makefile's build and release
// targets); a plain `go build` leaves these values.
var (
	version = "dev"
	commit  = "unknown"
)

// command is one subcommand. run receives the arguments after the
// subcommand's name and returns an error to print; exitError carries a
// specific exit status.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]*command{}

// register adds a subcommand; it panics on a duplicate name, which is a bug.
func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("duplicate subcommand " + c.name)
	}
	commands[c.name] = c
}

// exitError makes main exit with code after printing msg (if any) on
// stderr. A usage error names the subcommand whose --help to read (usage,
// e.g. "db migrate"); main then adds one line pointing there instead of
// the whole description, so that the problem stays the line a person
// reads.
type exitError struct {
	code  int
	msg   string
	usage string
}

func (e *exitError) Error() string { return e.msg }

// newFlagSet returns a flag set for a subcommand whose usage (the synopsis
// line, the description and the flags, each spelled --name) goes to stdout
// when asked for with -h/--help; a usage error prints only its message and
// where to find this usage (see run).
func newFlagSet(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: containerd-flyio-snapshotter %s\n\n%s\n", synopsis, strings.TrimSpace(description))
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

// parseFlags parses args: -h/--help prints the usage to stdout and becomes
// a clean exit 0; a bad flag becomes a usage error (exit 2) with the
// parser's message.
func parseFlags(fs *flag.FlagSet, args []string) error {
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
			return &exitError{code: 0}
		}
		return &exitError{code: 2, msg: flagMessage(err), usage: fs.Name()}
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

// usageError is exit status 2 with msg on stderr and a pointer to the
// --help of fs's subcommand.
func usageError(fs *flag.FlagSet, msg string) error {
	return &exitError{code: 2, msg: msg, usage: fs.Name()}
}

// seeHelp is the line after a usage error: where the rules it broke are.
func seeHelp(w io.Writer, subcommand string) {
	cmd := "containerd-flyio-snapshotter"
	if subcommand != "" {
		cmd += " " + subcommand
	}
	fmt.Fprintf(w, "See '%s --help'.\n", cmd)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: containerd-flyio-snapshotter <command> [flags] [args]")
	fmt.Fprintln(w, "\nA containerd snapshotter on a device-mapper thin pool that can pull images from S3.")
	fmt.Fprintln(w, "\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'containerd-flyio-snapshotter <command> --help' for a command's flags;")
	fmt.Fprintln(w, "'containerd-flyio-snapshotter --version' prints the version.")
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
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
		fmt.Fprintf(os.Stderr, "containerd-flyio-snapshotter: unknown command %q\n", args[0])
		seeHelp(os.Stderr, "")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, args[1:])
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		name := c.name
		if ee.usage != "" {
			name = ee.usage // "pool status", not "pool"
		}
		if ee.msg != "" {
			fmt.Fprintf(os.Stderr, "containerd-flyio-snapshotter %s: %s\n", name, ee.msg)
		}
		if ee.usage != "" {
			seeHelp(os.Stderr, ee.usage)
		}
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "containerd-flyio-snapshotter %s: %v\n", c.name, err)
	return 1
}
