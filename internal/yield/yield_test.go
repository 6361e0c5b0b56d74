package yield

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
)

// recorder keeps what it is given, and the size of each Write.
type recorder struct {
	bytes.Buffer
	sizes []int
	onto  func()
}

func (r *recorder) Write(p []byte) (int, error) {
	r.sizes = append(r.sizes, len(p))
	if r.onto != nil {
		r.onto()
	}
	return r.Buffer.Write(p)
}

func TestWriterPassesEveryByteInSlices(t *testing.T) {
	p := make([]byte, 3*Slice+123)
	for i := range p {
		p[i] = byte(i * 31)
	}
	var r recorder
	w := Writer(&r)
	n, err := w.Write(p)
	if err != nil || n != len(p) {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(p))
	}
	if !bytes.Equal(r.Bytes(), p) {
		t.Fatal("the bytes written differ from those given")
	}
	want := []int{Slice, Slice, Slice, 123}
	if len(r.sizes) != len(want) {
		t.Fatalf("writes of %v bytes, want %v", r.sizes, want)
	}
	for i := range want {
		if r.sizes[i] != want[i] {
			t.Fatalf("writes of %v bytes, want %v", r.sizes, want)
		}
	}
}

// failAfter accepts limit bytes, then fails.
type failAfter struct{ limit int }

var errFull = errors.New("full")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.limit {
		n := f.limit
		f.limit = 0
		return n, errFull
	}
	f.limit -= len(p)
	return len(p), nil
}

func TestWriterReturnsTheFirstError(t *testing.T) {
	w := Writer(&failAfter{limit: Slice + 10})
	n, err := w.Write(make([]byte, 3*Slice))
	if !errors.Is(err, errFull) || n != Slice+10 {
		t.Fatalf("Write = %d, %v; want %d, %v", n, err, Slice+10, errFull)
	}
}

type short struct{}

func (short) Write(p []byte) (int, error) { return len(p) / 2, nil }

func TestWriterShortWrite(t *testing.T) {
	if n, err := Writer(short{}).Write(make([]byte, 100)); !errors.Is(err, io.ErrShortWrite) || n != 50 {
		t.Fatalf("Write = %d, %v; want 50, %v", n, err, io.ErrShortWrite)
	}
}

// otherGoroutine runs, on the test's one processor, a goroutine that
// counts its turns, and returns how many it has had.
func otherGoroutine(t *testing.T) func() int64 {
	prev := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	var ticks atomic.Int64
	stop, started := make(chan struct{}), make(chan struct{})
	go func() {
		close(started)
		for {
			select {
			case <-stop:
				return
			default:
				ticks.Add(1)
				runtime.Gosched()
			}
		}
	}()
	t.Cleanup(func() { close(stop) })
	<-started
	return ticks.Load
}

// With one processor, another runnable goroutine gets to run between the
// slices of one Write: the Write yields. Without the yield, the whole
// Write takes microseconds, far below the runtime's preemption interval,
// and the other goroutine would not run until it returned.
func TestWriterLetsOthersRunBetweenSlices(t *testing.T) {
	ticks := otherGoroutine(t)
	var seen []int64
	r := &recorder{onto: func() { seen = append(seen, ticks()) }}
	if _, err := Writer(r).Write(make([]byte, 4*Slice)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] == seen[i-1] {
			t.Fatalf("no other goroutine ran between slices %d and %d (ticks seen %v)", i-1, i, seen)
		}
	}
}

func TestCounterYieldsOncePerSlice(t *testing.T) {
	ticks := otherGoroutine(t)
	var c Counter
	before := ticks()
	c.Add(Slice - 1)
	if got := ticks(); got != before {
		t.Fatalf("the other goroutine ran before a whole slice was counted (%d ticks)", got-before)
	}
	c.Add(1)
	if got := ticks(); got == before {
		t.Fatal("no yield once a whole slice was counted")
	}
}
