package stack

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	vmscratch "github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
)

// VMEnv finds what a dm test run by integration/vm/run.sh or suite.sh
// starts from: the repository (RepoRoot), the harness's scratch tmpfs
// (integration/vm/scratch) and the containerd tools (ToolsDir). Each
// error says how to make what is missing.
func VMEnv() (repo, scratch, tools string, err error) {
	if scratch, err = vmscratch.Root(); err != nil {
		return "", "", "", err
	}
	if repo, err = RepoRoot(); err != nil {
		return "", "", "", err
	}
	if tools, err = ToolsDir(repo); err != nil {
		return "", "", "", err
	}
	return repo, scratch, tools, nil
}

// PrivateBinary copies our binary (bin/containerd-flyio-snapshotter under
// repo, `make build`) into dir, made if missing, and returns the copy's
// path: a run that execs the copy is not changed by a rebuild on the host,
// and on the scratch tmpfs it is not read again from the repository's 9p
// share at every exec.
func PrivateBinary(repo, dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repo, "bin/containerd-flyio-snapshotter"))
	if err != nil {
		return "", fmt.Errorf("our binary (run `make build` on the host first): %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "containerd-flyio-snapshotter")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		return "", err
	}
	return bin, nil
}

// FreeAddr returns a 127.0.0.1 host:port that was free a moment ago, for
// a server the caller starts next.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}
