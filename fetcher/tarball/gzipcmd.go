package tarball

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// A gzip layer may be inflated by a program instead of klauspost/compress:
// ISA-L's igzip, fed and read through pipes as here, inflates image-like
// data 1.7 to 1.9 times as fast as the fastest Go inflater
// (BenchmarkInflate, on a host and in the VM), and in a process of its
// own it runs beside the extraction on another core.
// containerd does the same, with the same program, when it is installed.
//
// The program only produces the bytes; the verdict stays the built-in
// inflater's, so a layer is accepted or refused alike on every host:
//   - the tar stream is parsed, limited and hashed as before;
//   - the program's exit status carries the verdict of the gzip format and
//     its checksums;
//   - the program does not say where the gzip stream ended, and igzip and
//     pigz ignore bytes after it, which the built-in inflater refuses. So
//     the program is fed one more gzip member after the layer, holding
//     random bytes drawn for this stream (the end mark): the program
//     inflates it only if everything before it was gzip members, and the
//     layer cannot hold a member that makes those bytes. Its output is
//     the layer's tar stream followed by the end mark, which is checked
//     and cut off.

// pipeSize is the capacity asked for the program's pipes: with the
// default 64 KiB, the wake-ups of the program and of the daemon cost igzip
// two thirds of its lead over the built-in inflater (BenchmarkInflate).
// 1 MiB is Linux's default pipe-max-size.
const pipeSize = 1 << 20

// growPipe asks for pipeSize on the pipe f is an end of; a refusal leaves
// the default, which only costs speed.
func growPipe(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize) })
	}
}

// endMarkSize is the length of the end mark's random content.
const endMarkSize = 32

// errNoEndMark is a gzip command's output without the end mark: bytes
// after the layer's gzip stream that the program ignored, as the built-in
// inflater's multistream reading refuses them.
var errNoEndMark = errors.New("data after the end of the gzip stream")

// stderrLimit bounds what is kept of the program's standard error, which
// names the failure.
const stderrLimit = 4 << 10

// inflateCommand is a running gzip program: feed copies the layer's bytes
// and then the end mark's member to its standard input, Read returns its
// standard output less the end mark.
type inflateCommand struct {
	path   string
	cmd    *exec.Cmd
	out    *os.File // read end of the program's standard output
	stderr limitedBuffer
	waited sync.Once
	exit   error
	mark   []byte // the end mark: random bytes
	member []byte // the end mark, gzipped
	// fed is closed once feed has ended: the source was read to its end
	// or failed, or the program stopped reading.
	fed chan struct{}
	// buf holds the output read and not yet returned, pending: the last
	// len(mark) bytes of it are held back until more follow, since they
	// may be the end mark.
	buf     []byte
	pending []byte
	end     error // once the output has ended, what follows pending: io.EOF or the failure
}

// startInflateCommand starts the program at path reading src (the layer's
// compressed bytes, a *source: its failures are recorded there).
func startInflateCommand(path string, src io.Reader) (*inflateCommand, error) {
	c := &inflateCommand{path: path, fed: make(chan struct{}), buf: make([]byte, readaheadChunk+endMarkSize)}
	c.mark = make([]byte, endMarkSize)
	rand.Read(c.mark)
	var m bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&m, gzip.NoCompression)
	zw.Write(c.mark)
	zw.Close()
	c.member = m.Bytes()
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("gzip command %s: %w", path, err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("gzip command %s: %w", path, err)
	}
	c.out = outR
	growPipe(inW)
	growPipe(outW)
	c.cmd = exec.Command(path, "-d", "-c")
	c.cmd.Stdin, c.cmd.Stdout, c.cmd.Stderr = inR, outW, &c.stderr
	// A daemon killed mid-layer takes the program with it; without the
	// signal it would end anyway, at the end of its input.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = c.cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("gzip command: %w", err)
	}
	go c.feed(src, inW)
	return c, nil
}

// feed copies src to the program's input, then the end mark's member once
// src has ended, and stops early when src fails or the program stops
// reading.
func (c *inflateCommand) feed(src io.Reader, in *os.File) {
	defer close(c.fed)
	defer in.Close()
	buf := make([]byte, readaheadChunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := in.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err == io.EOF {
			in.Write(c.member)
		}
		if err != nil {
			return
		}
	}
}

// Read implements io.Reader over the program's output less the end mark.
// Once the output ends it waits for the program and for feed: a failed
// program's message is the error (decoded tells a source's failure from
// corrupt data by the source), and io.EOF comes only after the end mark.
func (c *inflateCommand) Read(p []byte) (int, error) {
	for c.end == nil && len(c.pending) <= len(c.mark) {
		c.fill()
	}
	avail := c.pending
	if c.end == nil {
		avail = avail[:len(avail)-len(c.mark)]
	}
	if len(avail) == 0 {
		return 0, c.end
	}
	n := copy(p, avail)
	c.pending = c.pending[n:]
	return n, nil
}

// fill reads the program's output after pending; at its end it sets end.
func (c *inflateCommand) fill() {
	k := copy(c.buf, c.pending)
	n, err := c.out.Read(c.buf[k:])
	c.pending = c.buf[:k+n]
	if err == nil {
		return
	}
	<-c.fed
	exit := c.wait()
	switch {
	case err != io.EOF:
		c.end = &sourceError{fmt.Errorf("gzip command %s: read its output: %w", c.path, err)}
	case killedFromOutside(exit):
		// Not the program's verdict on the data: a stop of the whole
		// service (systemd signals every process of the unit), the OOM
		// killer or an operator ended it, and the layer may inflate on
		// the next attempt.
		c.end = &sourceError{fmt.Errorf("gzip command %s: %w", c.path, exit)}
	case exit != nil:
		msg := strings.TrimSpace(c.stderr.String())
		if msg == "" {
			msg = exit.Error()
		}
		c.end = fmt.Errorf("%s: %s", c.path, msg)
	case bytes.HasSuffix(c.pending, c.mark):
		c.pending = c.pending[:len(c.pending)-len(c.mark)]
		c.end = io.EOF
	default:
		c.end = errNoEndMark
	}
}

// killedFromOutside reports whether exit is the end of a program killed
// by a signal that others send (SIGTERM, SIGKILL, SIGINT, SIGHUP), as
// opposed to an exit status or a signal of its own fault (SIGSEGV,
// SIGABRT), which the data it read may have caused.
func killedFromOutside(exit error) bool {
	var ee *exec.ExitError
	if !errors.As(exit, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return false
	}
	switch ws.Signal() {
	case syscall.SIGTERM, syscall.SIGKILL, syscall.SIGINT, syscall.SIGHUP:
		return true
	}
	return false
}

func (c *inflateCommand) wait() error {
	c.waited.Do(func() { c.exit = c.cmd.Wait() })
	return c.exit
}

// stop kills the program (one that has ended is not signalled again) and
// closes its output, so that a Read under way returns.
func (c *inflateCommand) stop() {
	c.cmd.Process.Kill()
	c.out.Close()
}

// reap waits, after stop, for the program and for feed; feed ends once
// its read of the source under way returns.
func (c *inflateCommand) reap() {
	<-c.fed
	c.wait()
}

// limitedBuffer keeps the first stderrLimit bytes written to it.
type limitedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rest := stderrLimit - l.b.Len(); rest > 0 {
		l.b.Write(p[:min(len(p), rest)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The values of the daemon's gzip_command key besides a program's path.
const (
	// GzipCommandAuto is igzip when PATH has it, the built-in inflater
	// otherwise: the default, and containerd's own choice for its pulls.
	GzipCommandAuto = "auto"
	// GzipCommandBuiltin is always the built-in inflater.
	GzipCommandBuiltin = "builtin"
)

// CheckGzipCommand records in p a problem with v, the value of key: it
// must be GzipCommandAuto, GzipCommandBuiltin or the absolute path of an
// executable file.
func CheckGzipCommand(p *conf.Problems, key, v string) {
	switch {
	case v == GzipCommandAuto || v == GzipCommandBuiltin:
	case !filepath.IsAbs(v):
		p.Add(key, "must be %q, %q or the absolute path of a program such as /usr/bin/igzip, got %q", GzipCommandAuto, GzipCommandBuiltin, v)
	default:
		if fi, err := os.Stat(v); err != nil {
			p.Add(key, "%v", err)
		} else if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			p.Add(key, "%s is not an executable file (mode %v)", v, fi.Mode())
		}
	}
}

// ResolveGzipCommand is the program a checked gzip_command value v names
// for ExtractOptions.GzipCommand and InflateWith: "" for the built-in
// inflater.
func ResolveGzipCommand(v string) string {
	switch v {
	case GzipCommandBuiltin:
		return ""
	case GzipCommandAuto:
		p, err := exec.LookPath("igzip")
		if err != nil {
			return ""
		}
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
		return p
	}
	return v
}
