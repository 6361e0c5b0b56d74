package s3source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// maxErrorBody is the most of an error answer's body that is read: S3's
// are a few hundred bytes of XML.
const maxErrorBody = 1 << 20

// MaxListPageBytes bounds the body of one listing page. S3 sends at most
// 1,000 entries a page, each a key of at most 1,024 bytes (six times that
// with every byte escaped) and a few hundred bytes of fields: a few MiB.
const MaxListPageBytes = 16 << 20

// ErrListPageTooLarge: a listing page's body is longer than
// MaxListPageBytes, or the page holds more than the 1,000 entries a
// listing asks for: more than S3 ever sends.
var ErrListPageTooLarge = errors.New("listing page is longer than S3 sends")

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

// boundListPages is a deserialize middleware that fails the read of a
// listing page's body past MaxListPageBytes: the SDK decodes a page whole
// into memory before List sees any of it, so a server sending an endless
// page (of keys that are not layers, which no layer limit counts) would
// otherwise hold the daemon's memory for as long as the request's
// deadline lets it send.
type boundListPages struct{}

// ID names the middleware in the SDK's stack.
func (boundListPages) ID() string { return "FlyioBoundListPages" }

// HandleDeserialize wraps the body of a listing's successful answer.
func (boundListPages) HandleDeserialize(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
	out, md, err := next.HandleDeserialize(ctx, in)
	if resp, ok := out.RawResponse.(*smithyhttp.Response); ok && resp.StatusCode < 300 && resp.Body != nil &&
		awsmiddleware.GetOperationName(ctx) == "ListObjectsV2" {
		resp.Body = &pageBody{ReadCloser: resp.Body, left: MaxListPageBytes}
	}
	return out, md, err
}

// pageBody is a listing page's body that fails with ErrListPageTooLarge
// once more than left bytes were read.
type pageBody struct {
	io.ReadCloser
	left int64
}

func (b *pageBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("%w: more than %d bytes", ErrListPageTooLarge, MaxListPageBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// addBoundErrorBodies puts boundErrorBodies next to the transport, below
// the operations' own deserializers, which then read the bounded body.
func addBoundErrorBodies(idle time.Duration) func(*middleware.Stack) error {
	return func(s *middleware.Stack) error {
		return s.Deserialize.Add(boundErrorBodies{idle: idle}, middleware.After)
	}
}

// addBoundListPages puts boundListPages next to the transport, below the
// listing's deserializer, which then reads the bounded body.
func addBoundListPages(s *middleware.Stack) error {
	return s.Deserialize.Add(boundListPages{}, middleware.After)
}
