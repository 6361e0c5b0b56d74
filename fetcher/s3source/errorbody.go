package s3source

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// maxErrorBody is the most of an error answer's body that is read: S3's
// are a few hundred bytes of XML.
const maxErrorBody = 1 << 20

// boundErrorBodies is a deserialize middleware that bounds the body of an
// answer whose status is not a success before the SDK reads it: the SDK
// reads an error body whole before the call returns, which is outside the
// idle deadline Open puts on an object's body and outside any size limit.
// A body past maxErrorBody fails the read, and one that stops coming for
// idle is cut; the call then fails with the answer's status, as any error
// answer does.
type boundErrorBodies struct{ idle time.Duration }

// ID names the middleware in the SDK's stack.
func (boundErrorBodies) ID() string { return "FlyioBoundErrorBodies" }

// HandleDeserialize wraps the raw answer's body when its status is an
// error, on its way back from the transport to the SDK's deserializers.
func (m boundErrorBodies) HandleDeserialize(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
	out, md, err := next.HandleDeserialize(ctx, in)
	if resp, ok := out.RawResponse.(*smithyhttp.Response); ok && resp.StatusCode >= 300 && resp.Body != nil {
		resp.Body = &errorBody{rc: resp.Body, idle: m.idle, left: maxErrorBody}
	}
	return out, md, err
}

// addBoundErrorBodies puts boundErrorBodies next to the transport, below
// the operations' own deserializers, which then read the bounded body.
func addBoundErrorBodies(idle time.Duration) func(*middleware.Stack) error {
	return func(s *middleware.Stack) error {
		return s.Deserialize.Add(boundErrorBodies{idle: idle}, middleware.After)
	}
}

// errorBody reads at most left bytes of rc, each Read within idle (past
// it, rc is closed, which ends the blocked Read).
type errorBody struct {
	rc   io.ReadCloser
	idle time.Duration
	left int64

	once sync.Once
}

func (b *errorBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("error answer's body longer than %d bytes: not read further", maxErrorBody)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	var stalled atomic.Bool
	if b.idle > 0 {
		t := time.AfterFunc(b.idle, func() { stalled.Store(true); b.Close() })
		defer t.Stop()
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	if err != nil && err != io.EOF && stalled.Load() {
		err = fmt.Errorf("error answer's body: no data for %v: %w (%w)", b.idle, ErrTimeout, err)
	}
	return n, err
}

func (b *errorBody) Close() error {
	var err error
	b.once.Do(func() { err = b.rc.Close() })
	return err
}
