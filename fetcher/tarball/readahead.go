package tarball

import (
	"errors"
	"io"
	"sync"
)

// A layer's tar stream costs three kinds of work per byte: decompressing
// it, hashing it (the diff ID) and parsing and writing its entries. Done
// on one goroutine they add up; readahead gives the first two goroutines
// of their own, so a pull's extraction runs at the speed of the slowest
// of the three instead of their sum. Under the VM's emulation SHA-256
// alone costs as much as the rest (docs/benchmarks.md).
//
// The stages hand fixed buffers along channels: at most readaheadBuffers
// buffers of readaheadChunk bytes are ever allocated, so a consumer that
// stops reading (a rejected layer) holds the stages back, and a stream
// read ahead past what the limits admit costs that much memory and no
// more.
const (
	readaheadChunk   = 256 << 10
	readaheadBuffers = 4
)

// readaheadEnabled lets the benchmark measure the same extraction on one
// goroutine, as the anchor of the stages' gain.
var readaheadEnabled = true

// errReadaheadClosed is returned by a Read after close.
var errReadaheadClosed = errors.New("tar stream reader closed")

type chunk struct {
	b   []byte
	err error // after b: io.EOF at the stream's end, or the read's failure
}

// readahead reads r (and writes what it read to sink, unless nil: the
// diff ID's hash, and a copy of the tar stream when asked) on goroutines
// of their own. Read hands the bytes over in order, then r's
// error; it must be called from one goroutine. done, unless nil, runs once
// r is read for the last time, before its final error is handed over.
type readahead struct {
	out  chan chunk
	free chan []byte
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
	cur  chunk
	off  int
}

func newReadahead(r io.Reader, sink io.Writer, done func()) *readahead {
	ra := &readahead{out: make(chan chunk, readaheadBuffers), free: make(chan []byte, readaheadBuffers), stop: make(chan struct{})}
	for range readaheadBuffers {
		ra.free <- make([]byte, readaheadChunk)
	}
	filled := ra.out
	if sink != nil {
		filled = make(chan chunk, readaheadBuffers)
		ra.wg.Add(1)
		go ra.sink(sink, filled)
	}
	ra.wg.Add(1)
	go ra.fill(r, filled, done)
	return ra
}

// stopped reports whether close was called.
func (ra *readahead) stopped() bool {
	select {
	case <-ra.stop:
		return true
	default:
		return false
	}
}

// fill reads r into free buffers and sends them on to. It fills a buffer
// to at least half with as many reads as that takes, looking for close
// between them, so that close waits for one read of the source at most.
func (ra *readahead) fill(r io.Reader, to chan<- chunk, done func()) {
	defer ra.wg.Done()
	defer close(to)
	var finish sync.Once
	end := func() {
		if done != nil {
			finish.Do(done)
		}
	}
	defer end()
	for {
		var b []byte
		select {
		case b = <-ra.free:
		case <-ra.stop:
			return
		}
		n, err := 0, error(nil)
		for n < len(b)/2 && err == nil && !ra.stopped() {
			var m int
			m, err = r.Read(b[n:])
			n += m
		}
		if err == nil && n < len(b)/2 {
			return // stopped
		}
		if err != nil {
			end() // before the reader can see the end and read the source itself
		}
		select {
		case to <- chunk{b: b[:n], err: err}:
		case <-ra.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// sink writes every chunk to w before passing it on, so that w has had
// the whole stream once the reader has met its end. w's errors are not
// looked at: a hash never fails, and a tee stops itself (teeWriter).
func (ra *readahead) sink(w io.Writer, from <-chan chunk) {
	defer ra.wg.Done()
	defer close(ra.out)
	for c := range from {
		w.Write(c.b)
		select {
		case ra.out <- c:
		case <-ra.stop:
			return
		}
	}
}

// Read implements io.Reader.
func (ra *readahead) Read(p []byte) (int, error) {
	for ra.off == len(ra.cur.b) {
		if ra.cur.err != nil {
			return 0, ra.cur.err
		}
		if ra.cur.b != nil {
			ra.free <- ra.cur.b[:cap(ra.cur.b)]
		}
		c, ok := <-ra.out
		if !ok {
			ra.cur = chunk{err: errReadaheadClosed}
			return 0, ra.cur.err
		}
		ra.cur, ra.off = c, 0
	}
	n := copy(p, ra.cur.b[ra.off:])
	ra.off += n
	return n, nil
}

// close stops the stages and waits for them: once it returns, the source
// is not read again, and the decompressor is closed. A stage in the middle
// of a read of the source stops when that read returns.
func (ra *readahead) close() {
	ra.once.Do(func() { close(ra.stop) })
	ra.wg.Wait()
}
