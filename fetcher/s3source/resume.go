package s3source

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/containerd/log"
)

// A reader pauses before it asks again for bytes whose request failed
// without a body (an error answer such as 503 SlowDown, a refused
// connection): resumePause before its first resume, doubled at each resume
// after it up to maxResumePause, each spread over [d/2, d] so that readers
// failing together do not ask again together. A body cut mid-way is
// resumed at once: the server was answering.
const (
	resumePause    = 200 * time.Millisecond
	maxResumePause = 5 * time.Second
)

// ResumeProgress is how much of a body a read must have received since
// its last failure for the next failure's resume not to be taken from the
// reader's budget (NewReader).
const ResumeProgress = 1 << 20

// pause waits before the resume-th resume (1-based) of a read whose last
// request failed without a body, or until ctx ends (its error).
func pause(ctx context.Context, resume int) error {
	d := resumePause
	for i := 1; i < resume && d < maxResumePause; i++ {
		d *= 2
	}
	d = min(d, maxResumePause)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ResumingReader reads a whole object, reopening it with a ranged GET at
// the offset reached (and If-Match on its ETag) when the body fails with a
// retryable error (after a pause when the request itself failed): up to
// maxResumes times, not counting the failures that came ResumeProgress
// bytes or more after the one before them, which moved the read on. A
// truncated body (the server ends it before the object's size) counts as
// such a failure. Errors that are not retryable, or one more failure than
// allowed, end the read with that error (see Classify). It is not safe
// for concurrent use.
type ResumingReader struct {
	ctx        context.Context
	src        *Source
	obj        Object
	maxResumes int

	// etag is what every GET of the read carries as If-Match: the listed
	// ETag, or, when the listing gave none, the one the first answer
	// carried, so that a resume never splices another version on. When
	// neither gave one, the read is not resumed past its first byte.
	etag    string
	body    *Body
	offset  int64
	resumes int
	// charged is the resumes taken from maxResumes: those after a failure
	// that came less than ResumeProgress bytes after the one before it.
	charged int
	// received is the bytes of bodies received since the last failure.
	received int64
	err      error
}

// Reader reads one whole object, in order, as one io.Reader.
type Reader interface {
	io.ReadCloser
	// Resumes is how many times a failed body was reopened (by range, at
	// the offset it had reached).
	Resumes() int
}

// Ranged reports whether NewReader reads obj as concurrent ranged GETs:
// an object larger than Config.PartSize that has an ETag, when
// Config.ConnectionsPerObject is above 1 and the server was not seen to
// answer a ranged GET with the whole object (ErrRangeIgnored).
func (s *Source) Ranged(obj Object) bool {
	return s.connections > 1 && obj.Size > s.partSize && obj.ETag != "" && !s.rangesIgnored.Load()
}

// NewReader returns a Reader of obj (from List, Stat or ResolveImage: its
// Size and ETag are what the read must match) that resumes up to
// maxResumes failed bodies per connection, besides those that failed
// after receiving ResumeProgress bytes or more since the failure before
// (their number is bounded by the object's size). An object for which
// Ranged holds is read as concurrent ranged GETs of one part each, each
// connection with that budget; any other as one stream (a
// ResumingReader). Close stops every request of the reader.
func (s *Source) NewReader(ctx context.Context, obj Object, maxResumes int) Reader {
	if s.Ranged(obj) {
		return s.newRangedReader(ctx, obj, maxResumes)
	}
	return &ResumingReader{ctx: ctx, src: s, obj: obj, maxResumes: maxResumes, etag: obj.ETag}
}

// Offset is how many bytes were read so far.
func (r *ResumingReader) Offset() int64 { return r.offset }

// Resumes is how many times the object was reopened after a failure.
func (r *ResumingReader) Resumes() int { return r.resumes }

// Read implements io.Reader over the whole object: a body that fails
// retryably or ends early is reopened at the current offset with a Range
// request (and the ETag, so a changed object is an error, not a splice),
// up to the reader's resume limit; it never reads past the listed size.
func (r *ResumingReader) Read(p []byte) (int, error) {
	for r.err == nil {
		if r.offset >= r.obj.Size {
			return 0, io.EOF
		}
		if r.body == nil {
			var opts []OpenOption
			if r.etag != "" {
				opts = append(opts, IfMatch(r.etag))
			}
			b, err := r.src.Open(r.ctx, r.obj.Key, r.offset, opts...)
			if err != nil {
				r.fail(err)
				if r.err == nil {
					if err := pause(r.ctx, r.charged); err != nil {
						r.err = fmt.Errorf("read s3://%s/%s at offset %d: waiting to resume: %w", r.src.bucket, r.obj.Key, r.offset, err)
					}
				}
				continue
			}
			if b.Size >= 0 && b.Size != r.obj.Size {
				b.Close()
				r.err = fmt.Errorf("read s3://%s/%s: size %d, listed as %d: %w", r.src.bucket, r.obj.Key, b.Size, r.obj.Size, ErrChanged)
				break
			}
			if r.etag == "" {
				r.etag = b.ETag
			}
			r.body = b
		}
		// Never read past the object's size, so a server sending more
		// cannot make us accept extra bytes.
		if rest := r.obj.Size - r.offset; int64(len(p)) > rest {
			p = p[:rest]
		}
		n, err := r.body.Read(p)
		r.offset += int64(n)
		r.received += int64(n)
		if err == io.EOF && r.offset < r.obj.Size {
			err = fmt.Errorf("body ended at %d of %d bytes: %w", r.offset, r.obj.Size, io.ErrUnexpectedEOF)
		}
		if err != nil && err != io.EOF {
			r.body.Close()
			r.body = nil
			r.fail(err)
			if n > 0 {
				return n, nil
			}
			continue
		}
		if err == io.EOF {
			r.body.Close()
			r.body = nil
		}
		if n > 0 || r.offset >= r.obj.Size {
			return n, nil
		}
	}
	return 0, r.err
}

// fail records a failure: retryable ones are resumed while allowed (one
// that came ResumeProgress bytes after the failure before it always), but
// past the object's first byte only with an ETag to hold the resume to
// the version read so far. Without one the failure ends the read as it
// is, retryable: a caller that reads the object again from its start gets
// one version whole.
func (r *ResumingReader) fail(err error) {
	if r.etag == "" && r.offset > 0 {
		r.err = fmt.Errorf("read s3://%s/%s at offset %d: not resumed, the server gave the object no ETag to hold a resume to the bytes read so far: %w", r.src.bucket, r.obj.Key, r.offset, err)
		return
	}
	free := r.received >= ResumeProgress
	if Classify(err) == KindRetryable && (free || r.charged < r.maxResumes) && r.ctx.Err() == nil {
		if !free {
			r.charged++
		}
		r.resumes++
		r.received = 0
		log.G(r.ctx).WithField("key", r.obj.Key).WithField("offset", r.offset).WithError(err).Info("s3 read failed, resuming")
		return
	}
	r.err = fmt.Errorf("read s3://%s/%s at offset %d (after %d resumes): %w", r.src.bucket, r.obj.Key, r.offset, r.resumes, err)
}

// Close releases the current body, if any.
func (r *ResumingReader) Close() error {
	if r.body != nil {
		err := r.body.Close()
		r.body = nil
		return err
	}
	return nil
}
