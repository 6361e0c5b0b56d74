package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
)

// openPty returns the two ends of a new pseudo-terminal whose window is
// rows by cols.
func openPty(t *testing.T, rows, cols uint16) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skip("no pseudo-terminal:", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Skip("unlock pseudo-terminal:", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Skip("pseudo-terminal number:", err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skip("open pseudo-terminal:", err)
	}
	if err := unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	return m, s
}

// TestPullProgressFitsTerminalHeight: a pull of an image with more layers
// than the terminal (stderr) has rows redraws its progress in place: it
// never moves the cursor up more rows than the terminal has, which would
// stop at the top of the screen and leave every redraw's lines scrolled
// into the terminal's history, one copy per redraw.
func TestPullProgressFitsTerminalHeight(t *testing.T) {
	const rows, layers = 6, 12
	master, tty := openPty(t, rows, 120)
	defer master.Close()
	var drawn bytes.Buffer
	done := make(chan struct{})
	go func() { _, _ = io.Copy(&drawn, master); close(done) }()

	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		for i := 1; i <= layers; i++ {
			_ = enc.Encode(control.Line{Event: &api.Event{FSM: api.FSMDownload, State: "download", Layer: i, Total: 1 << 20}})
		}
		_ = enc.Encode(control.Line{Result: &api.PullResult{Ref: "app:v1"}})
	})}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()

	stderr, stdout := os.Stderr, os.Stdout
	devnull, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	os.Stderr, os.Stdout = tty, devnull
	err = runPull(context.Background(), []string{"--control-socket", sock, "s3://b/app/"})
	os.Stderr, os.Stdout = stderr, stdout
	devnull.Close()
	tty.Close()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	out := drawn.String()
	for _, m := range regexp.MustCompile(`\x1b\[(\d+)A`).FindAllStringSubmatch(out, -1) {
		if n, _ := strconv.Atoi(m[1]); n >= rows {
			t.Fatalf("a redraw moves the cursor up %d rows on a %d-row terminal", n, rows)
		}
	}
	frames := regexp.MustCompile(`\x1b\[\d+A`).Split(out, -1)
	last := frames[len(frames)-1]
	if n := strings.Count(last, "\n"); n >= rows {
		t.Errorf("the last redraw writes %d lines on a %d-row terminal: %q", n, rows, last)
	}
	if !strings.Contains(out, fmt.Sprintf("layer %-3d", layers)) {
		t.Errorf("the last layer's line is never drawn: %q", out)
	}
}
