package main

import (
	"path/filepath"
	"strings"
	"testing"
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
		{[]string{"--name", "App", "s3://bkt/a.tar"}, `--name: image name "App": invalid reference format: repository name (library/App) must be lowercase`},
		{[]string{"--name", "app@sha256:" + strings.Repeat("0", 64), "s3://bkt/a.tar"}, "must not carry a digest"},
		{[]string{"s3://bkt/a.tar", "--name", "s3://bkt/a.tar"}, `--name: image name "s3://bkt/a.tar": invalid reference format`},
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
