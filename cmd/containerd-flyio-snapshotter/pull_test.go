package main

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control/server"
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

// TestPullNameUsageErrors: an image name that containerd's clients would
// not accept is refused by the daemon before any work, and the CLI reports
// it as the usage error it is (exit status 2, the name and the rule on
// stderr, nothing on stdout), in both output formats. The CLI does not
// link the reference rules itself, so that it starts fast: the daemon's
// control server is the one place that checks them.
func TestPullNameUsageErrors(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- server.Serve(ctx, lis, refusingPuller{t}) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("server.Serve: %v", err)
		}
	}()
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
