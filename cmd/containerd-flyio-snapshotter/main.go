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

// exitError makes main exit with code after printing msg (if any).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// newFlagSet returns a flag set for a subcommand whose -h/--help prints usage
// (the synopsis line, the description and the flags) to stdout.
func newFlagSet(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: containerd-flyio-snapshotter %s\n\n%s\n", synopsis, strings.TrimSpace(description))
		var hasFlags bool
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(fs.Output(), "\nFlags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses args and turns -h/--help into a clean exit 0.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{code: 0}
		}
		return &exitError{code: 2, msg: err.Error()}
	}
	return nil
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
	fmt.Fprintln(w, "\nRun 'containerd-flyio-snapshotter <command> --help' for a command's flags.")
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(os.Stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
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
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "containerd-flyio-snapshotter %s: %v\n", c.name, err)
	return 1
}
