package tarball

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// PolicyConfig is the extraction policy's part of the daemon's [pipeline]
// section (the toml tags are its keys): the Limits of one layer and the
// directories every image must have.
type PolicyConfig struct {
	// AllowSetID is Limits.AllowSetID.
	AllowSetID bool `toml:"allow_setid"`
	// MaxEntries, MaxFileSize and MaxTotalSize are the Limits of the same
	// names.
	MaxEntries   int       `toml:"max_entries"`
	MaxFileSize  conf.Size `toml:"max_file_size"`
	MaxTotalSize conf.Size `toml:"max_total_size"`
	// MaxXattrsPerEntry and MaxXattrBytesPerEntry are Limits.MaxXattrs and
	// Limits.MaxXattrBytes.
	MaxXattrsPerEntry     int       `toml:"max_xattrs_per_entry"`
	MaxXattrBytesPerEntry conf.Size `toml:"max_xattr_bytes_per_entry"`
	// RequiredDirs must be real directories at the top of every pulled
	// image's tree (VerifyLayoutOf); an empty list requires none.
	RequiredDirs []string `toml:"required_dirs"`
}

// DefaultPolicyConfig returns the policy's defaults: the Default limits,
// setuid refused, RequiredDirs.
func DefaultPolicyConfig() PolicyConfig {
	return PolicyConfig{
		MaxEntries:            DefaultMaxEntries,
		MaxFileSize:           DefaultMaxFileSize,
		MaxTotalSize:          DefaultMaxTotalSize,
		MaxXattrsPerEntry:     DefaultMaxXattrs,
		MaxXattrBytesPerEntry: DefaultMaxXattrBytes,
		RequiredDirs:          slices.Clone(RequiredDirs),
	}
}

// Limits returns the Limits c describes.
func (c PolicyConfig) Limits() Limits {
	return Limits{
		MaxEntries:    c.MaxEntries,
		MaxFileSize:   c.MaxFileSize.Bytes(),
		MaxTotalSize:  c.MaxTotalSize.Bytes(),
		MaxXattrs:     c.MaxXattrsPerEntry,
		MaxXattrBytes: c.MaxXattrBytesPerEntry.Bytes(),
		AllowSetID:    c.AllowSetID,
	}
}

// Validate checks the policy's keys and returns one error per bad value,
// joined, each naming the key ("pipeline.max_entries: ..."). Limits are
// added to and multiplied when the pipelines bound what they read:
// MaxLimitBytes and MaxLimitCount keep those sums far from overflowing.
func (c PolicyConfig) Validate() error {
	var p conf.Problems
	LimitCount(&p, "pipeline.max_entries", c.MaxEntries)
	LimitBytes(&p, "pipeline.max_file_size", c.MaxFileSize)
	LimitBytes(&p, "pipeline.max_total_size", c.MaxTotalSize)
	LimitCount(&p, "pipeline.max_xattrs_per_entry", c.MaxXattrsPerEntry)
	LimitBytes(&p, "pipeline.max_xattr_bytes_per_entry", c.MaxXattrBytesPerEntry)
	for i, d := range c.RequiredDirs {
		if d == "" || d == "." || d == ".." || strings.ContainsRune(d, '/') {
			p.Add(fmt.Sprintf("pipeline.required_dirs[%d]", i), "must be one top-level directory name such as \"etc\" (no '/', not \".\" or \"..\"), got %q", d)
		}
	}
	return p.Err()
}

// LimitCount records a problem in p unless v is a count limit the
// extraction's arithmetic takes: positive and at most MaxLimitCount.
func LimitCount(p *conf.Problems, key string, v int) {
	if v <= 0 || v > MaxLimitCount {
		p.Add(key, "must be positive and at most %d (larger counts overflow the byte counts derived from it), got %d", MaxLimitCount, v)
	}
}

// LimitBytes records a problem in p unless v is a byte limit the
// extraction's arithmetic takes: positive and at most MaxLimitBytes.
func LimitBytes(p *conf.Problems, key string, v conf.Size) {
	if v <= 0 || v > MaxLimitBytes {
		p.Add(key, "must be positive and at most %s (larger sizes overflow the byte counts derived from it), got %s", conf.Size(MaxLimitBytes), v)
	}
}
