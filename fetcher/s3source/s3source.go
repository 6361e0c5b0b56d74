// Package s3source reads S3 images: tarball objects in a bucket of AWS S3 or
// of an S3-compatible server, through aws-sdk-go-v2.
//
// An image is either one key ending in ".tar" (one layer) or a prefix whose
// ".tar" objects directly under it are its layers, in key order (byte order
// of the keys, as S3 lists them: name layers 01.tar, 02.tar, ... so that
// order is the intended one).
//
// Retries: the SDK's own retryer is limited to one attempt by default
// (Config.MaxAttempts), so every failure surfaces at once with its Kind
// (Classify) and the state machine that called us owns the retry policy of
// its transition (backoff, attempt count, timeout). Nesting the SDK's three
// attempts inside the transition's five would multiply latency on a dead
// server and hide how many requests were made. A body that fails half-way is
// resumed by the caller with Open at the offset reached.
package s3source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
	"github.com/containerd/log"
)

// Config says where the images are and how to authenticate.
type Config struct {
	Bucket string
	// Region of the bucket; empty means the SDK's default chain (AWS_REGION,
	// shared config), and "us-east-1" if that names none.
	Region string
	// Endpoint overrides the S3 endpoint (an S3-compatible server such as
	// MinIO: "http://127.0.0.1:9000"); empty means AWS.
	Endpoint string
	// PathStyle addresses buckets as endpoint/bucket/key instead of
	// bucket.endpoint/key; most S3-compatible servers need it.
	PathStyle bool
	// Anonymous sends unsigned requests (public buckets); otherwise
	// credentials come from the SDK's default chain (environment, shared
	// files, SSO, web identity, ECS/EC2 roles).
	Anonymous bool
	// MaxAttempts is the SDK's attempts per request; 0 means 1 (the caller
	// retries; see the package documentation).
	MaxAttempts int
	// HTTPClient, if set, is used for every request (tests, proxies).
	HTTPClient *http.Client
	// APIOptions are added to the S3 client's middleware stack (the
	// daemon's request counters).
	APIOptions []func(*middleware.Stack) error
}

// Object is one tarball object of the bucket.
type Object struct {
	Key          string
	Size         int64
	ETag         string // as S3 returns it, quotes included
	LastModified time.Time
}

// Source reads one bucket.
type Source struct {
	client *s3.Client
	bucket string
}

// New makes a Source; it does not contact S3 (credentials are resolved on
// the first request).
func New(ctx context.Context, cfg Config) (*Source, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("s3 source: bucket is required")
	}
	opts := []func(*config.LoadOptions) error{}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.Anonymous {
		opts = append(opts, config.WithCredentialsProvider(aws.AnonymousCredentials{}))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, config.WithHTTPClient(cfg.HTTPClient))
	}
	attempts := cfg.MaxAttempts
	if attempts <= 0 {
		attempts = 1
	}
	opts = append(opts, config.WithRetryMaxAttempts(attempts))
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3 source for bucket %q: load AWS config: %w", cfg.Bucket, err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		o.APIOptions = append(o.APIOptions, cfg.APIOptions...)
		// Checksums only where S3 requires them: S3-compatible servers
		// often lack the newer checksum headers, and the pipeline computes
		// its own SHA-256 of every byte.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	return &Source{client: client, bucket: cfg.Bucket}, nil
}

// Bucket is the bucket this source reads.
func (s *Source) Bucket() string { return s.bucket }

// Key rules checked by ValidateKey.
var (
	ErrKeyEmpty     = errors.New("empty key")
	ErrKeyTooLong   = errors.New("key longer than 1024 bytes")
	ErrKeyAbsolute  = errors.New("key starts with /")
	ErrKeyTraversal = errors.New(`key has a ".." segment`)
	ErrKeyNUL       = errors.New("key contains a NUL byte")
	ErrKeyUTF8      = errors.New("key is not valid UTF-8")
)

// MaxKeyLen is S3's limit on a key, in bytes.
const MaxKeyLen = 1024

// KeyError names a key and the rule it breaks.
type KeyError struct {
	Key  string
	Rule error
}

// Error names the key and the rule it broke.
func (e *KeyError) Error() string { return fmt.Sprintf("s3 key %q: %v", e.Key, e.Rule) }

// Unwrap returns the rule.
func (e *KeyError) Unwrap() error { return e.Rule }

// ValidateKey checks a key or prefix before any request: not empty, at most
// 1024 bytes, valid UTF-8, no NUL, no leading "/", no ".." segment.
func ValidateKey(key string) error {
	var rule error
	switch {
	case key == "":
		rule = ErrKeyEmpty
	case len(key) > MaxKeyLen:
		rule = ErrKeyTooLong
	case !utf8.ValidString(key):
		rule = ErrKeyUTF8
	case strings.IndexByte(key, 0) >= 0:
		rule = ErrKeyNUL
	case strings.HasPrefix(key, "/"):
		rule = ErrKeyAbsolute
	default:
		for seg := range strings.SplitSeq(key, "/") {
			if seg == ".." {
				rule = ErrKeyTraversal
				break
			}
		}
	}
	if rule != nil {
		// A key too long to print usefully is shortened in the message.
		shown := key
		if len(shown) > 200 {
			shown = shown[:200] + "..."
		}
		return &KeyError{Key: shown, Rule: rule}
	}
	return nil
}

// List returns the ".tar" objects directly under prefix (no deeper "/"), in
// key order. An empty prefix lists the bucket's top level.
func (s *Source) List(ctx context.Context, prefix string) ([]Object, error) {
	if prefix != "" {
		if err := ValidateKey(prefix); err != nil {
			return nil, err
		}
	}
	in := &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Delimiter: aws.String("/")}
	if prefix != "" {
		in.Prefix = aws.String(prefix)
	}
	var out []Object
	p := s3.NewListObjectsV2Paginator(s.client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list s3://%s/%s: %w", s.bucket, prefix, err)
		}
		for _, o := range page.Contents {
			k := aws.ToString(o.Key)
			if !strings.HasSuffix(k, ".tar") {
				continue
			}
			out = append(out, Object{Key: k, Size: aws.ToInt64(o.Size), ETag: aws.ToString(o.ETag), LastModified: aws.ToTime(o.LastModified)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	log.G(ctx).WithField("bucket", s.bucket).WithField("prefix", prefix).WithField("objects", len(out)).Debug("s3 list")
	return out, nil
}

// Stat returns one object's size and ETag (a HEAD request).
func (s *Source) Stat(ctx context.Context, key string) (Object, error) {
	if err := ValidateKey(key); err != nil {
		return Object{}, err
	}
	h, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		return Object{}, fmt.Errorf("stat s3://%s/%s: %w", s.bucket, key, err)
	}
	return Object{Key: key, Size: aws.ToInt64(h.ContentLength), ETag: aws.ToString(h.ETag), LastModified: aws.ToTime(h.LastModified)}, nil
}

// ErrNoLayers is returned (wrapped, and classified KindNotFound) by
// ResolveImage for a prefix with no ".tar" object under it.
var ErrNoLayers = errors.New("no .tar objects under the prefix")

// ResolveImage turns what a user names into the image's layers: a key
// ending in ".tar" is one object (stat'ed); anything else is a prefix
// ("/" appended if missing) whose ".tar" objects directly under it are the
// layers, in key order.
func (s *Source) ResolveImage(ctx context.Context, keyOrPrefix string) ([]Object, error) {
	if err := ValidateKey(keyOrPrefix); err != nil {
		return nil, err
	}
	if strings.HasSuffix(keyOrPrefix, ".tar") {
		o, err := s.Stat(ctx, keyOrPrefix)
		if err != nil {
			return nil, err
		}
		return []Object{o}, nil
	}
	prefix := keyOrPrefix
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	objs, err := s.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("resolve s3://%s/%s: %w", s.bucket, prefix, ErrNoLayers)
	}
	return objs, nil
}

// Body is the content of an object from some offset on.
type Body struct {
	io.ReadCloser
	Offset int64  // where this body starts in the object
	Size   int64  // the whole object's size
	ETag   string // the object's ETag
}

// OpenOption tunes Open.
type OpenOption func(*s3.GetObjectInput)

// IfMatch makes Open fail with ErrChanged (KindChanged) if the object's ETag
// is no longer etag: a resumed download must not splice two versions of an
// object. S3 enforces it (412); the ETag of the answer is checked here too,
// for S3-compatible servers that ignore If-Match.
func IfMatch(etag string) OpenOption {
	return func(in *s3.GetObjectInput) { in.IfMatch = aws.String(etag) }
}

// ErrChanged: the object's ETag is not the one asked for with IfMatch.
var ErrChanged = errors.New("object changed since the download started")

// Open starts reading key at offset (a ranged GET, "Range: bytes=offset-",
// when offset > 0), so a download that failed half-way resumes where it
// stopped. The caller closes the body. If a server ignores the range and
// sends the whole object, the first offset bytes are skipped here.
func (s *Source) Open(ctx context.Context, key string, offset int64, opts ...OpenOption) (*Body, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("open s3://%s/%s: negative offset %d", s.bucket, key, offset)
	}
	in := &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)}
	if offset > 0 {
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", offset))
	}
	for _, o := range opts {
		o(in)
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("get s3://%s/%s from offset %d: %w", s.bucket, key, offset, err)
	}
	b := &Body{ReadCloser: out.Body, Offset: offset, ETag: aws.ToString(out.ETag)}
	if in.IfMatch != nil && b.ETag != *in.IfMatch {
		out.Body.Close()
		return nil, fmt.Errorf("get s3://%s/%s: ETag %s, want %s: %w", s.bucket, key, b.ETag, *in.IfMatch, ErrChanged)
	}
	length := aws.ToInt64(out.ContentLength)
	if cr := aws.ToString(out.ContentRange); offset > 0 && cr != "" {
		// "bytes start-end/total"
		var start, end, total int64
		if _, err := fmt.Sscanf(cr, "bytes %d-%d/%d", &start, &end, &total); err != nil || start != offset {
			out.Body.Close()
			return nil, fmt.Errorf("get s3://%s/%s from offset %d: unexpected Content-Range %q", s.bucket, key, offset, cr)
		}
		b.Size = total
	} else {
		b.Size = length
		if offset > 0 {
			// The whole object came back: skip to the offset.
			if _, err := io.CopyN(io.Discard, out.Body, offset); err != nil {
				out.Body.Close()
				return nil, fmt.Errorf("get s3://%s/%s: skip to offset %d: %w", s.bucket, key, offset, err)
			}
		}
	}
	log.G(ctx).WithField("key", key).WithField("offset", offset).WithField("size", b.Size).Debug("s3 get")
	return b, nil
}
