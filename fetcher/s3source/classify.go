package s3source

import (
	"context"
	"errors"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Kind is what a caller should do about an S3 error.
type Kind int

const (
	// KindNone: no error.
	KindNone Kind = iota
	// KindRetryable: throttling, a 5xx, a timeout, a connection refused,
	// reset or cut mid-body, temporary credentials that expired on the
	// way: try again (the transition's backoff).
	KindRetryable
	// KindNotFound: no such key, bucket or layer: abort the pipeline.
	KindNotFound
	// KindAccessDenied: 401/403 or no usable credentials (CredentialsError,
	// unless a credential service answered 429 or 5xx): abort.
	KindAccessDenied
	// KindChanged: the object changed between two ranged reads (412 on
	// If-Match): start the download over.
	KindChanged
	// KindInvalid: a bad key, a request S3 refuses as malformed (other
	// 4xx) or redirects for good (301: a bucket in another region), or
	// an answer that breaks S3's rules (a listing that never ends, an
	// ETag that cannot tie a read to its version): abort.
	KindInvalid
	// KindCanceled: the caller's context was canceled.
	KindCanceled
)

// String names the kind for logs and error messages.
func (k Kind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindRetryable:
		return "retryable"
	case KindNotFound:
		return "not-found"
	case KindAccessDenied:
		return "access-denied"
	case KindChanged:
		return "changed"
	case KindInvalid:
		return "invalid"
	case KindCanceled:
		return "canceled"
	}
	return "unknown"
}

// Classify tells what err (from this package, the SDK, or reading a Body)
// means for the caller. Unknown transport errors count as retryable.
func Classify(err error) Kind {
	if err == nil {
		return KindNone
	}
	var ke *KeyError
	if errors.As(err, &ke) {
		return KindInvalid
	}
	if errors.Is(err, ErrChanged) {
		return KindChanged
	}
	if errors.Is(err, ErrNoLayers) {
		return KindNotFound
	}
	if errors.Is(err, ErrListLoop) || errors.Is(err, ErrListTooLong) || errors.Is(err, ErrListTokenTooLong) || errors.Is(err, ErrTooManyLayers) ||
		errors.Is(err, ErrWeakETag) || errors.Is(err, ErrETagControl) || errors.Is(err, ErrNoETag) || errors.Is(err, ErrNoContentRange) || errors.Is(err, ErrBadContentRange) ||
		errors.Is(err, ErrListPageTooLarge) {
		return KindInvalid
	}
	if errors.Is(err, ErrTimeout) {
		return KindRetryable
	}
	if errors.Is(err, context.Canceled) {
		return KindCanceled
	}
	var ce *CredentialsError
	if errors.As(err, &ce) {
		// The chain found no credentials: asking again finds none either.
		// Its own retries (three of the metadata service) are done, and a
		// refused connection or a timeout there means a host without one.
		// Only a credential service that is overloaded or failing (429,
		// 5xx: STS, the metadata service throttling) is worth a retry.
		var re *smithyhttp.ResponseError
		if errors.As(ce.Err, &re) && (re.HTTPStatusCode() == 429 || re.HTTPStatusCode() >= 500) {
			return KindRetryable
		}
		return KindAccessDenied
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return KindRetryable
	}
	var se *v4.SigningError
	if errors.As(err, &se) {
		return KindAccessDenied // no usable credentials
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NoSuchBucket", "NotFound":
			return KindNotFound
		case "AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
			"AllAccessDisabled", "AccountProblem", "InvalidToken":
			return KindAccessDenied
		case "ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired":
			// Temporary credentials that expired between signing and
			// S3's check: the SDK's credential cache fetches new ones once
			// its own clock has them expired, so asking again succeeds.
			return KindRetryable
		case "PreconditionFailed":
			return KindChanged
		case "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
			"RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "RequestLimitExceeded":
			return KindRetryable
		}
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		switch code := re.HTTPStatusCode(); {
		case code == 404:
			return KindNotFound
		case code == 401 || code == 403:
			return KindAccessDenied
		case code == 412:
			return KindChanged
		case code == 301:
			// PermanentRedirect: the bucket is in another region than
			// s3.region, or not behind s3.endpoint; the same request is
			// redirected every time.
			return KindInvalid
		case code == 408 || code == 429 || code >= 500:
			return KindRetryable
		case code >= 400:
			return KindInvalid
		}
	}
	// Transport failures (refused, reset, cut mid-body, truncated body,
	// DNS) and anything else unrecognised: worth another attempt.
	return KindRetryable
}

// IsNotFound reports whether err means the key, prefix or bucket does not exist.
func IsNotFound(err error) bool { return Classify(err) == KindNotFound }

// IsAccessDenied reports whether err means we may not read it.
func IsAccessDenied(err error) bool { return Classify(err) == KindAccessDenied }

// IsRetryable reports whether trying again may succeed.
func IsRetryable(err error) bool { return Classify(err) == KindRetryable }
