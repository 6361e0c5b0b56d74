//go:build dm

package containerdtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// proc is a daemon the tests start (our snapshotter daemon, containerd),
// with its output in a log file the failure messages quote.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	waitErr error
}

// startProc starts argv with its stdout and stderr appended to logPath.
func startProc(name, logPath string, env []string, argv ...string) (*proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: log file %q: %w", name, logPath, err)
	}
	fmt.Fprintf(lf, "---- %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = env
	// Own process group: a SIGKILL of the test does not leave it attached
	// to our terminal, and our signals reach only the daemon itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the process to be reaped.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits up to timeout, then SIGKILL. It returns the
// process's exit error when it did not end cleanly on SIGTERM.
func (p *proc) stop(timeout time.Duration) error {
	if p.exited() {
		return fmt.Errorf("%s had already exited: %v", p.name, p.waitErr)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.waitErr
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("%s did not stop within %s of SIGTERM; killed", p.name, timeout)
	}
}

// logTail returns the last n lines of the process's log.
func (p *proc) logTail(n int) string {
	return fileTail(p.logPath, n)
}

func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log %s: %v)", path, err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// waitSocket waits until a unix socket at path accepts connections, the
// process exits (an error quoting its log), or ctx ends.
func waitSocket(ctx context.Context, p *proc, path string) error {
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited (%v) before serving %s; log tail:\n%s", p.name, p.waitErr, path, p.logTail(40))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not serving %s: %w; log tail:\n%s", p.name, path, ctx.Err(), p.logTail(40))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// repoRoot finds the repository root (the folder holding the project's
// go.mod) from the working directory or the test binary's location.
func repoRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, dir := range starts {
		for d := dir; ; d = filepath.Dir(d) {
			b, err := os.ReadFile(filepath.Join(d, "go.mod"))
			if err == nil && strings.Contains(string(b), "module github.com/flyio-snapshotter/containerd-flyio-snapshotter\n") {
				return d, nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", errors.New("repository root not found above the working directory or the test binary")
}

// toolsDir is where integration/tools/build.sh put containerd, the runc
// shim and ctr, for the version pinned in integration/tools/go.mod.
func toolsDir(repo string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repo, "integration/tools/go.mod"))
	if err != nil {
		return "", fmt.Errorf("containerd version: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "github.com/containerd/containerd/v2" {
			dir := filepath.Join(repo, ".cache/tools", "containerd-"+f[1])
			for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
				if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
					return "", fmt.Errorf("%s %s not built (run integration/tools/build.sh on the host before the VM): %w", bin, f[1], err)
				}
			}
			return dir, nil
		}
	}
	return "", errors.New("integration/tools/go.mod does not require github.com/containerd/containerd/v2")
}

// run runs a short command and returns its combined output, wrapped in the
// error when it fails.
func run(ctx context.Context, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
