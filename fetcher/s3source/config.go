package s3source

import (
	"net/url"
	"regexp"
	"strings"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// DefaultConfig returns the defaults of the [s3] keys Config holds: the
// AWS SDK's region chain, AWS's endpoint, signed requests, the Default
// timeouts, part size and connections.
func DefaultConfig() Config {
	return Config{
		ConnectTimeout:        conf.D(DefaultConnectTimeout),
		ResponseHeaderTimeout: conf.D(DefaultResponseHeaderTimeout),
		IdleTimeout:           conf.D(DefaultIdleTimeout),
		PartSize:              DefaultPartSize,
		ConnectionsPerObject:  DefaultConnectionsPerObject,
	}
}

// withDefaults fills the zero timeouts, part size and connection count
// from DefaultConfig, so that a caller may give only what it changes.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.ConnectTimeout.Duration == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.ResponseHeaderTimeout.Duration == 0 {
		c.ResponseHeaderTimeout = d.ResponseHeaderTimeout
	}
	if c.IdleTimeout.Duration == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.PartSize == 0 {
		c.PartSize = d.PartSize
	}
	if c.ConnectionsPerObject == 0 {
		c.ConnectionsPerObject = d.ConnectionsPerObject
	}
	return c
}

// Validate checks the [s3] keys Config holds and returns one error per
// bad value, joined, each naming the key ("s3.part_size: ..."). No
// message prints the user information an endpoint URL may carry.
func (c Config) Validate() error {
	var p conf.Problems
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			p.Add("s3.endpoint", "must be an http:// or https:// URL with a host, got %q", redactURL(c.Endpoint))
		case u.User != nil:
			p.Add("s3.endpoint", "must not carry user information (user:password@; S3 credentials come from the AWS credential chain), got %q", redactURL(c.Endpoint))
		}
	}
	p.PositiveDuration("s3.connect_timeout", c.ConnectTimeout)
	p.PositiveDuration("s3.response_header_timeout", c.ResponseHeaderTimeout)
	p.PositiveDuration("s3.idle_timeout", c.IdleTimeout)
	if c.PartSize < MinPartSize || c.PartSize > MaxPartSize {
		p.Add("s3.part_size", "must be between %s and %s, got %s", conf.Size(MinPartSize), conf.Size(MaxPartSize), c.PartSize)
	}
	if n := c.ConnectionsPerObject; n < 1 || n > MaxConnectionsPerObject {
		p.Add("s3.connections_per_object", "must be between 1 and %d, got %d", MaxConnectionsPerObject, n)
	}
	return p.Err()
}

var bucketNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// CheckBucketName records a problem under key in p unless bucket is an S3
// bucket name.
func CheckBucketName(p *conf.Problems, key, bucket string) {
	if !bucketNameRE.MatchString(bucket) || strings.Contains(bucket, "..") {
		p.Add(key, "must be an S3 bucket name (3-63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit), got %q", bucket)
	}
}

// redactURL is the URL s without its user information ("user:password@"),
// for every message that prints a configured URL: the credentials it may
// carry stay out of errors and logs. It works on the text itself, so a
// value url.Parse refuses (or reads as something else, "user:pw@host:1"
// parsing as scheme "user") is redacted too.
func redactURL(s string) string {
	prefix, rest := "", s
	if i := strings.Index(s, "//"); i >= 0 && !strings.Contains(s[:i], "/") {
		prefix, rest = s[:i+2], s[i+2:] // "scheme://" or "//"
	}
	authority := rest
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		authority = rest[:j]
	}
	if k := strings.LastIndex(authority, "@"); k >= 0 {
		return prefix + rest[k+1:]
	}
	return s
}
