package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control/server"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

func TestPullHelp(t *testing.T) {
	code, out, _ := runCommand(t, nil, "pull", "--help")
	if code != 0 || !strings.HasPrefix(out, "Usage: containerd-flyio-snapshotter pull") {
		t.Fatalf("pull --help = %d, %q", code, out)
	}
	for _, want := range []string{"[--refresh|--cached]", "[--namespace NS]...", "-namespace", "-cached", "-refresh", "-name", "-replace", "--control-socket PATH", "-config", "--format FORMAT", "without asking S3"} {
		if !strings.Contains(out, want) {
			t.Errorf("pull --help does not mention %q:\n%s", want, out)
		}
	}
}

// TestPullUsageErrors: arguments the daemon could not act on are refused
// with exit status 2 before any socket is dialled (the socket given does
// not exist, so reaching it would be exit 1).
func TestPullUsageErrors(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "none.sock")
	cases := []struct {
		args     []string
		inStderr string
	}{
		{[]string{"s3://bkt/images/app.tar", "--refresh", "--cached"}, "--refresh and --cached contradict each other: choose one"},
		{[]string{"--cached", "--refresh", "s3://bkt/images/"}, "--refresh and --cached contradict each other: choose one"},
		{[]string{}, "pull takes exactly one s3://BUCKET/KEY-or-PREFIX or PATH argument"},
		{[]string{"s3://bkt/a.tar", "s3://bkt/b.tar"}, "pull takes exactly one s3://BUCKET/KEY-or-PREFIX or PATH argument"},
		{[]string{"--frobnicate", "s3://bkt/a.tar"}, "unknown flag --frobnicate"},
		{[]string{"--namespace", "k8s.io", "--namespace", "bad/ns", "s3://bkt/a.tar"}, `--namespace: containerd namespace "bad/ns": must be letters`},
		{[]string{"--namespace", "", "s3://bkt/a.tar"}, "empty namespace"},
		// A script's unset variable: not the default name, silently.
		{[]string{"--name", "", "s3://bkt/a.tar"}, `invalid value "" for flag --name: empty name`},
		{[]string{"s3://bkt/a.tar", "--name="}, `invalid value "" for flag --name: empty name`},
	}
	for _, tc := range cases {
		args := append([]string{"pull", "--control-socket", socket}, tc.args...)
		code, out, errOut := runCommand(t, nil, args...)
		if code != 2 || !strings.Contains(errOut, tc.inStderr) || strings.Contains(errOut, socket) {
			t.Errorf("%v = %d, %q, %q; want 2 and %q", tc.args, code, out, errOut, tc.inStderr)
		}
	}
	// Either flag alone, and valid namespaces, pass the usage checks and
	// reach the socket.
	for _, flag := range []string{"--refresh", "--cached", "--namespace=k8s.io", "--name=registry.example/app:v1", "--replace"} {
		code, _, errOut := runCommand(t, nil, "pull", "--control-socket", socket, flag, "s3://bkt/images/app.tar")
		if code != 1 || !strings.Contains(errOut, socket) {
			t.Errorf("pull %s with no daemon = %d, %q; want 1 naming the socket", flag, code, errOut)
		}
	}
}

// refusingPuller stands in for the daemon's pipelines behind a real
// control server, for requests the server must refuse before any pull.
type refusingPuller struct{ t *testing.T }

func (p refusingPuller) Pull(_ context.Context, req api.PullRequest, _ func(api.Event)) (*api.PullResult, error) {
	p.t.Errorf("the control server passed on a pull it should have refused: %+v", req)
	return nil, errors.New("refusingPuller: no pulls here")
}

func (p refusingPuller) Activate(context.Context, string) (*api.ActivateResponse, error) {
	return nil, errors.New("refusingPuller: no activations here")
}

// serveFake serves the control API of p, a fake of the daemon's
// pipelines, on a new socket until the test ends, and returns its path.
func serveFake(t *testing.T, p server.Puller) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- server.Serve(ctx, lis, p) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("server.Serve: %v", err)
		}
	})
	return socket
}

// TestPullNameUsageErrors: an image name that containerd's clients would
// not accept is refused by the daemon before any work, and the CLI reports
// it as the usage error it is (exit status 2, the name and the rule on
// stderr, nothing on stdout), in both output formats. The CLI does not
// link the reference rules itself, so that it starts fast: the daemon's
// control server is the one place that checks them.
func TestPullNameUsageErrors(t *testing.T) {
	socket := serveFake(t, refusingPuller{t})
	for _, tc := range []struct {
		args     []string
		inStderr string
	}{
		{[]string{"--name", "App", "s3://bkt/a.tar"}, `--name: image name "App": invalid reference format: repository name (library/App) must be lowercase`},
		{[]string{"--name", "app@sha256:" + strings.Repeat("0", 64), "s3://bkt/a.tar"}, "must not carry a digest"},
		{[]string{"s3://bkt/a.tar", "--name", "s3://bkt/a.tar"}, `--name: image name "s3://bkt/a.tar": invalid reference format`},
	} {
		for _, format := range []string{"table", "json"} {
			args := append([]string{"pull", "--control-socket", socket, "--format", format}, tc.args...)
			code, out, errOut := runCommand(t, nil, args...)
			if code != 2 || out != "" || !strings.Contains(errOut, tc.inStderr) || !strings.Contains(errOut, "See 'containerd-flyio-snapshotter pull --help'") {
				t.Errorf("%v = %d, %q, %q; want 2, nothing on stdout and %q", args, code, out, errOut, tc.inStderr)
			}
		}
	}
}

// TestSocketRefusesUserNamesSocketGroup: a user outside daemon.socket_group
// runs pull, activate or rm against a running daemon whose socket (mode
// 0660, root's group) keeps them out. Each command names the socket and
// tells them to run as root or in the group daemon.socket_group sets,
// rather than asking whether the daemon runs.
func TestSocketRefusesUserNamesSocketGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the client as another user")
	}
	// Not t.TempDir: the user the client runs as must reach the socket's
	// folder and the client binary.
	dir, err := os.MkdirTemp("", "socket-group-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "control.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- server.Serve(ctx, lis, refusingPuller{t}) }()
	t.Cleanup(func() { cancel(); <-served })
	if err := os.Chmod(socket, 0o660); err != nil { // as the daemon binds it: root, group 0
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sub := range [][]string{{"pull", "s3://bkt/app/"}, {"activate", "app"}, {"rm", "app"}} {
		cmd := exec.Command(bin, append([]string{"-test.run=^TestValidateCommandHelperProcess$", "--", sub[0], "--control-socket", socket}, sub[1:]...)...)
		cmd.Env = append(os.Environ(), "FLYIO_VALIDATE_HELPER=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		msg := strings.TrimSpace(stderr.String())
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(msg, "control socket "+socket) || !strings.Contains(msg, "permission denied") ||
			!strings.Contains(msg, "run as root or as a member of the group set by daemon.socket_group") || strings.Contains(msg, "is the daemon running?") {
			t.Errorf("%s as uid 65534 on a running daemon's socket: %v, %q; want exit 1 naming the socket, and to run as root or in daemon.socket_group", sub[0], err, msg)
		}
	}
}

// fakeStalledPuller stands in for the daemon's pipelines in a pull that
// reports one progress event, says so on started, and then runs until its
// request's context ends.
type fakeStalledPuller struct {
	refusingPuller
	started chan struct{}
}

func (p fakeStalledPuller) Pull(ctx context.Context, _ api.PullRequest, progress func(api.Event)) (*api.PullResult, error) {
	progress(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 1 << 20, Total: 4 << 20})
	close(p.started)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestPullAcrossDaemonStop: the daemon stops (systemctl restart, an
// upgrade) while `pull` streams its progress. pull exits 1 and tells the
// operator the daemon is stopping and to run the same pull again, in both
// output formats.
func TestPullAcrossDaemonStop(t *testing.T) {
	const want = "daemon stopping: run the same pull again once it is back"
	for _, format := range []string{"table", "json"} {
		socket := filepath.Join(t.TempDir(), "control.sock")
		lis, err := net.Listen("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		p := fakeStalledPuller{refusingPuller{t}, make(chan struct{})}
		served := make(chan error, 1)
		go func() { served <- server.Serve(ctx, lis, p) }()
		go func() {
			<-p.started
			stop()
		}()
		code, out, errOut := runCommand(t, nil, "pull", "--control-socket", socket, "--format", format, "s3://bkt/app/")
		stop()
		if err := <-served; err != nil {
			t.Errorf("server.Serve: %v", err)
		}
		var lines []control.Line
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var v control.Line
			if json.Unmarshal([]byte(l), &v) == nil {
				lines = append(lines, v)
			}
		}
		switch {
		case code != 1:
			t.Errorf("pull --format %s across a daemon stop: exit %d, want 1 (stdout %q, stderr %q)", format, code, out, errOut)
		case format == "table" && !strings.Contains(errOut, want):
			t.Errorf("pull across a daemon stop: stderr %q; want %q", errOut, want)
		case format == "json" && (len(lines) == 0 || lines[len(lines)-1].Error != want):
			t.Errorf("pull --format json across a daemon stop: stdout %q; want its last line {\"error\": %q}", out, want)
		}
	}
}

// fakeExtractingPuller stands in for the daemon's pipelines in a pull
// whose layer is extracted as it downloads (the daemon's usual bottom
// layer): the terminal line of such a layer is its widest.
type fakeExtractingPuller struct{ refusingPuller }

func (fakeExtractingPuller) Pull(_ context.Context, req api.PullRequest, progress func(api.Event)) (*api.PullResult, error) {
	const mb = 1 << 20
	progress(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 1 * mb, Total: 480 * mb})
	time.Sleep(300 * time.Millisecond)
	progress(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 100 * mb, Total: 480 * mb})
	progress(api.Event{FSM: api.FSMUnpack, State: "extract-layers", Layer: 1, Bytes: 140 * mb, Files: 12345})
	time.Sleep(150 * time.Millisecond)
	progress(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 200 * mb, Total: 480 * mb})
	time.Sleep(150 * time.Millisecond)
	progress(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 300 * mb, Total: 480 * mb})
	return &api.PullResult{Ref: "app:v1", Source: "s3://bkt/app/", Snapshot: api.ActivateResponse{Registered: true}}, nil
}

// TestPullProgressFitsTerminal: on an 80-column terminal `pull` draws no
// progress row of 80 columns or more (such a row wraps, and the redraw,
// which moves the cursor up one row per layer, would leave its upper part
// behind), yet still shows the layer, its step and its bytes.
func TestPullProgressFitsTerminal(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("needs script(1) for a pseudo-terminal")
	}
	socket := serveFake(t, fakeExtractingPuller{refusingPuller{t}})
	line := "stty cols 80 rows 24; FLYIO_VALIDATE_HELPER=1 " + os.Args[0] +
		" -test.run='^TestValidateCommandHelperProcess$' -- pull --control-socket " + socket + " s3://bkt/app/"
	out, err := exec.Command("script", "-qfec", line, "/dev/null").CombinedOutput()
	if err != nil {
		t.Fatalf("script: %v: %q", err, out)
	}
	csi := regexp.MustCompile("\x1b\\[[0-9;]*[A-Za-z]")
	var rows []string
	for _, l := range strings.Split(string(out), "\n") {
		for _, row := range strings.Split(csi.ReplaceAllString(l, ""), "\r") {
			if row != "" {
				rows = append(rows, row)
			}
		}
	}
	sawLayer := false
	for _, row := range rows {
		if len(row) >= 80 && !strings.HasPrefix(row, "pulled ") { // the result goes to stdout, not redrawn
			t.Errorf("on an 80-column terminal pull drew a %d-column row: %q", len(row), row)
		}
		sawLayer = sawLayer || strings.HasPrefix(row, "layer 1   download        300.0 MiB / 480.0 MiB")
	}
	if !sawLayer {
		t.Errorf("pull's terminal output shows no line of layer 1's download: %q", out)
	}
}

// failingPuller is a fake of the daemon's pipelines, behind a real control
// server, whose pulls and activations fail with err's text, as a pull
// whose S3 server answered an error does.
type failingPuller struct{ err error }

func (p failingPuller) Pull(context.Context, api.PullRequest, func(api.Event)) (*api.PullResult, error) {
	return nil, p.err
}

func (p failingPuller) Activate(context.Context, string) (*api.ActivateResponse, error) {
	return nil, p.err
}

// TestFailureTextEscapedOnStderr: the daemon's reason for a failed pull
// or activation may carry text it did not write (an S3 server's error
// message); the CLI prints it with its control and format characters
// escaped, so that the operator's terminal gets no escape sequence and
// no carriage return that would overwrite the line, and keeps the line
// breaks of a reason of several lines.
func TestFailureTextEscapedOnStderr(t *testing.T) {
	hostile := "list s3://bkt/app/: api error AccessDenied: \x1b]0;owned\x07\u202eok\u009b2J\rforged\nsecond line"
	socket := serveFake(t, failingPuller{errors.New(hostile)})
	for _, args := range [][]string{
		{"pull", "--control-socket", socket, "s3://bkt/app/"},
		{"activate", "--control-socket", socket, "app"},
	} {
		code, out, errOut := runCommand(t, nil, args...)
		if code != 1 || out != "" {
			t.Errorf("%v = %d, %q, %q; want 1 and nothing on stdout", args, code, out, errOut)
		}
		if i := strings.IndexFunc(errOut, func(r rune) bool { return r != '\n' && !strconv.IsPrint(r) }); i >= 0 {
			t.Errorf("%v prints %q raw on stderr: %q", args, []rune(errOut[i:])[0], errOut)
		}
		if !strings.Contains(errOut, `\x1b]0;owned\a`) || !strings.Contains(errOut, "\nsecond line") {
			t.Errorf("%v: stderr %q lacks the reason escaped, line by line", args, errOut)
		}
	}
}

// TestPullInterrupted: Ctrl-C during a pull ends the command, not the
// daemon's pull, and the command says so (and what to do) instead of a
// bare "context canceled", in both output formats; the exit status is 1.
func TestPullInterrupted(t *testing.T) {
	const want = "interrupted: the pull goes on in the daemon"
	for _, format := range []string{"table", "json"} {
		p := fakeStalledPuller{refusingPuller{t}, make(chan struct{})}
		socket := serveFake(t, p)
		var stdout, stderr stack.LockedBuffer
		cmd := exec.Command(os.Args[0], "-test.run=^TestValidateCommandHelperProcess$", "--",
			"pull", "--control-socket", socket, "--format", format, "s3://bkt/app/")
		cmd.Env = append(os.Environ(), "FLYIO_VALIDATE_HELPER=1")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.started:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the pull never reached the daemon")
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("pull --format %s interrupted: %v, want exit status 1", format, err)
		}
		got := stderr.String()
		if format == "json" {
			got = stdout.String()
		}
		if !strings.Contains(got, want) || strings.Contains(got, "context canceled") {
			t.Errorf("pull --format %s interrupted said %q; want %q", format, got, want)
		}
	}
}
