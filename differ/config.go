package differ

// Config is the [differ] section: how the registry layers containerd hands
// to the daemon's diff service are extracted. The rest of the extraction
// rules are the [pipeline] ones that S3 layers follow.
type Config struct {
	// AllowSetID keeps setuid and setgid bits and file capabilities in
	// registry layers (tarball.Limits.AllowSetID): base images carry su,
	// passwd and ping with them, and containerd's own applier keeps them.
	AllowSetID bool `toml:"allow_setid"`
}

// DefaultConfig returns the [differ] defaults: setuid bits kept.
func DefaultConfig() Config { return Config{AllowSetID: true} }
