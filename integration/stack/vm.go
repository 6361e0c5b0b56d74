package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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

// freeAddr returns a 127.0.0.1 host:port that was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// portAttempts is how many free ports ServeOnFreePort tries.
const portAttempts = 3

// ServeOnFreePort starts a server that must be told its port (versitygw,
// distribution's registry): start is given a 127.0.0.1 host:port that was
// free a moment ago and returns the process once it accepts connections
// there (StartServing). Between that moment and the server's bind, any
// other socket may take the port: the server then exits with "address
// already in use", or, when that socket listens, the connection start
// waited for was that socket's. Either way the server is stopped and
// started again on another port, up to portAttempts times. Any other
// failure stops the server and is returned as it is; once ctx is done, no
// further attempt is made.
func ServeOnFreePort(ctx context.Context, start func(addr string) (*Proc, error)) (*Proc, string, error) {
	var lastErr error
	for range portAttempts {
		if err := ctx.Err(); err != nil {
			return nil, "", fmt.Errorf("serving on a free port: %w", err)
		}
		addr, err := freeAddr()
		if err != nil {
			return nil, "", err
		}
		p, err := start(addr)
		if err == nil {
			// The connection that start waited for may have been
			// accepted by the socket that took the port.
			owns, oerr := p.listensOn(addr)
			if oerr == nil && owns {
				return p, addr, nil
			}
			p.Kill()
			if oerr != nil {
				return nil, "", oerr
			}
			err = fmt.Errorf("%s: another socket answers on %s: %w", p.Name, addr, errPortTaken)
		}
		if !errors.Is(err, errPortTaken) {
			return nil, "", err
		}
		lastErr = err
	}
	return nil, "", fmt.Errorf("%d free ports were each taken before the server bound them: %w", portAttempts, lastErr)
}

// listensOn reports whether the process holds the listening TCP socket on
// addr's port, from the kernel's socket tables (/proc/net/tcp, tcp6) and
// the process's open files.
func (p *Proc) listensOn(addr string) (bool, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return false, fmt.Errorf("port of %s: %w", addr, err)
	}
	want := fmt.Sprintf(":%04X", n)
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			return false, fmt.Errorf("sockets: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st ... inode: the state of a
			// listening socket is 0A.
			f := strings.Fields(line)
			if len(f) > 9 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", p.Pid())
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return false, fmt.Errorf("%s's open files: %w", p.Name, err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && inodes[target] {
			return true, nil
		}
	}
	return false, nil
}
