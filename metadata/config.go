package metadata

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// DefaultOptions returns the [metadata] defaults: Path empty (the daemon
// derives it from its root directory), DefaultSynchronous.
func DefaultOptions() Options { return Options{Synchronous: DefaultSynchronous} }

// Validate checks the [metadata] keys and returns one error per bad value,
// joined, each naming the key ("metadata.path: ..."). Unlike Open, it
// wants an absolute path: the daemon resolves its paths before checking.
func (o Options) Validate() error {
	var p conf.Problems
	p.AbsPath("metadata.path", o.Path, false)
	if o.Synchronous.Validate() != nil {
		p.Add("metadata.synchronous", "must be %q or %q, got %q", SynchronousFull, SynchronousNormal, o.Synchronous)
	}
	return p.Err()
}
