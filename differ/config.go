package differ

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// Defaults of the [differ] limits. containerd's own applier sets none; these
// only stop a layer that no image needs. A million names keep the
// extraction's record of them (a few dozen bytes a name) to tens of MiB;
// the sizes leave the pool, whose reserve guards it, as the bound.
const (
	DefaultMaxEntries = 1_000_000
	DefaultMaxSize    = conf.Size(1 << 40) // 1 TiB
)

// Config is the [differ] section: the extraction rules of the registry
// layers containerd hands to the daemon's diff service. They follow what
// containerd's own applier takes, where the daemon's rules for S3 images
// ([pipeline]) are stricter: a registry layer is checked by its digest
// before it reaches the daemon, and an image that pulls into overlayfs
// should pull into flyio. What both keep is the confinement: no name,
// link or whiteout reaches outside the snapshot.
type Config struct {
	// AllowSetID keeps setuid and setgid bits and file capabilities
	// (tarball.Limits.AllowSetID): base images carry su, passwd and ping
	// with them.
	AllowSetID bool `toml:"allow_setid"`
	// AllowDeviceNodes makes the character and block devices a layer
	// holds (tarball.Limits.AllowDeviceNodes), as images made from a
	// root file system's copy sometimes do.
	AllowDeviceNodes bool `toml:"allow_device_nodes"`
	// MaxEntries, MaxFileSize and MaxTotalSize bound one layer, as the
	// tarball.Limits of the same names.
	MaxEntries   int       `toml:"max_entries"`
	MaxFileSize  conf.Size `toml:"max_file_size"`
	MaxTotalSize conf.Size `toml:"max_total_size"`
}

// DefaultConfig returns the [differ] defaults: setuid bits and device
// nodes kept, as containerd keeps them, and the Default limits.
func DefaultConfig() Config {
	return Config{AllowSetID: true, AllowDeviceNodes: true, MaxEntries: DefaultMaxEntries,
		MaxFileSize: DefaultMaxSize, MaxTotalSize: DefaultMaxSize}
}

// Limits returns the extraction policy c describes. As containerd's
// applier does, a hard link may also name a lower layer's file
// (tarball.Limits.LowerHardlinks), which the extraction finds in the
// snapshot, and a lower layer's symlink on an entry's way is followed
// inside the snapshot (tarball.Limits.LowerSymlinks): only an extraction
// onto the lower layers can check either. An absolute entry name or hard
// link target is taken from the snapshot's root
// (tarball.Limits.RootRelativeNames), as ko writes them. A layer may end
// without its end-of-archive marker (tarball.Limits.AllowMissingEndMarker),
// as estargz's zstd:chunked layers do: containerd's content store has
// checked the blob against its digest, so a blob cut short never reaches
// the differ. Bytes after the end-of-archive marker are read and hashed
// into the diff ID, whatever they are (tarball.Limits.AllowTrailingData),
// as containerd's applier reads and hashes them. The extended attribute limits are tarball's defaults,
// Linux's own bounds.
func (c Config) Limits() tarball.Limits {
	return tarball.Limits{
		MaxEntries:            c.MaxEntries,
		MaxFileSize:           c.MaxFileSize.Bytes(),
		MaxTotalSize:          c.MaxTotalSize.Bytes(),
		AllowSetID:            c.AllowSetID,
		AllowDeviceNodes:      c.AllowDeviceNodes,
		LowerHardlinks:        true,
		LowerSymlinks:         true,
		RootRelativeNames:     true,
		AllowMissingEndMarker: true,
		AllowTrailingData:     true,
	}
}

// Validate checks the [differ] keys and returns one error per bad value,
// joined, each naming the key ("differ.max_entries: ...").
func (c Config) Validate() error {
	var p conf.Problems
	tarball.LimitCount(&p, "differ.max_entries", c.MaxEntries)
	tarball.LimitBytes(&p, "differ.max_file_size", c.MaxFileSize)
	tarball.LimitBytes(&p, "differ.max_total_size", c.MaxTotalSize)
	return p.Err()
}
