package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// clock is a settable time source for the progress display.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// newClockedProgress returns a progress display, drawn for a terminal or
// not as tty says, whose clock c stands still until a test moves it, and
// the buffer it writes to.
func newClockedProgress(tty bool) (p *progress, c *clock, out *bytes.Buffer) {
	out = &bytes.Buffer{}
	c = &clock{t: time.Unix(1700000000, 0)}
	p = newProgress(out, tty)
	p.now = c.now
	return p, c, out
}

// checkPlainLines checks that the plain (off-terminal) output got is the
// lines want.
func checkPlainLines(t *testing.T, got string, want []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("plain output:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// TestProgressTerminal: one line per layer, redrawn in place (cursor moved
// up over the previous drawing), with bytes, percentage, rate and ETA.
func TestProgressTerminal(t *testing.T) {
	p, c, out := newClockedProgress(true)
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Total: 100 << 20})
	c.t = c.t.Add(2 * time.Second)
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 50 << 20, Total: 100 << 20})
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 2, Total: 10 << 20})
	p.finish()
	frames := strings.Split(out.String(), "\033[")
	last := out.String()[strings.LastIndex(out.String(), "\033[2A"):]
	lines := strings.Split(strings.TrimSuffix(last, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("last frame %q: want two lines (two layers) after a cursor-up by 2", last)
	}
	want1 := "layer 1   download         50.0 MiB / 100.0 MiB  50.0%  25.0 MiB/s  ETA 2s"
	if got := strings.TrimPrefix(lines[0], "\033[2A\r\033[K"); got != want1 {
		t.Errorf("layer 1 line %q\nwant          %q", got, want1)
	}
	if got := strings.TrimPrefix(lines[1], "\r\033[K"); !strings.HasPrefix(got, "layer 2   download          0.0 MiB / 10.0 MiB    0.0%") {
		t.Errorf("layer 2 line %q", got)
	}
	if len(frames) < 4 {
		t.Errorf("expected several redraws, got %q", out.String())
	}
}

// TestProgressPlain: off a terminal, a line when a layer's step changes
// and, while it only advances, at most one every plainInterval; no control
// characters.
func TestProgressPlain(t *testing.T) {
	p, c, out := newClockedProgress(false)
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Total: 8 << 20})
	for i := 1; i <= 8; i++ {
		c.t = c.t.Add(time.Second)
		p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: int64(i) << 20, Total: 8 << 20})
	}
	p.event(api.Event{FSM: api.FSMDownload, State: "validate", Layer: 1, Bytes: 8 << 20, Total: 8 << 20})
	p.event(api.Event{FSM: api.FSMActivate, State: "register"})
	p.finish()
	got := out.String()
	if strings.ContainsAny(got, "\r\033") {
		t.Errorf("plain output has terminal control characters: %q", got)
	}
	checkPlainLines(t, got, []string{
		"layer 1   download          0.0 MiB / 8.0 MiB     0.0%",
		"layer 1   download          5.0 MiB / 8.0 MiB    62.5%  1.0 MiB/s  ETA 3s",
		"layer 1   validate          8.0 MiB / 8.0 MiB   100.0%",
		"image     register",
	})
}

// TestProgressBothPhases: a layer extracted while it downloads shows both
// on its line (bytes downloaded of the total, bytes and files extracted),
// and the extraction's events do not count as a change of step.
func TestProgressBothPhases(t *testing.T) {
	p, c, out := newClockedProgress(false)
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Total: 8 << 20})
	c.t = c.t.Add(time.Second)
	p.event(api.Event{FSM: api.FSMUnpack, State: "extract-layers", Layer: 1, Bytes: 3 << 20, Files: 120})
	c.t = c.t.Add(5 * time.Second)
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 6 << 20, Total: 8 << 20})
	p.event(api.Event{FSM: api.FSMDownload, State: "validate", Layer: 1, Bytes: 8 << 20, Total: 8 << 20})
	p.event(api.Event{FSM: api.FSMUnpack, State: "extract-layers", Layer: 1, Bytes: 20 << 20, Files: 700})
	checkPlainLines(t, out.String(), []string{
		"layer 1   download          0.0 MiB / 8.0 MiB     0.0%",
		"layer 1   download          6.0 MiB / 8.0 MiB    75.0%  1.0 MiB/s  ETA 2s  | extracted 3.0 MiB, 120 files",
		"layer 1   validate          8.0 MiB / 8.0 MiB   100.0%",
		"layer 1   extract-layers   20.0 MiB  700 files",
	})
}

// TestProgressTotalPerStep: a step's total is not carried into the next
// step, whose bytes count something else (an extraction's file content,
// of a layer whose total is its compressed size).
func TestProgressTotalPerStep(t *testing.T) {
	p, c, out := newClockedProgress(false)
	p.event(api.Event{FSM: api.FSMDownload, State: "validate", Layer: 1, Bytes: 8 << 20, Total: 8 << 20})
	p.event(api.Event{FSM: api.FSMDownload, State: "store-metadata", Layer: 1})
	c.t = c.t.Add(time.Second)
	p.event(api.Event{FSM: api.FSMUnpack, State: "extract-layers", Layer: 1, Bytes: 15 << 20, Files: 300})
	p.event(api.Event{FSM: api.FSMUnpack, State: "verify-layout", Layer: 1})
	checkPlainLines(t, out.String(), []string{
		"layer 1   validate          8.0 MiB / 8.0 MiB   100.0%",
		"layer 1   store-metadata",
		"layer 1   extract-layers   15.0 MiB  300 files",
		"layer 1   verify-layout",
	})
}

// TestProgressFitsTerminalWidth: on a terminal each layer's line is cut to
// fewer columns than the terminal has (whole fields dropped from the end),
// so that it takes one row and the cursor moved up one row per layer
// redraws it in place; a resize is seen at the next redraw. Off a terminal
// lines are written whole.
func TestProgressFitsTerminalWidth(t *testing.T) {
	events := func(p *progress, c *clock) {
		p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 1 << 20, Total: 480 << 20})
		c.t = c.t.Add(time.Second)
		p.event(api.Event{FSM: api.FSMUnpack, State: "extract-layers", Layer: 1, Bytes: 140 << 20, Files: 12345})
		p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 100 << 20, Total: 480 << 20})
		p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 2, Total: 10 << 20})
		p.finish()
	}
	const full = "layer 1   download        100.0 MiB / 480.0 MiB  20.8%  99.0 MiB/s  ETA 4s  | extracted 140.0 MiB, 12345 files"
	for _, tc := range []struct {
		cols  int
		layer string
	}{
		{80, "layer 1   download        100.0 MiB / 480.0 MiB  20.8%  99.0 MiB/s  ETA 4s"},
		{60, "layer 1   download        100.0 MiB / 480.0 MiB  20.8%"},
		{30, "layer 1   download"},
		{12, "layer 1"},
		{0, full}, // width unknown: not fitted
	} {
		p, c, out := newClockedProgress(true)
		p.cols = func() int { return tc.cols }
		events(p, c)
		last := out.String()[strings.LastIndex(out.String(), "\033[2A"):]
		lines := strings.Split(strings.TrimSuffix(last, "\n"), "\n")
		if len(lines) != 2 {
			t.Fatalf("%d columns: last frame %q: want two lines after a cursor-up by 2", tc.cols, last)
		}
		if got := strings.TrimPrefix(lines[0], "\033[2A\r\033[K"); got != tc.layer {
			t.Errorf("%d columns: layer 1 drawn as %q\nwant                         %q", tc.cols, got, tc.layer)
		}
		for _, l := range strings.Split(out.String(), "\n") {
			l = strings.TrimPrefix(strings.TrimPrefix(l, "\033[2A"), "\033[1A")
			if l = strings.TrimPrefix(l, "\r\033[K"); tc.cols > 0 && len(l) >= tc.cols {
				t.Errorf("%d columns: drew a %d-column line %q", tc.cols, len(l), l)
			}
		}
	}

	p, c, out := newClockedProgress(true)
	cols := 200
	p.cols = func() int { return cols }
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 1 << 20, Total: 480 << 20})
	cols = 20 // the terminal is resized
	c.t = c.t.Add(time.Second)
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 100 << 20, Total: 480 << 20})
	if last := out.String()[strings.LastIndex(out.String(), "\033[1A"):]; last != "\033[1A\r\033[Klayer 1   download\n" {
		t.Errorf("after a resize to 20 columns the redraw is %q", last)
	}

	p, c, out = newClockedProgress(false)
	p.cols = func() int { return 80 }
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 1 << 20, Total: 480 << 20})
	p.event(api.Event{FSM: api.FSMUnpack, State: "extract-layers", Layer: 1, Bytes: 140 << 20, Files: 12345})
	c.t = c.t.Add(plainInterval)
	p.event(api.Event{FSM: api.FSMDownload, State: "download", Layer: 1, Bytes: 201 << 20, Total: 480 << 20})
	checkPlainLines(t, out.String(), []string{
		"layer 1   download          1.0 MiB / 480.0 MiB   0.2%",
		"layer 1   download        201.0 MiB / 480.0 MiB  41.9%  40.0 MiB/s  ETA 7s  | extracted 140.0 MiB, 12345 files",
	})
}
