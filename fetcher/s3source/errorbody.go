package s3source

import (
	"context"
	"io"
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
// The SDK sees at most maxErrorBody bytes of it, and a body that stops
// coming for idle is cut (idleBody, as an object's); the call then fails
// with the answer's status, as any error answer does.
type boundErrorBodies struct{ idle time.Duration }

// ID names the middleware in the SDK's stack.
func (boundErrorBodies) ID() string { return "FlyioBoundErrorBodies" }

// HandleDeserialize wraps the raw answer's body when its status is an
// error, on its way back from the transport to the SDK's deserializers.
func (m boundErrorBodies) HandleDeserialize(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
	out, md, err := next.HandleDeserialize(ctx, in)
	if resp, ok := out.RawResponse.(*smithyhttp.Response); ok && resp.StatusCode >= 300 && resp.Body != nil {
		raw := resp.Body
		var body io.ReadCloser = raw
		if m.idle > 0 {
			// Closing the body ends a Read blocked on it.
			body = &idleBody{rc: raw, cancel: func() { raw.Close() }, d: m.idle, what: "read an error answer's body"}
		}
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(body, maxErrorBody), body}
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
