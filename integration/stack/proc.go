package stack

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a daemon started by StartProc, its output appended to LogPath.
type Proc struct {
	Name    string
	LogPath string
	// logStart is the size of LogPath before this run's first line.
	logStart int64
	cmd      *exec.Cmd
	done     chan struct{}
	waitErr  error
}

// StartProc starts argv in its own process group with stdout and stderr
// appended to logPath; env nil means the caller's environment.
func StartProc(name, logPath string, env []string, argv ...string) (*Proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: log file %q: %w", name, logPath, err)
	}
	st, err := lf.Stat()
	if err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: log file %q: %w", name, logPath, err)
	}
	fmt.Fprintf(lf, "---- %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = env
	// Own process group: a SIGKILL of the caller does not leave it attached
	// to the terminal, and our signals reach only the daemon itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	p := &Proc{Name: name, LogPath: logPath, logStart: st.Size(), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM, waits up to timeout, then SIGKILLs. It returns an
// error when the process had already died or did not end cleanly.
func (p *Proc) Stop(timeout time.Duration) error {
	if p.Exited() {
		return fmt.Errorf("%s had already exited: %v; log %s", p.Name, p.waitErr, p.LogPath)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.waitErr != nil {
			return fmt.Errorf("%s stopped with %w; log %s", p.Name, p.waitErr, p.LogPath)
		}
		return nil
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not stop within %s of SIGTERM: killed; log %s", p.Name, timeout, p.LogPath)
	}
}

// Kill sends SIGKILL and returns once the process has been reaped.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// RunLog returns what this run of the process has logged so far (LogPath
// also holds the runs before it).
func (p *Proc) RunLog() (string, error) {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return "", fmt.Errorf("%s's log: %w", p.Name, err)
	}
	return string(b[min(p.logStart, int64(len(b))):]), nil
}

// LogTail returns the last n lines of the process's log.
func (p *Proc) LogTail(n int) string { return FileTail(p.LogPath, n) }

// FileTail returns the last n lines of a text file (or why it cannot).
func FileTail(path string, n int) string {
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

// StartServing is StartProc followed by a wait of up to 3 minutes (and
// within ctx) until the process listens on network/address; a process
// that does not is killed.
func StartServing(ctx context.Context, name, logPath string, env []string, network, address string, argv ...string) (*Proc, error) {
	p, err := StartProc(name, logPath, env, argv...)
	if err != nil {
		return nil, err
	}
	if err := waitDial(ctx, p, network, address); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// waitDial is WaitDial bounded to 3 minutes, for the stack's own daemons.
func waitDial(ctx context.Context, p *Proc, network, address string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	return WaitDial(ctx, p, network, address)
}

// errPortTaken is WaitDial's error for a process that ended because its
// address was in use (EADDRINUSE, in its log).
var errPortTaken = errors.New("address already in use")

// WaitDial waits until network/address accepts a connection, and returns
// nil then; it returns an error quoting the tail of p's log when p exits
// first (wrapping errPortTaken when that log says the address was in use)
// or ctx ends first.
func WaitDial(ctx context.Context, p *Proc, network, address string) error {
	for {
		c, err := net.DialTimeout(network, address, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if p.Exited() {
			if log, lerr := p.RunLog(); lerr == nil && strings.Contains(log, "address already in use") {
				return fmt.Errorf("%s exited (%v) before listening on %s: %w; log %s:\n%s", p.Name, p.waitErr, address, errPortTaken, p.LogPath, p.LogTail(40))
			}
			return fmt.Errorf("%s exited (%v) before listening on %s; log %s:\n%s", p.Name, p.waitErr, address, p.LogPath, p.LogTail(40))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not listening on %s: %w; log %s:\n%s", p.Name, address, ctx.Err(), p.LogPath, p.LogTail(40))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Run runs a command to completion and returns its combined output; a
// failure's error quotes the command and its output.
func Run(ctx context.Context, env []string, argv ...string) (string, error) {
	return run(ctx, env, true, argv)
}

// RunStdout runs a command to completion like Run but returns only its
// standard output: a client that runs a container (ctr run, nerdctl run)
// prints the container's output there and its own log lines on standard
// error, at times even on success (nerdctl's signal forwarder logging the
// task's closed connection as it exits). A failure's error quotes the
// command and both.
func RunStdout(ctx context.Context, env []string, argv ...string) (string, error) {
	return run(ctx, env, false, argv)
}

// run is Run (combined) and RunStdout (not combined).
func run(ctx context.Context, env []string, combined bool, argv []string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if combined {
		cmd.Stderr = &out
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(out.String()+stderr.String()))
	}
	return out.String(), nil
}

// LoopbackUp brings the loopback interface up when it is down (the VM
// harness's guest boots with -net none and lo down); the local S3 server
// listens on 127.0.0.1.
func LoopbackUp(ctx context.Context) error {
	b, err := os.ReadFile("/sys/class/net/lo/flags")
	if err == nil {
		var flags uint64
		if _, serr := fmt.Sscanf(strings.TrimSpace(string(b)), "0x%x", &flags); serr == nil && flags&0x1 != 0 {
			return nil // IFF_UP
		}
	}
	if _, err := Run(ctx, nil, "ip", "link", "set", "dev", "lo", "up"); err != nil {
		return fmt.Errorf("bring loopback up for the local S3 server: %w", err)
	}
	return nil
}

// RepoRoot finds the repository root (the folder holding the project's
// go.mod) above the working directory or the running binary.
func RepoRoot() (string, error) {
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
	return "", errors.New("repository root not found above the working directory or the binary")
}

// LockedBuffer is a bytes.Buffer that one goroutine may write (a child
// process's output, copied by exec) while another reads it.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
