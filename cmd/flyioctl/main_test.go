package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"
)

// TestMain runs the test binary as flyioctl when FLYIO_CTL_HELPER is set,
// so that the tests below check what the binary prints.
func TestMain(m *testing.M) {
	if os.Getenv("FLYIO_CTL_HELPER") == "1" {
		os.Exit(cli.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func runCtl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "FLYIO_CTL_HELPER=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// TestCommands: flyioctl offers the subcommands that talk to the daemon,
// under its own name, and no others.
func TestCommands(t *testing.T) {
	code, out, _ := runCtl(t, "--help")
	if code != 0 || !strings.HasPrefix(out, "Usage: flyioctl <command>") {
		t.Fatalf("--help = %d, %q", code, out)
	}
	if got, want := strings.Join(cli.Names(), " "), "activate pull rm version"; got != want {
		t.Errorf("subcommands %q, want %q", got, want)
	}
	for _, sub := range []string{"pull", "activate", "rm", "version"} {
		if code, out, _ := runCtl(t, sub, "--help"); code != 0 || !strings.HasPrefix(out, "Usage: flyioctl "+sub) {
			t.Errorf("%s --help = %d, %q", sub, code, out)
		}
	}
	code, _, errOut := runCtl(t, "serve")
	if code != 2 || !strings.Contains(errOut, `flyioctl: unknown command "serve"`) {
		t.Errorf("serve = %d, %q; want 2 and unknown command", code, errOut)
	}
	code, out, _ = runCtl(t, "--version")
	if code != 0 || !strings.HasPrefix(out, "flyioctl ") || strings.Contains(out, "SQLite") {
		t.Errorf("--version = %d, %q; want flyioctl's version, without a SQLite", code, out)
	}
}

// TestLinksNoneOfTheDaemon guards flyioctl's start-up: the package
// initialisers of the modules the daemon needs (the AWS SDK, containerd's
// client, gRPC, protobuf, Prometheus, the reference parser, compression)
// and cgo's SQLite are most of the full binary's start, and none may creep
// back in through an import.
func TestLinksNoneOfTheDaemon(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "osusergo netgo", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v: %s", err, out)
	}
	forbidden := []string{
		"github.com/aws/", "google.golang.org/grpc", "google.golang.org/protobuf",
		"github.com/containerd/containerd/v2/client", "github.com/containerd/containerd/v2/core",
		"github.com/prometheus/", "github.com/distribution/", "github.com/klauspost/",
		"github.com/mattn/go-sqlite3", "github.com/sirupsen/logrus",
		"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher",
		"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin",
		"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata",
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("flyioctl links %s (%s...): its initialisers would run on every call", pkg, f)
			}
		}
	}
}
