package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// Spacing of progress output: a terminal is redrawn at most every
// redrawInterval; plain output repeats a layer's line at most every
// plainInterval while only its byte count changes.
const (
	redrawInterval = 100 * time.Millisecond
	plainInterval  = 5 * time.Second
)

// layerProgress is what the progress display knows of one layer (0: the
// image's activation).
type layerProgress struct {
	fsm, state  string
	bytes       int64
	total       int64
	files       int
	since       time.Time // when this state started
	sinceBytes  int64     // bytes when this state started
	lastPrinted time.Time // plain output: when the line was last written
	// extracted and extractedFiles are the layer's extraction while it
	// still downloads (a layer is extracted as its bytes arrive once the
	// layer below it is in place).
	extracted      int64
	extractedFiles int
	// changed orders the layers by their last change of step (higher:
	// later), to choose what a terminal too short for all of them shows.
	changed int
}

// progress renders a pull's events: on a terminal one line per layer,
// redrawn in place; otherwise a line per layer when its state changes and
// at most every plainInterval while it only advances.
type progress struct {
	w    io.Writer
	tty  bool
	now  func() time.Time
	mu   sync.Mutex
	byID map[int]*layerProgress
	// drawn is how many lines the last redraw wrote (the terminal cursor
	// is below them).
	drawn    int
	lastDraw time.Time
	// cols is the terminal's width in columns, read at each redraw (the
	// terminal may be resized); 0 or nil: unknown, lines are not fitted.
	cols func() int
	// rows is the terminal's height, read at each redraw like cols: a
	// redraw writes fewer lines than it has, since moving the cursor up
	// stops at the top of the screen. 0 or nil: unknown.
	rows func() int
	// changes counts the changes of step, for layerProgress.changed.
	changes int
}

func newProgress(w io.Writer, tty bool) *progress {
	return &progress{w: w, tty: tty, now: time.Now, byID: map[int]*layerProgress{}}
}

// event takes one of the daemon's progress events.
func (p *progress) event(e api.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	l := p.byID[e.Layer]
	if l != nil && l.fsm == api.FSMDownload && l.state == "download" && e.FSM == api.FSMUnpack && e.State == "extract-layers" {
		// Both phases at once: the line stays the transfer's and shows
		// the extraction beside it.
		l.extracted, l.extractedFiles = e.Bytes, e.Files
		p.advanced(e.Layer, l, now)
		return
	}
	changed := l == nil || l.fsm != e.FSM || l.state != e.State
	if l == nil {
		l = &layerProgress{}
		p.byID[e.Layer] = l
	}
	if changed {
		// Another step's bytes: the last step's total is not this one's
		// until an event says so.
		l.total = 0
		l.fsm, l.state, l.since, l.sinceBytes = e.FSM, e.State, now, e.Bytes
		p.changes++
		l.changed = p.changes
	}
	l.bytes, l.files = e.Bytes, e.Files
	if e.Total > 0 {
		l.total = e.Total
	}
	if changed {
		p.show(e.Layer, l, now)
		return
	}
	p.advanced(e.Layer, l, now)
}

// show writes layer id's line now: its step changed.
func (p *progress) show(id int, l *layerProgress, now time.Time) {
	if p.tty {
		p.redraw(now)
		return
	}
	l.lastPrinted = now
	fmt.Fprintln(p.w, p.line(id, l, now))
}

// advanced writes layer id's line if it is due: its step only advanced.
func (p *progress) advanced(id int, l *layerProgress, now time.Time) {
	if p.tty {
		if now.Sub(p.lastDraw) >= redrawInterval {
			p.redraw(now)
		}
		return
	}
	if now.Sub(l.lastPrinted) >= plainInterval {
		l.lastPrinted = now
		fmt.Fprintln(p.w, p.line(id, l, now))
	}
}

// finish draws the final state on a terminal (plain output has nothing
// pending).
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && len(p.byID) > 0 {
		p.redraw(p.now())
	}
}

// redraw rewrites every layer's line in place.
func (p *progress) redraw(now time.Time) {
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\033[%dA", p.drawn)
	}
	ids := make([]int, 0, len(p.byID))
	for id := range p.byID {
		ids = append(ids, id)
	}
	// Layers in order, the image's activation (0) last.
	sort.Slice(ids, func(i, j int) bool {
		a, c := ids[i], ids[j]
		if a == 0 || c == 0 {
			return c == 0 && a != 0
		}
		return a < c
	})
	width := 0
	if p.cols != nil {
		width = p.cols()
	}
	lines := len(ids)
	if p.rows != nil {
		if room := p.rows() - 1; room > 0 && len(ids) > room {
			// Too many layers for the terminal: the ones whose step
			// changed last, under a line counting the others.
			recent := append([]int(nil), ids...)
			sort.Slice(recent, func(i, j int) bool { return p.byID[recent[i]].changed > p.byID[recent[j]].changed })
			keep := map[int]bool{}
			for _, id := range recent[:max(room-1, 1)] {
				keep[id] = true
			}
			shown := ids[:0]
			for _, id := range ids {
				if keep[id] {
					shown = append(shown, id)
				}
			}
			lines = len(shown)
			if room > 1 {
				b.WriteString("\r\033[K")
				b.WriteString(fitLine(fmt.Sprintf("(%d more layers)", len(ids)-len(shown)), width))
				b.WriteByte('\n')
				lines++
			}
			ids = shown
		}
	}
	for _, id := range ids {
		b.WriteString("\r\033[K")
		b.WriteString(fitLine(p.line(id, p.byID[id], now), width))
		b.WriteByte('\n')
	}
	p.drawn, p.lastDraw = lines, now
	io.WriteString(p.w, b.String())
}

// line renders one layer: its state, bytes of the total with percentage,
// the rate over the current state and the time left at that rate.
func (p *progress) line(id int, l *layerProgress, now time.Time) string {
	var b strings.Builder
	if id > 0 {
		fmt.Fprintf(&b, "layer %-3d ", id)
	} else {
		b.WriteString("image     ")
	}
	fmt.Fprintf(&b, "%-15s", l.state)
	if l.bytes > 0 || l.total > 0 {
		fmt.Fprintf(&b, " %9s", mib(l.bytes))
		if l.total > 0 {
			pct := 100 * float64(l.bytes) / float64(l.total)
			fmt.Fprintf(&b, " / %-9s %5.1f%%", mib(l.total), min(pct, 100))
		}
		if el := now.Sub(l.since); el >= 200*time.Millisecond && l.bytes > l.sinceBytes {
			rate := float64(l.bytes-l.sinceBytes) / el.Seconds()
			fmt.Fprintf(&b, "  %s/s", mib(int64(rate)))
			if l.total > l.bytes && rate > 0 {
				eta := time.Duration(float64(l.total-l.bytes) / rate * float64(time.Second))
				fmt.Fprintf(&b, "  ETA %s", eta.Round(time.Second))
			}
		}
	}
	if l.files > 0 {
		fmt.Fprintf(&b, "  %d files", l.files)
	}
	if l.fsm == api.FSMDownload && l.state == "download" && (l.extracted > 0 || l.extractedFiles > 0) {
		fmt.Fprintf(&b, "  | extracted %s, %d files", mib(l.extracted), l.extractedFiles)
	}
	return strings.TrimRight(b.String(), " ")
}

// fitLine cuts line to fewer than width columns, so that it takes one row
// of the terminal and moving the cursor up one row per line redraws it in
// place (a line of exactly width columns wraps on some terminals). It
// drops whole fields from the end (they are separated by two spaces: the
// rate, the ETA, the extraction), and cuts within a field only when the
// first one alone is too wide. Lines are ASCII: a byte is a column. A
// width of 0 (unknown) leaves line as it is.
func fitLine(line string, width int) string {
	if width <= 0 || len(line) < width {
		return line
	}
	limit := width - 1
	if i := strings.LastIndex(line[:min(len(line), limit+2)], "  "); i > 0 {
		return strings.TrimRight(line[:i], " ")
	}
	return line[:max(limit, 0)]
}
