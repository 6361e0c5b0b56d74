package s3source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/containerd/log"
)

// errReaderClosed ends a Read after Close.
var errReaderClosed = errors.New("s3 object reader is closed")

// rangedReader reads an object as consecutive parts of the source's part
// size, each fetched by its own GET ("Range: bytes=start-end") carrying
// If-Match with the listed ETag, so every byte handed out belongs to the
// version that was listed. Read hands the parts out strictly in order, and
// the part it is on as its bytes arrive, so the caller's work (hashing,
// writing) overlaps the transfer.
//
// Worker w of n fetches parts w, w+n, w+2n... into one buffer of its own,
// and starts the next only once Read has handed the previous one out in
// full: at most n parts are buffered, and a slow caller slows the
// requests instead of growing memory. A part whose body fails retryably or
// ends short is reopened at the byte it reached, taking from its worker's
// resume budget unless ResumeProgress bytes came since the part's failure
// before; one whose request failed, after a pause (see pause) that grows
// with the worker's resumes. Each worker has the budget and the pauses a
// single stream has: S3 refusing requests for a while (503 SlowDown)
// refuses the concurrent parts together, and a budget they shared would
// run out n times sooner than a single stream's, ending a read that is
// otherwise riding the refusals out. Read and Close are not safe for
// concurrent use.
type rangedReader struct {
	parent     context.Context
	src        *Source
	obj        Object
	maxResumes int
	parts      int // how many parts obj has

	resumes atomic.Int64 // every worker's resumes

	ctx     context.Context // canceled by Close or by the first failure
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	workers []*partWorker

	next   int   // the part Read hands out
	pos    int64 // bytes of part next handed out
	offset int64 // bytes handed out in all
	closed bool  // Close was called
	err    error // the read's end, once known
	// stream reads the rest of the object once the server was seen to
	// answer a part with the whole object (ErrRangeIgnored).
	stream *ResumingReader
}

// partWorker is one connection's buffer and its hand-off with Read. Only
// the worker writes the buffer, only below filled's new value before
// storing it; Read reads below filled. A part is complete when filled is
// its length.
type partWorker struct {
	buf      *[]byte
	filled   atomic.Int64  // bytes of the current part in buf
	progress chan struct{} // filled grew (a wake-up; may be stale)
	failed   chan error    // the worker's last word: its part failed
	free     chan struct{} // Read has handed out all of buf
	// charged is the worker's resumes taken from the reader's
	// maxResumes (see ResumeProgress); only the worker touches it while
	// it runs.
	charged int
}

func (s *Source) newRangedReader(ctx context.Context, obj Object, maxResumes int) *rangedReader {
	return &rangedReader{parent: ctx, src: s, obj: obj, maxResumes: maxResumes,
		parts: int((obj.Size + s.partSize - 1) / s.partSize)}
}

// Resumes is how many part bodies were reopened after a failure, and
// bodies of the stream the read went on with, if any.
func (r *rangedReader) Resumes() int {
	n := int(r.resumes.Load())
	if r.stream != nil {
		n += r.stream.Resumes()
	}
	return n
}

// partBuf returns a buffer of the source's part size, reused if one is
// free.
func (s *Source) partBuf() *[]byte {
	if b, ok := s.parts.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, s.partSize)
	return &b
}

// partLen is the length of part i (the last one may be short).
func (r *rangedReader) partLen(i int) int64 {
	return min(r.src.partSize, r.obj.Size-int64(i)*r.src.partSize)
}

// start launches the workers; the first Read does, so that a reader never
// read costs no request.
func (r *rangedReader) start() {
	r.ctx, r.cancel = context.WithCancel(r.parent)
	n := min(r.src.connections, r.parts)
	r.workers = make([]*partWorker, n)
	for i := range n {
		w := &partWorker{buf: r.src.partBuf(), progress: make(chan struct{}, 1), failed: make(chan error, 1), free: make(chan struct{}, 1)}
		r.workers[i] = w
		r.wg.Add(1)
		go r.run(w, i)
	}
}

// run fetches parts first, first+n, ... into w's buffer, each once Read
// is done with the one before, until the last, a failure or the end of the
// reader's context.
func (r *rangedReader) run(w *partWorker, first int) {
	defer r.wg.Done()
	for part := first; part < r.parts; part += len(r.workers) {
		if part != first {
			select {
			case <-w.free:
			case <-r.ctx.Done():
				return
			}
		}
		if err := r.fetch(w, part); err != nil {
			w.failed <- err // room for it: it is the only one
			return
		}
	}
}

// openPart requests part from skip bytes into it to its end, with
// If-Match on the listed ETag.
func (r *rangedReader) openPart(part int, skip int64) (*Body, error) {
	at := int64(part)*r.src.partSize + skip
	b, err := r.src.open(r.ctx, r.obj.Key, at, r.partLen(part)-skip, IfMatch(r.obj.ETag))
	if err != nil {
		return nil, err
	}
	if b.Size >= 0 && b.Size != r.obj.Size {
		b.Close()
		return nil, fmt.Errorf("read s3://%s/%s part %d: size %d, listed as %d: %w", r.src.bucket, r.obj.Key, part, b.Size, r.obj.Size, ErrChanged)
	}
	return b, nil
}

// fetch fills w's buffer with part, publishing each read in w.filled,
// and reopens the range from the byte reached while the resume budget
// lasts.
func (r *rangedReader) fetch(w *partWorker, part int) error {
	buf := (*w.buf)[:r.partLen(part)]
	start := int64(part) * r.src.partSize
	filled := 0
	received := 0 // since the part's last failure
	for {
		body, err := r.openPart(part, int64(filled))
		opened := err == nil
		if opened {
			for err == nil && filled < len(buf) {
				var n int
				n, err = body.Read(buf[filled:])
				if n > 0 {
					filled += n
					received += n
					w.filled.Store(int64(filled))
					select {
					case w.progress <- struct{}{}:
					default:
					}
				}
			}
			body.Close()
			if filled == len(buf) {
				return nil
			}
			if err == nil || err == io.EOF {
				err = fmt.Errorf("part body ended at byte %d of %d: %w", filled, len(buf), io.ErrUnexpectedEOF)
			}
		}
		free := received >= ResumeProgress
		received = 0
		if !r.resume(w, err, part, start+int64(filled), free) {
			return fmt.Errorf("read s3://%s/%s part %d (bytes %d-%d) at offset %d (after %d resumes): %w",
				r.src.bucket, r.obj.Key, part, start, start+int64(len(buf))-1, start+int64(filled), r.resumes.Load(), err)
		}
		if !opened {
			if err := pause(r.ctx, w.charged); err != nil {
				return fmt.Errorf("read s3://%s/%s part %d: waiting to resume: %w", r.src.bucket, r.obj.Key, part, err)
			}
		}
	}
}

// resume takes one resume from w's budget for a retryable failure, none
// for one that is free (it came ResumeProgress bytes after the part's
// failure before it), and says whether the part may be reopened.
func (r *rangedReader) resume(w *partWorker, err error, part int, offset int64, free bool) bool {
	if Classify(err) != KindRetryable || errors.Is(err, ErrRangeIgnored) || r.ctx.Err() != nil {
		return false
	}
	if !free {
		if w.charged >= r.maxResumes {
			return false
		}
		w.charged++
	}
	r.resumes.Add(1)
	log.G(r.ctx).WithField("key", r.obj.Key).WithField("part", part).WithField("offset", offset).WithError(err).Info("s3 part read failed, resuming")
	return true
}

// Read implements io.Reader over the whole object, part after part, never
// past the listed size.
func (r *rangedReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.closed {
		return 0, fmt.Errorf("read s3://%s/%s: %w", r.src.bucket, r.obj.Key, errReaderClosed)
	}
	if r.stream != nil {
		return r.stream.Read(p)
	}
	if r.ctx == nil {
		r.start()
	}
	for r.next < r.parts {
		w := r.workers[r.next%len(r.workers)]
		if filled := w.filled.Load(); r.pos < filled {
			n := copy(p, (*w.buf)[r.pos:filled])
			r.pos += int64(n)
			r.offset += int64(n)
			r.release(w)
			return n, nil
		}
		if r.release(w) {
			continue
		}
		select {
		case <-w.progress:
		case err := <-w.failed:
			if errors.Is(err, ErrRangeIgnored) {
				r.toStream()
				return r.stream.Read(p)
			}
			return 0, r.fail(err)
		case <-r.ctx.Done():
			return 0, r.fail(fmt.Errorf("read s3://%s/%s at offset %d: %w", r.src.bucket, r.obj.Key, r.offset, r.ctx.Err()))
		}
	}
	return 0, io.EOF
}

// release moves Read on to the next part once the current one is handed
// out in full, giving w its buffer back for its next part (free has room
// for this one signal even if the worker is gone), and says whether it
// did.
func (r *rangedReader) release(w *partWorker) bool {
	if r.pos < r.partLen(r.next) {
		return false
	}
	w.filled.Store(0)
	w.free <- struct{}{}
	r.next++
	r.pos = 0
	return true
}

// toStream stops the workers and goes on reading the object as one stream
// from the bytes handed out so far, with the resumes the worker charged
// the most left: the server answers parts with the whole object, which a
// stream reads once.
func (r *rangedReader) toStream() {
	workers := r.workers
	r.stop() // the workers are done with charged
	charged := 0
	for _, w := range workers {
		charged = max(charged, w.charged)
	}
	log.G(r.parent).WithField("key", r.obj.Key).WithField("offset", r.offset).Info("s3 ranged read goes on as one stream")
	r.stream = &ResumingReader{ctx: r.parent, src: r.src, obj: r.obj, maxResumes: max(r.maxResumes-charged, 0),
		etag: r.obj.ETag, offset: r.offset}
}

// stop cancels the workers' requests, waits for them and gives their
// buffers back.
func (r *rangedReader) stop() {
	r.cancel()
	r.wg.Wait()
	for _, w := range r.workers {
		r.src.parts.Put(w.buf)
	}
	r.workers = nil
}

// fail ends the read with err and stops the requests still running.
func (r *rangedReader) fail(err error) error {
	r.err = err
	r.cancel()
	return err
}

// Close stops every request of the reader and waits for its workers, so
// none is left running and the part buffers can be reused.
func (r *rangedReader) Close() error {
	r.closed = true
	if r.ctx == nil {
		return nil
	}
	r.stop()
	if r.stream != nil {
		r.stream.Close()
	}
	if r.err == nil {
		r.err = fmt.Errorf("read s3://%s/%s: %w", r.src.bucket, r.obj.Key, errReaderClosed)
	}
	return nil
}
