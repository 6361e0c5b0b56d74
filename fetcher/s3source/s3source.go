// Package s3source reads S3 images: tarball objects in a bucket of AWS S3 or
// of an S3-compatible server, through aws-sdk-go-v2.
//
// An image is either one layer key (ending in ".tar", ".tar.gz" or
// ".tar.zst": see IsLayerKey) or a prefix whose layer objects directly under
// it are its layers, in key order (byte order of the keys, as S3 lists them:
// name layers 01.tar, 02.tar.gz, ... so that order is the intended one).
//
// Retries: the SDK's own retryer is limited to one attempt by default
// (Config.MaxAttempts), so every failure surfaces at once with its Kind
// (Classify) and the state machine that called us owns the retry policy of
// its transition (backoff, attempt count, timeout). Nesting the SDK's three
// attempts inside the transition's five would multiply latency on a dead
// server and hide how many requests were made. A body that fails half-way is
// resumed by the caller with Open at the offset reached; NewReader does it
// within a bounded number of resumes.
//
// NewReader reads an object larger than Config.PartSize as byte-range GETs
// of one part each, Config.ConnectionsPerObject at a time, and hands the
// parts out in order: S3 serves each connection at a capped rate, so
// parallel parts reach several times one stream's throughput. Every part
// carries If-Match with the listed ETag, so an object overwritten during
// the read fails it (ErrChanged) instead of mixing two versions. From a
// server that answers a part with the whole object, the read goes on as
// one stream, and so do later reads.
package s3source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// Config says where the images are, how to authenticate and how long to
// wait. The fields with toml tags are the S3 client's keys of the
// daemon's [s3] section; the others are set in code.
type Config struct {
	// Bucket is the bucket the source reads. (The daemon's s3.bucket is
	// its default bucket for pulls, a key of the pull policy, not this.)
	Bucket string `toml:"-"`
	// Region of the bucket; empty means the SDK's default chain (AWS_REGION,
	// shared config), and "us-east-1" if that names none.
	Region string `toml:"region"`
	// Endpoint overrides the S3 endpoint (an S3-compatible server such as
	// MinIO: "http://127.0.0.1:9000"); empty means AWS.
	Endpoint string `toml:"endpoint"`
	// PathStyle addresses buckets as endpoint/bucket/key instead of
	// bucket.endpoint/key; most S3-compatible servers need it.
	PathStyle bool `toml:"path_style"`
	// Anonymous sends unsigned requests (public buckets); otherwise
	// credentials come from the SDK's default chain (environment, shared
	// files, SSO, web identity, ECS/EC2 roles).
	Anonymous bool `toml:"anonymous"`
	// MaxAttempts is the SDK's attempts per request; 0 means 1 (the caller
	// retries; see the package documentation).
	MaxAttempts int `toml:"-"`
	// HTTPClient, if set, is used for every request (tests, proxies); the
	// connect and response-header timeouts are then its own business.
	HTTPClient *http.Client `toml:"-"`
	// APIOptions are added to the S3 client's middleware stack (the
	// daemon's request counters).
	APIOptions []func(*middleware.Stack) error `toml:"-"`

	// ConnectTimeout bounds connecting to the server (TCP and TLS);
	// 0 means DefaultConnectTimeout.
	ConnectTimeout conf.Duration `toml:"connect_timeout"`
	// ResponseHeaderTimeout bounds the wait for a response's headers once
	// the request is sent; 0 means DefaultResponseHeaderTimeout.
	ResponseHeaderTimeout conf.Duration `toml:"response_header_timeout"`
	// IdleTimeout bounds the wait for more of an object's body; 0 means
	// DefaultIdleTimeout. A listing page or a HEAD must be answered in full
	// within ResponseHeaderTimeout plus IdleTimeout.
	IdleTimeout conf.Duration `toml:"idle_timeout"`
	// MaxListPages bounds the pages of one listing; 0 means
	// DefaultMaxListPages.
	MaxListPages int `toml:"-"`
	// MaxLayers bounds the layers (layer objects) of one image; 0 means
	// DefaultMaxLayers. (The daemon takes it from pipeline.max_layers.)
	MaxLayers int `toml:"-"`

	// PartSize is the size of each byte-range GET of an object read as
	// concurrent parts (NewReader); 0 means DefaultPartSize. It must lie
	// within MinPartSize and MaxPartSize. Each part is held in memory
	// until the reader's caller has read it.
	PartSize conf.Size `toml:"part_size"`
	// ConnectionsPerObject is how many part GETs of one object are in
	// flight at once, and so how many parts are buffered; 0 means
	// DefaultConnectionsPerObject, 1 reads every object as one stream.
	// At most MaxConnectionsPerObject.
	ConnectionsPerObject int `toml:"connections_per_object"`
}

// Defaults of the deadlines and listing bounds of Config.
const (
	DefaultConnectTimeout        = 10 * time.Second
	DefaultResponseHeaderTimeout = 30 * time.Second
	DefaultIdleTimeout           = time.Minute
	// DefaultMaxListPages of 1,000 keys each is far more than an image
	// prefix holds; a server that keeps answering "truncated" is cut off.
	DefaultMaxListPages = 100
	DefaultMaxLayers    = 128
)

// Defaults and bounds of the part size and connections of a ranged read
// (Config.PartSize, Config.ConnectionsPerObject).
const (
	// DefaultPartSize follows AWS's guidance for byte-range fetches of
	// S3 objects (8 MiB or 16 MiB parts): the smaller one, because the
	// parts of every download in flight are held in memory.
	DefaultPartSize = 8 << 20
	// DefaultConnectionsPerObject: four parts in flight reach several
	// times one connection's throughput, which S3 caps per connection,
	// while one object buffers at most 32 MiB.
	DefaultConnectionsPerObject = 4
	// MinPartSize keeps a part's request overhead small next to its
	// transfer time.
	MinPartSize = 1 << 20
	// MaxPartSize is S3's own largest part (of a multipart upload).
	MaxPartSize = 5 << 30
	// MaxConnectionsPerObject bounds the requests of one object in flight.
	MaxConnectionsPerObject = 64
)

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// Object is one tarball object of the bucket.
type Object struct {
	Key          string
	Size         int64
	ETag         string // in S3's quoted form ("…"), see normalizeETag; empty if the server gave none
	LastModified time.Time
}

// Source reads one bucket.
type Source struct {
	client *s3.Client
	bucket string

	requestTimeout time.Duration // a listing page or a HEAD, in full
	idleTimeout    time.Duration
	maxPages       int
	maxLayers      int

	partSize    int64
	connections int
	// rangesIgnored is set once the server answered a ranged GET with the
	// whole object: from then on objects are read as one stream (Ranged).
	rangesIgnored atomic.Bool
	// parts recycles the part buffers of ranged reads (all PartSize
	// long), so a pull of many layers does not allocate each anew.
	parts sync.Pool
}

// New makes a Source; it does not contact S3 (credentials are resolved on
// the first request).
func New(ctx context.Context, cfg Config) (*Source, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("s3 source: bucket is required")
	}
	if i := strings.IndexFunc(cfg.Bucket, unprintable); i >= 0 || !utf8.ValidString(cfg.Bucket) {
		return nil, fmt.Errorf("s3 source: bucket %q: %w", cfg.Bucket, ErrKeyControl)
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("s3 source for bucket %q: invalid config: %w", cfg.Bucket, err)
	}
	partSize, conns := cfg.PartSize.Bytes(), cfg.ConnectionsPerObject
	connect, header, idle := cfg.ConnectTimeout.Duration, cfg.ResponseHeaderTimeout.Duration, cfg.IdleTimeout.Duration
	opts := []func(*config.LoadOptions) error{}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.Anonymous {
		opts = append(opts, config.WithCredentialsProvider(aws.AnonymousCredentials{}))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, config.WithHTTPClient(cfg.HTTPClient))
	} else {
		// A server that accepts the connection and never answers would
		// otherwise hold a pull for good.
		opts = append(opts, config.WithHTTPClient(awshttp.NewBuildableClient().
			WithDialerOptions(func(d *net.Dialer) { d.Timeout = connect }).
			WithTransportOptions(func(t *http.Transport) {
				t.TLSHandshakeTimeout = connect
				t.ResponseHeaderTimeout = header
				// The client talks to one host (or one per bucket): the
				// SDK's smaller per-host cap of idle connections would close
				// connections that the parallel parts of several downloads
				// go on to reuse, and pay a new handshake per part.
				t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, t.MaxIdleConns)
			})))
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
	if !cfg.Anonymous && awsCfg.Credentials != nil {
		awsCfg.Credentials = credentialsProvider{awsCfg.Credentials}
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		o.APIOptions = append(o.APIOptions, addBoundErrorBodies(idle), addBoundListPages)
		o.APIOptions = append(o.APIOptions, cfg.APIOptions...)
		// Checksums only where S3 requires them: S3-compatible servers
		// often lack the newer checksum headers, and the pipeline computes
		// its own SHA-256 of every byte.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	// A listing page or a HEAD is bounded by both waits; two very long
	// ones (each valid) must not overflow into a bound already past.
	request := header + idle
	if request < header {
		request = math.MaxInt64
	}
	return &Source{client: client, bucket: cfg.Bucket, requestTimeout: request, idleTimeout: idle,
		maxPages: orDefault(cfg.MaxListPages, DefaultMaxListPages), maxLayers: orDefault(cfg.MaxLayers, DefaultMaxLayers),
		partSize: partSize, connections: conns}, nil
}

// ErrTimeout is matched by the error of a request the server did not
// answer in time (Config's timeouts); it is classified as retryable.
var ErrTimeout = errors.New("s3 server did not answer in time")

// bounded runs a request that must be answered in full within
// s.requestTimeout, saying so if it was not.
func bounded[T any](ctx context.Context, s *Source, do func(context.Context) (T, error)) (T, error) {
	rctx, cancel := context.WithTimeout(ctx, s.requestTimeout)
	defer cancel()
	v, err := do(rctx)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		err = fmt.Errorf("no complete answer within %v: %w (%w)", s.requestTimeout, ErrTimeout, err)
	}
	return v, err
}

// timedOut reports whether err is a wait that ran out: ours (ErrTimeout)
// or the transport's (connect, response headers).
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())
}

// idleBody is an object's body whose every Read must make progress within
// d: otherwise the request is canceled, which ends the blocked Read.
type idleBody struct {
	rc     io.ReadCloser
	cancel context.CancelFunc
	d      time.Duration
	what   string
	// expired is set when a Read went d without data and canceled the
	// request. Bytes may still come back from that Read, arrived as the
	// timeout fired; the Read after it then fails on the canceled
	// request, which is the timeout's failure too, not the caller's.
	expired atomic.Bool
}

func (b *idleBody) expire() {
	b.expired.Store(true)
	b.cancel()
}

func (b *idleBody) Read(p []byte) (int, error) {
	t := time.AfterFunc(b.d, b.expire)
	n, err := b.rc.Read(p)
	t.Stop()
	if err != nil && err != io.EOF && b.expired.Load() {
		err = fmt.Errorf("%s: no data for %v: %w (%w)", b.what, b.d, ErrTimeout, err)
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.cancel()
	return b.rc.Close()
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
	// ErrKeyControl: a control or invisible formatting character (ESC,
	// C1 controls, DEL, bidirectional overrides such as U+202E) that could
	// rewrite what a terminal shows.
	ErrKeyControl = errors.New("key has a control or formatting character")
	// ErrKeyOutsidePrefix: a listing returned a key not under the prefix
	// asked for.
	ErrKeyOutsidePrefix = errors.New("listed key is outside the prefix")
	// ErrNegativeSize: a listing or HEAD gave an object a negative size.
	ErrNegativeSize = errors.New("object has a negative size")
	// ErrNoSize: a listing entry without a size, or a HEAD answered
	// without a Content-Length: nothing says how long the object is.
	ErrNoSize = errors.New("object listed without a size")
	// ErrKeyListedTwice: a listing returned the same key twice (on two
	// pages): it cannot be trusted to say which objects the image has.
	ErrKeyListedTwice = errors.New("listing returned the key twice")
	// ErrKeyEncoding: a listing that says it URL-encoded its keys gave
	// one that does not decode.
	ErrKeyEncoding = errors.New("listed key is not URL-encoded as its listing says")
)

// unprintable reports a rune ValidateKey refuses: a control character
// (C0, DEL, C1) or an invisible formatting one (Unicode category Cf).
func unprintable(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

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

// ValidateKey checks a key or prefix before any request, and every key a
// listing returns: not empty, at most 1024 bytes, valid UTF-8, no NUL, no
// control or formatting character, no leading "/", no ".." segment. So a
// key that reaches a message or a terminal cannot rewrite what it shows.
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
	case strings.IndexFunc(key, unprintable) >= 0:
		rule = ErrKeyControl
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

// Errors of a listing the server would not end.
var (
	// ErrListTooLong: more pages than Config.MaxListPages.
	ErrListTooLong = errors.New("listing has too many pages")
	// ErrListLoop: a continuation token the server already gave.
	ErrListLoop = errors.New("listing repeats a continuation token")
	// ErrListTokenTooLong: a continuation token longer than
	// maxListToken, which S3's (a few hundred bytes) never are.
	ErrListTokenTooLong = errors.New("listing gives a continuation token longer than S3 does")
	// ErrTooManyLayers: more layer objects under an image's prefix than
	// Config.MaxLayers.
	ErrTooManyLayers = errors.New("image has too many layers")
)

// maxListToken bounds a continuation token, which every later request
// of the listing carries in its URL and which is kept to tell a loop:
// S3's are a few hundred bytes, and a server encoding the last key in
// its token (at most 1,024 bytes) stays well under it.
const maxListToken = 4 << 10

// maxListEntries is the most keys and common prefixes a listing page
// may hold: S3's own page size, asked for in every listing request.
const maxListEntries = 1000

// List returns the layer objects (IsLayerKey) directly under prefix (no deeper "/"), in
// key order. An empty prefix lists the bucket's top level. Every key listed
// must pass ValidateKey and lie under prefix, every size be non-negative,
// every layer's be given (*KeyError otherwise); a listing of more than Config.MaxListPages pages,
// repeating a continuation token or giving one longer than S3 does, or
// with a page larger than S3 sends (ErrListPageTooLarge) is refused.
// Keys are asked for URL-encoded and decoded when the answer says they
// are, so a key holding a character XML cannot carry is refused by name
// (ErrKeyControl) like any other bad key.
func (s *Source) List(ctx context.Context, prefix string) ([]Object, error) {
	return s.list(ctx, prefix, 0)
}

// list is List stopping with ErrTooManyLayers past limit objects (0: no
// limit).
func (s *Source) list(ctx context.Context, prefix string, limit int) ([]Object, error) {
	if prefix != "" {
		if err := ValidateKey(prefix); err != nil {
			return nil, err
		}
	}
	where := fmt.Sprintf("list s3://%s/%s", s.bucket, prefix)
	// Keys URL-encoded: S3 lists a character XML 1.0 cannot hold (a C0
	// control) as a character reference no XML parser accepts, so one
	// such key would fail every page it is on as an unreadable answer,
	// retried, naming no key; encoded, it reaches checkListed, which
	// refuses it by name.
	in := &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Delimiter: aws.String("/"), MaxKeys: aws.Int32(maxListEntries),
		EncodingType: types.EncodingTypeUrl}
	if prefix != "" {
		in.Prefix = aws.String(prefix)
	}
	var out []Object
	seen := map[string]bool{}   // continuation tokens
	listed := map[string]bool{} // keys
	for pages := 1; ; pages++ {
		page, err := bounded(ctx, s, func(ctx context.Context) (*s3.ListObjectsV2Output, error) {
			return s.client.ListObjectsV2(ctx, in)
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		// The keys remembered across pages are bounded by the pages'
		// count only if each page is.
		if n := len(page.Contents) + len(page.CommonPrefixes); n > maxListEntries {
			return nil, fmt.Errorf("%s: page %d: %w: %d entries, asked for at most %d", where, pages, ErrListPageTooLarge, n, maxListEntries)
		}
		for _, o := range page.Contents {
			k, size := aws.ToString(o.Key), aws.ToInt64(o.Size)
			// A server that ignores encoding-type (many S3-compatible
			// ones) lists the keys as they are, and does not say url.
			if page.EncodingType == types.EncodingTypeUrl {
				dk, err := url.QueryUnescape(k)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", where, &KeyError{Key: k, Rule: ErrKeyEncoding})
				}
				k = dk
			}
			if err := checkListed(prefix, k, size); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			if listed[k] {
				return nil, fmt.Errorf("%s: %w", where, &KeyError{Key: k, Rule: ErrKeyListedTwice})
			}
			listed[k] = true
			// A key below a deeper "/" is not one of the image's layers,
			// even from a server that ignores the listing's delimiter.
			if !IsLayerKey(k) || strings.Contains(k[len(prefix):], "/") {
				continue
			}
			if o.Size == nil {
				return nil, fmt.Errorf("%s: %w", where, &KeyError{Key: k, Rule: ErrNoSize})
			}
			etag, err := normalizeETag(aws.ToString(o.ETag))
			if err != nil {
				return nil, fmt.Errorf("%s: object %q: %w", where, k, err)
			}
			out = append(out, Object{Key: k, Size: size, ETag: etag, LastModified: aws.ToTime(o.LastModified)})
			if limit > 0 && len(out) > limit {
				return nil, fmt.Errorf("%s: %w: more than %d", where, ErrTooManyLayers, limit)
			}
		}
		if !aws.ToBool(page.IsTruncated) {
			break
		}
		tok := aws.ToString(page.NextContinuationToken)
		switch {
		case tok == "":
			return nil, fmt.Errorf("%s: page %d is truncated but gives no continuation token: %w", where, pages, ErrListLoop)
		case len(tok) > maxListToken:
			return nil, fmt.Errorf("%s: page %d: %w: %d bytes, at most %d", where, pages, ErrListTokenTooLong, len(tok), maxListToken)
		case seen[tok]:
			return nil, fmt.Errorf("%s: page %d: %w %q", where, pages, ErrListLoop, tok)
		case pages >= s.maxPages:
			return nil, fmt.Errorf("%s: %w: more than %d", where, ErrListTooLong, s.maxPages)
		}
		seen[tok] = true
		in.ContinuationToken = aws.String(tok)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	log.G(ctx).WithField("bucket", s.bucket).WithField("prefix", prefix).WithField("objects", len(out)).Debug("s3 list")
	return out, nil
}

// checkListed applies ValidateKey and the listing's own rules to a key a
// listing of prefix returned.
func checkListed(prefix, key string, size int64) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if !strings.HasPrefix(key, prefix) {
		return &KeyError{Key: key, Rule: ErrKeyOutsidePrefix}
	}
	if size < 0 {
		return &KeyError{Key: key, Rule: ErrNegativeSize}
	}
	return nil
}

// Stat returns one object's size and ETag (a HEAD request).
func (s *Source) Stat(ctx context.Context, key string) (Object, error) {
	if err := ValidateKey(key); err != nil {
		return Object{}, err
	}
	h, err := bounded(ctx, s, func(ctx context.Context) (*s3.HeadObjectOutput, error) {
		return s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	})
	if err != nil {
		return Object{}, fmt.Errorf("stat s3://%s/%s: %w", s.bucket, key, err)
	}
	if h.ContentLength == nil {
		return Object{}, fmt.Errorf("stat s3://%s/%s: HEAD answered without a Content-Length: %w", s.bucket, key, &KeyError{Key: key, Rule: ErrNoSize})
	}
	if aws.ToInt64(h.ContentLength) < 0 {
		return Object{}, fmt.Errorf("stat s3://%s/%s: %w", s.bucket, key, &KeyError{Key: key, Rule: ErrNegativeSize})
	}
	etag, err := normalizeETag(aws.ToString(h.ETag))
	if err != nil {
		return Object{}, fmt.Errorf("stat s3://%s/%s: %w", s.bucket, key, err)
	}
	return Object{Key: key, Size: aws.ToInt64(h.ContentLength), ETag: etag, LastModified: aws.ToTime(h.LastModified)}, nil
}

// Errors of an ETag that cannot tie a read to the version listed.
var (
	// ErrWeakETag: the server, or a proxy on the way that re-encodes
	// bodies, gave a weak ETag (W/"…"). It promises only equivalent
	// content, not the same bytes, and S3 compares If-Match strongly
	// (RFC 9110: a weak tag never matches), so a read could neither be
	// tied to the listed version nor resumed safely: it is refused
	// instead of being stripped to a strong tag it does not promise.
	ErrWeakETag = errors.New(`weak ETag (W/"…"): S3 compares If-Match strongly, so no read can be tied to the listed version`)
	// ErrNoETag: a GET carrying If-Match was answered without an ETag
	// header. S3 always sends one; a server that does not cannot be told
	// apart from one that ignored If-Match, and accepting its answer
	// could splice two versions of an object into one download.
	ErrNoETag = errors.New("GET with If-Match answered without an ETag header, so the bytes cannot be shown to be the listed version")
	// ErrNoContentRange: a ranged GET was answered 206 Partial Content
	// without a Content-Range header, so nothing says which bytes came.
	ErrNoContentRange = errors.New("ranged GET answered 206 Partial Content without a Content-Range header, so its bytes cannot be placed in the object")
	// ErrBadContentRange: a ranged GET answered with a Content-Range that
	// cannot be read, or that places the bytes elsewhere than asked.
	ErrBadContentRange = errors.New("ranged GET answered with bytes other than the ones asked for")
	// ErrRangeIgnored: a GET of one part of an object (a closed range
	// past its first byte) was answered 200 with the whole object. The
	// part is not taken by reading past every part before it, which
	// would read an object of n parts about n/2 times over.
	ErrRangeIgnored = errors.New("ranged GET answered with the whole object: the server does not serve byte ranges")
	// ErrETagControl: an ETag holding a control character (a line break,
	// DEL), which no HTTP header may carry, so it could never be sent
	// back as If-Match.
	ErrETagControl = errors.New("ETag has a control character, which no If-Match header can carry")
)

// normalizeETag returns etag in S3's quoted form ("…"): the form S3 lists,
// sends and expects in If-Match, and the form the pipeline's records
// hold, so an ETag recorded from a standard server still equals a fresh
// listing. Servers that list ETags unquoted (NetApp ONTAP, some Ceph
// releases) while sending them quoted on GET and HEAD are brought to the
// same form. Empty stays empty (no ETag); a weak ETag is ErrWeakETag, one
// with a control character ErrETagControl.
// Every ETag this package reads or sends goes through it.
func normalizeETag(etag string) (string, error) {
	etag = strings.TrimSpace(etag)
	if strings.HasPrefix(etag, "W/") {
		return "", fmt.Errorf("ETag %q: %w", etag, ErrWeakETag)
	}
	tag := strings.TrimSuffix(strings.TrimPrefix(etag, `"`), `"`)
	if strings.IndexFunc(tag, unicode.IsControl) >= 0 {
		return "", fmt.Errorf("ETag %s: %w", strconv.Quote(tag), ErrETagControl)
	}
	if tag == "" {
		return "", nil
	}
	return `"` + tag + `"`, nil
}

// shownETag is a normalised ETag for a message: quoted once, with any
// control character a server put in it escaped.
func shownETag(etag string) string {
	return strconv.Quote(strings.TrimSuffix(strings.TrimPrefix(etag, `"`), `"`))
}

// ErrNoLayers is returned (wrapped, and classified KindNotFound) by
// ResolveImage for a prefix with no layer object under it.
var ErrNoLayers = errors.New("no .tar, .tar.gz or .tar.zst objects under the prefix")

// LayerSuffixes are the endings of the keys that are layers. The name says
// only which objects are layers; how one is stored (plain tar, gzip, zstd)
// is told by its bytes when it is read.
var LayerSuffixes = []string{".tar", ".tar.gz", ".tar.zst"}

// IsLayerKey reports whether key ends in one of LayerSuffixes.
func IsLayerKey(key string) bool {
	return LayerBase(key) != key
}

// LayerBase is key without its layer suffix (key itself when it has none).
func LayerBase(key string) string {
	for _, s := range LayerSuffixes {
		if b, ok := strings.CutSuffix(key, s); ok {
			return b
		}
	}
	return key
}

// resolveAttempts is how many times ResolveImage asks S3 when it is
// refused retryably: the pull that asks has no state machine to retry it,
// and one 503 SlowDown or 500, which S3 answers now and then, would fail
// it. It is the requests a download's read with its budget of 5 resumes
// makes for a range S3 keeps refusing, so that the pauses between them
// (see pause) add up to as long, 3.1 s to 6.2 s: a burst of SlowDown
// that every host of a fleet pulling one image at once meets, and their
// downloads ride out, does not fail every pull at its start instead.
const resolveAttempts = 6

// ResolveImage turns what a user names into the image's layers: a layer
// key (IsLayerKey) is one object (stat'ed); anything else is a prefix
// ("/" appended if missing) whose layer objects directly under it are the
// layers, in key order, at most Config.MaxLayers of them
// (ErrTooManyLayers). Unlike the other calls, it asks again after a
// retryable failure (after a pause, see pause), up to resolveAttempts
// times in all, but not after a request not answered in time, which
// waited its turn already.
func (s *Source) ResolveImage(ctx context.Context, keyOrPrefix string) ([]Object, error) {
	for attempt := 1; ; attempt++ {
		objs, err := s.resolveImage(ctx, keyOrPrefix)
		if err == nil || attempt >= resolveAttempts || Classify(err) != KindRetryable || timedOut(err) || ctx.Err() != nil {
			return objs, err
		}
		log.G(ctx).WithField("bucket", s.bucket).WithField("image", keyOrPrefix).WithField("attempt", attempt).WithError(err).Info("s3: resolving the image failed, asking again")
		if pause(ctx, attempt) != nil {
			return objs, err
		}
	}
}

// resolveImage is one attempt of ResolveImage.
func (s *Source) resolveImage(ctx context.Context, keyOrPrefix string) ([]Object, error) {
	if err := ValidateKey(keyOrPrefix); err != nil {
		return nil, err
	}
	if IsLayerKey(keyOrPrefix) {
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
	objs, err := s.list(ctx, prefix, s.maxLayers)
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
	Size   int64  // the whole object's size; -1 when the answer did not say (no Content-Length, sent chunked)
	ETag   string // the object's ETag, in S3's quoted form (see Object.ETag)
}

// OpenOption tunes Open.
type OpenOption func(*s3.GetObjectInput)

// IfMatch makes Open fail with ErrChanged (KindChanged) if the object's ETag
// is no longer etag: a resumed download must not splice two versions of an
// object. S3 enforces it (412); the ETag of the answer is checked here too,
// for S3-compatible servers that ignore If-Match. etag is sent quoted and
// compared with the answer's quoted or not (see Object.ETag); an answer
// without an ETag fails with ErrNoETag, a weak etag or answer with
// ErrWeakETag.
func IfMatch(etag string) OpenOption {
	return func(in *s3.GetObjectInput) { in.IfMatch = aws.String(etag) }
}

// ErrChanged: the object's ETag is not the one asked for with IfMatch.
var ErrChanged = errors.New("object changed since the download started")

// statusOf is the HTTP status of an error answer (0: none).
func statusOf(err error) int {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// Open starts reading key at offset (a ranged GET, "Range: bytes=offset-",
// when offset > 0), so a download that failed half-way resumes where it
// stopped. The caller closes the body. If a server ignores the range and
// sends the whole object, the first offset bytes are skipped here. An
// offset past the object's end (416) is ErrChanged: a caller asks only for
// bytes it was told the object has.
func (s *Source) Open(ctx context.Context, key string, offset int64, opts ...OpenOption) (*Body, error) {
	return s.open(ctx, key, offset, -1, opts...)
}

// open is Open of the length bytes at offset ("Range: bytes=offset-end"),
// or of the rest of the object when length < 0. A server may send fewer
// bytes than asked (the object's end) or more: the caller reads what it
// needs. A whole object sent for a length past offset 0 is
// ErrRangeIgnored, and the source reads objects as one stream from then
// on (Ranged).
func (s *Source) open(ctx context.Context, key string, offset, length int64, opts ...OpenOption) (*Body, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("open s3://%s/%s: negative offset %d", s.bucket, key, offset)
	}
	in := &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)}
	switch {
	case length > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", offset, offset+length-1))
	case offset > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", offset))
	}
	for _, o := range opts {
		o(in)
	}
	if in.IfMatch != nil {
		want, err := normalizeETag(*in.IfMatch)
		if err != nil {
			return nil, fmt.Errorf("get s3://%s/%s: If-Match: %w", s.bucket, key, err)
		}
		in.IfMatch = nil // no ETag to hold the read to
		if want != "" {
			in.IfMatch = aws.String(want)
		}
	}
	// The request lives as long as the body; a body that stops coming
	// for s.idleTimeout cancels it.
	rctx, cancel := context.WithCancel(ctx)
	out, err := s.client.GetObject(rctx, in)
	if err != nil {
		cancel()
		if Classify(err) == KindChanged {
			// S3's 412 on If-Match says the same as an ETag seen to differ.
			err = fmt.Errorf("%w: %w", ErrChanged, err)
		} else if in.Range != nil && statusOf(err) == http.StatusRequestedRangeNotSatisfiable {
			// The callers ask only for bytes the listing says the object
			// has: a range past its end now is an object overwritten by
			// a shorter one, from a server that answers the range before
			// If-Match (S3 would say 412).
			err = fmt.Errorf("%w: the object no longer has byte %d: %w", ErrChanged, offset, err)
		}
		return nil, fmt.Errorf("get s3://%s/%s from offset %d: %w", s.bucket, key, offset, err)
	}
	if aws.ToInt64(out.ContentLength) < 0 {
		cancel()
		out.Body.Close()
		return nil, fmt.Errorf("get s3://%s/%s: %w", s.bucket, key, &KeyError{Key: key, Rule: ErrNegativeSize})
	}
	out.Body = &idleBody{rc: out.Body, cancel: cancel, d: s.idleTimeout, what: fmt.Sprintf("read s3://%s/%s", s.bucket, key)}
	etag, err := normalizeETag(aws.ToString(out.ETag))
	if err != nil {
		out.Body.Close()
		return nil, fmt.Errorf("get s3://%s/%s from offset %d: %w", s.bucket, key, offset, err)
	}
	b := &Body{ReadCloser: out.Body, Offset: offset, ETag: etag}
	switch want := aws.ToString(in.IfMatch); {
	case want == "":
	case etag == "":
		out.Body.Close()
		return nil, fmt.Errorf("get s3://%s/%s from offset %d with If-Match %s: %w", s.bucket, key, offset, shownETag(want), ErrNoETag)
	case etag != want:
		out.Body.Close()
		return nil, fmt.Errorf("get s3://%s/%s: ETag %s, want %s: %w", s.bucket, key, shownETag(etag), shownETag(want), ErrChanged)
	}
	// A body sent chunked gives no length: unknown, not empty.
	size := int64(-1)
	if out.ContentLength != nil {
		size = *out.ContentLength
	}
	if in.Range != nil && aws.ToString(out.ContentRange) == "" {
		// A 200 is the whole object (the range ignored), read below; a
		// 206 without Content-Range is some part no one can place.
		raw, ok := awsmiddleware.GetRawResponse(out.ResultMetadata).(*smithyhttp.Response)
		if ok && raw.StatusCode == http.StatusPartialContent {
			out.Body.Close()
			return nil, fmt.Errorf("get s3://%s/%s from offset %d: %w", s.bucket, key, offset, ErrNoContentRange)
		}
		if ok && raw.StatusCode == http.StatusOK && length > 0 {
			// Only a ranged read asks for a closed range. Its first part
			// is the whole object's start; a later one is refused.
			if !s.rangesIgnored.Swap(true) {
				log.G(ctx).WithField("bucket", s.bucket).WithField("key", key).Warn("s3 server answered a ranged GET with the whole object; reading objects as one stream")
			}
			if offset > 0 {
				out.Body.Close()
				return nil, fmt.Errorf("get s3://%s/%s bytes %d-%d: %w", s.bucket, key, offset, offset+length-1, ErrRangeIgnored)
			}
		}
	}
	if cr := aws.ToString(out.ContentRange); in.Range != nil && cr != "" {
		// "bytes start-end/total"
		var start, end, total int64
		if _, err := fmt.Sscanf(cr, "bytes %d-%d/%d", &start, &end, &total); err != nil || start != offset {
			out.Body.Close()
			return nil, fmt.Errorf("get s3://%s/%s from offset %d: unexpected Content-Range %q: %w", s.bucket, key, offset, cr, ErrBadContentRange)
		}
		b.Size = total
	} else {
		b.Size = size
		if offset > 0 {
			// The whole object came back: skip to the offset.
			if _, err := io.CopyN(io.Discard, out.Body, offset); err != nil {
				out.Body.Close()
				return nil, fmt.Errorf("get s3://%s/%s: skip to offset %d: %w", s.bucket, key, offset, err)
			}
		}
	}
	log.G(ctx).WithField("key", key).WithField("offset", offset).WithField("length", length).WithField("size", b.Size).Debug("s3 get")
	return b, nil
}
