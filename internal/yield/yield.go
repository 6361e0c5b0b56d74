// Package yield lets a goroutine that spends long stretches on CPU work
// over a stream (hashing, inflating) hand its processor to the other
// runnable goroutines between slices of that work, instead of being
// preempted in the middle of one.
//
// Go preempts a goroutine that has run 10 ms without rescheduling by
// sending its thread a signal. On hardware a pull's stages hand their
// buffers along long before that, so the signal is rare. Where the CPU is
// slow (under emulation, SHA-256 takes 18 ms over one 256 KiB buffer)
// every stage of a pull runs into it, and the signals cost a tenth of the
// pull's CPU (docs/benchmarks.md). A runtime.Gosched between slices does
// the same rescheduling without a signal; per slice it costs far less
// than the work on the slice, on hardware and under emulation alike.
package yield

import (
	"io"
	"runtime"
)

// Slice is how many bytes of work go between two yields: under emulation
// about 5 ms of SHA-256 or of inflating, half the runtime's preemption
// interval; on hardware tens of microseconds.
const Slice = 64 << 10

// Counter yields the processor each time Slice bytes of work have been
// counted since the last yield. The zero value is ready to use; a Counter
// belongs to one goroutine.
type Counter struct{ n int }

// Add counts n bytes of work just done, and yields if they complete a
// slice.
func (c *Counter) Add(n int) {
	c.n += n
	if c.n >= Slice {
		c.n = 0
		runtime.Gosched()
	}
}

// Writer passes every Write on to w in pieces of at most Slice bytes,
// yielding the processor between them. It writes what w writes and
// returns w's first error; it adds no buffering and no error of its own.
func Writer(w io.Writer) io.Writer { return &writer{w: w} }

type writer struct {
	w io.Writer
	c Counter
}

func (y *writer) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		piece := p[done:min(len(p), done+Slice)]
		n, err := y.w.Write(piece)
		done += n
		if err != nil {
			return done, err
		}
		if n < len(piece) {
			return done, io.ErrShortWrite
		}
		y.c.Add(n)
	}
	return done, nil
}
