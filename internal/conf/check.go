package conf

import (
	"errors"
	"fmt"
	"path/filepath"
)

// Problems collects what is wrong with a configuration, one error per bad
// key. Every package validating its own section uses it, so that each
// message has the same shape: the dotted key as an operator writes it in
// the TOML file ("pool.block_size"), then what the value must be and what
// it got.
type Problems struct{ errs []error }

// Add records that key is wrong; format and args say why.
func (p *Problems) Add(key, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
}

// Join records every error of err (a Validate result of another section)
// as it is; nil adds nothing.
func (p *Problems) Join(err error) {
	if err != nil {
		p.errs = append(p.errs, err)
	}
}

// Err returns every problem recorded, joined (one line each), or nil.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// AbsPath records a problem unless path is absolute; an empty path is
// accepted when optional.
func (p *Problems) AbsPath(key, path string, optional bool) {
	switch {
	case path == "" && optional:
	case path == "":
		p.Add(key, "must be an absolute path, got an empty value")
	case !filepath.IsAbs(path):
		p.Add(key, "must be an absolute path, got %q", path)
	}
}

// PositiveDuration records a problem unless d is above zero.
func (p *Problems) PositiveDuration(key string, d Duration) {
	if d.Duration <= 0 {
		p.Add(key, "must be a positive duration such as \"30m\", got %q", d.String())
	}
}

// MaxSocketPath is what a unix socket's sun_path holds: 108 bytes
// including the terminating NUL.
const MaxSocketPath = 107

// SocketPath records a problem unless path is an absolute path a unix
// socket may have; an empty path is accepted when optional.
func (p *Problems) SocketPath(key, path string, optional bool) {
	p.AbsPath(key, path, optional)
	if len(path) > MaxSocketPath {
		p.Add(key, "unix socket path must be at most %d bytes, got %d (%q)", MaxSocketPath, len(path), path)
	}
}
