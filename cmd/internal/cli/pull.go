package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
)

const pullDescription = `
Asks the running daemon (over daemon.control_socket) to pull an S3 image:
one layer key, or a prefix whose layer objects, in key order, are its layers.
A layer is a tar stored plain (.tar), gzip (.tar.gz) or zstd (.tar.zst):
the suffix says which keys are layers, the first bytes how each is stored.
IMAGE is s3://BUCKET/KEY-or-PREFIX, or a bare PATH that the daemon looks up
under its s3.prefix in its s3.bucket. The daemon refuses a bucket other than
its s3.bucket and s3.allowed_buckets when either is set.
Each layer is downloaded (SHA-256, validated against the extraction policy)
and unpacked into a committed snapshot named by its OCI chain ID; the image
then gets its active snapshot "snap-<image id>" and is registered in
containerd under --name, in the namespace of each --namespace (default: the
config's containerd.namespace; "--namespace k8s.io" for the CRI, which
Kubernetes uses). Everything is idempotent and survives a daemon
crash: pulling again resumes what was cut. Interrupting pull (Ctrl-C)
ends the command, not the daemon's work, which records the image when it
ends; a pull that reads none of the daemon's answer for a minute
(suspended with Ctrl-Z) is dropped by the daemon the same way.

--name must be an image reference ([DOMAIN/]PATH[:TAG], lowercase path, no
digest). Without it the name is s3.local/BUCKET/PREFIX:latest for a prefix
already spelled as a reference path, and otherwise (a layer key, or a path
with capitals, spaces or doubled separators) the path lowercased, with what
a reference may not hold replaced by '-', tagged with the image id (a hash
of the exact source), so two sources never share a default name. A name
that another pulled image has, or that containerd has for an image this
daemon did not create (a registry image, an import), is refused before any
work, naming who has it; --replace moves it to this image and repoints
containerd's image, keeping its labels (a CRI pin stays).

Like a registry pull, every pull first asks S3 what the image is now (one
LIST for a prefix, one HEAD for a key). An image pulled before from the same
objects (same keys, ETags and sizes) is answered from the records, with no
download, device-mapper call or extraction; an object overwritten since is
downloaded again and unpacked into new chains. A layer is downloaded again
only when no object with the same bucket, key, ETag and size was downloaded
and kept; identical content under another key is stored and unpacked once,
recognised by its SHA-256. --cached answers from the records alone and asks
S3 nothing; --refresh runs the pipelines even for an unchanged image, so
that every layer's device is checked in the pool (and rebuilt if lost).

Progress goes to stderr: on a terminal one line per layer (its step, bytes
of its tarball, percentage, rate and time left), redrawn in place;
otherwise a line per layer when its step changes and every 5s while it
advances. The result is one line on stdout (--format table, the default;
"text" is its former, deprecated name). With --format json, stdout
instead carries the daemon's stream as it comes, one JSON object a line:
{"event":{...}} per progress event (fsm, state, layer, bytes, total,
files), then {"result":{...}} or {"error":"..."}. Exit status 0 on success,
1 with the reason on failure, 2 on a usage error.
`

func init() {
	Register(&Command{Name: "pull", Summary: "pull an S3 image into the thin pool (via the daemon)", Run: runPull})
}

// controlClient returns the client of the daemon's control socket.
func controlClient(socket string) (*control.Client, error) {
	if socket == "" {
		var err error
		if socket, err = control.SocketFromConfig(Config.File()); err != nil {
			return nil, err
		}
	}
	if socket == "" {
		return nil, &ExitError{Code: 2, Msg: "no control socket: set daemon.control_socket or pass --control-socket"}
	}
	return control.NewClient(socket), nil
}

// ParseInterspersed parses args with fs allowing flags after positional
// arguments (pull s3://b/k --name REF), and returns the positional ones.
func ParseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := ParseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// terminalCols returns the width in columns of the terminal f is, or 0
// when it cannot be read.
func terminalCols(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}

// terminalRows returns the height in rows of the terminal f is, or 0 when
// it cannot be read.
func terminalRows(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Row)
}

func runPull(ctx context.Context, args []string) error {
	fs := NewFlagSet("pull", "pull s3://BUCKET/KEY-or-PREFIX|PATH [--name REF [--replace]] [--namespace NS]... [--refresh|--cached] [--format table|json] [--config FILE] [--control-socket PATH]", pullDescription)
	AddConfigFlags(fs)
	var socket, name string
	var refresh, cached bool
	format := AddFormatFlag(fs, "output `FORMAT`: table (progress on stderr, the result on stdout) or json (the daemon's events and result as JSON lines on stdout); text, the former name of table, is deprecated and will be removed in the next release")
	format.textAlias = true
	addControlSocketFlag(fs, &socket)
	fs.Func("name", "image `REF` to register the result under, an image reference (default: s3.local/BUCKET/KEY-or-PREFIX, tagged latest or, when the path is not already a reference path, with the image id)", func(v string) error {
		// An empty value is a script's unset variable far more often
		// than a wish for the default name, which leaving --name out
		// asks for.
		if v == "" {
			return errors.New("empty name (leave --name out for the default name)")
		}
		name = v
		return nil
	})
	var replace bool
	fs.BoolVar(&replace, "replace", false, "take the name over when another pulled image has it, or containerd has it for an image this daemon did not create (its labels kept)")
	fs.BoolVar(&refresh, "refresh", false, "run the pipelines even if the image is pulled and unchanged in S3 (they check every layer's device and rebuild what is missing)")
	var nss namespaceList
	fs.Var(&nss, "namespace", "containerd `NAMESPACE` to register the image in; repeat it for several (default: the daemon's containerd.namespace)")
	fs.BoolVar(&cached, "cached", false, "answer from the records alone, without asking S3 what the image is now (fails if it is not pulled)")
	pos, err := ParseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return UsageError(fs, "pull takes exactly one s3://BUCKET/KEY-or-PREFIX or PATH argument")
	}
	if refresh && cached {
		return UsageError(fs, "--refresh and --cached contradict each other: choose one")
	}
	if _, err := api.CheckNamespaces(nss); err != nil {
		return UsageError(fs, "--namespace: "+err.Error())
	}
	bucket, key, err := parseImageArg(pos[0])
	if err != nil {
		return UsageError(fs, err.Error())
	}
	c, err := controlClient(socket)
	if err != nil {
		return err
	}
	req := api.PullRequest{Bucket: bucket, Key: key, Ref: name, Replace: replace, Refresh: refresh, Cached: cached, Namespaces: nss}
	if format.JSON() {
		return refusedAsUsage(fs, name, pullJSON(ctx, c, req, os.Stdout))
	}
	start := time.Now()
	pr := newProgress(os.Stderr, isTerminal(os.Stderr))
	pr.cols = func() int { return terminalCols(os.Stderr) }
	pr.rows = func() int { return terminalRows(os.Stderr) }
	res, err := c.Pull(ctx, req, pr.event)
	err = interrupted(ctx, err)
	pr.finish()
	if err != nil {
		return refusedAsUsage(fs, name, err)
	}
	if err := printPullResult(os.Stdout, os.Stderr, res, time.Since(start)); err != nil {
		return fmt.Errorf("pull of %s done, but writing its result failed: %w", res.Ref, err)
	}
	return nil
}

// interruptedError is a pull the command stopped waiting for when it was
// interrupted (Ctrl-C, SIGTERM): its message says what became of the
// pull, which the daemon goes on with; it unwraps to the error the
// interruption caused.
type interruptedError struct{ err error }

func (e *interruptedError) Error() string {
	return "interrupted: the pull goes on in the daemon, which records the image when it ends; run the same pull again to wait for it (containerd-flyio-snapshotter ls runs lists its runs meanwhile)"
}

func (e *interruptedError) Unwrap() error { return e.err }

// interrupted is err as the operator should read it: an interruptedError
// when ctx, the command's, ended (the command was interrupted), err as it
// is otherwise.
func interrupted(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	return &interruptedError{err: err}
}

// refusedAsUsage makes the daemon's refusal of a malformed request (the
// image name, which the daemon checks with the rules containerd's clients
// use) the usage error it is; other errors pass as they are.
func refusedAsUsage(fs *flag.FlagSet, name string, err error) error {
	var re *control.RequestError
	if !errors.As(err, &re) {
		return err
	}
	if name != "" {
		return UsageError(fs, "--name: "+re.Msg)
	}
	return UsageError(fs, re.Msg)
}

// namespaceList is a repeatable string flag.
type namespaceList []string

func (l *namespaceList) String() string { return strings.Join(*l, ",") }

// Set adds one namespace; an empty one is a usage error.
func (l *namespaceList) Set(v string) error {
	if v == "" {
		return errors.New("empty namespace")
	}
	*l = append(*l, v)
	return nil
}

// pullJSON pulls with the daemon's stream written to w as it arrives: one
// control.Line a line, the events, then the result or the error (which
// also makes the exit status 1, with nothing more on stderr). A write to
// w that fails (stdout on a full disk) does not stop the pull, but fails
// the command, saying so on stderr: the script reading w did not get the
// answer. A closed pipe on stdout ends the process by SIGPIPE, as it ends
// any command; the pull's runs go on in the daemon either way.
func pullJSON(ctx context.Context, c *control.Client, req api.PullRequest, w io.Writer) error {
	var (
		mu       sync.Mutex
		writeErr error
	)
	enc := json.NewEncoder(w)
	write := func(l control.Line) {
		mu.Lock()
		defer mu.Unlock()
		if err := enc.Encode(l); err != nil && writeErr == nil {
			writeErr = err
		}
	}
	res, err := c.Pull(ctx, req, func(e api.Event) { write(control.Line{Event: &e}) })
	err = interrupted(ctx, err)
	var refused *control.RequestError
	if errors.As(err, &refused) {
		return err // a usage error, on stderr, as before any request
	}
	if err != nil {
		write(control.Line{Error: err.Error()})
		if writeErr != nil {
			return fmt.Errorf("pull: %w (and writing the answer: %v)", err, writeErr)
		}
		return &ExitError{Code: 1}
	}
	write(control.Line{Result: res})
	if writeErr != nil {
		return fmt.Errorf("pull of %s done, but writing its answer failed: %w", res.Ref, writeErr)
	}
	return nil
}

// parseImageArg splits pull's argument: an s3:// URL names its bucket and
// key; a bare path leaves the bucket (and the prefix) to the daemon's
// config.
func parseImageArg(arg string) (bucket, key string, err error) {
	if strings.Contains(arg, "://") {
		return api.ParseS3URL(arg)
	}
	if arg == "" || strings.HasPrefix(arg, "/") {
		return "", "", fmt.Errorf("image %q: a bare path must be a key or prefix under the daemon's s3.prefix, without a leading '/'", arg)
	}
	return "", arg, nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// printPullResult prints r on w, its one result line, and on notes what
// the operator should know of it. The error is the result line's write's.
func printPullResult(w, notes io.Writer, r *api.PullResult, took time.Duration) error {
	_, err := fmt.Fprintf(w, "pulled %s: %d layer(s), top chain %s, snapshot %s (%s), downloaded %d, unpacked %d, %s\n",
		r.Ref, len(r.Layers), r.TopChainID, r.Snapshot.SnapshotName, r.Snapshot.DevicePath, r.Downloaded, r.Unpacked,
		took.Round(time.Millisecond))
	if r.Snapshot.RegisterPending {
		fmt.Fprintf(notes, "%s is not in containerd yet (its socket was absent): the daemon registers it once containerd answers\n", r.Ref)
	}
	return err
}
