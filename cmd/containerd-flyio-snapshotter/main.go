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

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

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

// exitError makes main exit with code after printing msg (if any) and,
// for a usage error, the subcommand's usage, both on stderr.
type exitError struct {
	code  int
	msg   string
	usage *flag.FlagSet
}

func (e *exitError) Error() string { return e.msg }

// newFlagSet returns a flag set for a subcommand whose usage (the synopsis
// line, the description and the flags, each spelled --name) goes to stdout
// when asked for with -h/--help and to stderr after a usage error, so that
// stdout stays the command's output.
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
// VALUE), each with its usage and its default when it has one.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		line := "  --" + f.Name
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
// a clean exit 0; a bad flag becomes exit 2 with the parser's message and
// the usage on stderr.
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
		return &exitError{code: 2, msg: flagMessage(err), usage: fs}
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

// usageError is exit status 2 with msg and fs's usage on stderr.
func usageError(fs *flag.FlagSet, msg string) error {
	return &exitError{code: 2, msg: msg, usage: fs}
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
		fmt.Fprintf(os.Stderr, "containerd-flyio-snapshotter: unknown command %q\n\n", args[0])
		usage(os.Stderr)
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
		if ee.msg != "" {
			fmt.Fprintf(os.Stderr, "containerd-flyio-snapshotter %s: %s\n", c.name, ee.msg)
		}
		if ee.usage != nil {
			fmt.Fprintln(os.Stderr)
			ee.usage.SetOutput(os.Stderr)
			ee.usage.Usage()
		}
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "containerd-flyio-snapshotter %s: %v\n", c.name, err)
	return 1
}
