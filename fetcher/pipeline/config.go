package pipeline

import (
	"strings"

	"github.com/containerd/containerd/v2/pkg/identifiers"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// Defaults of the [containerd] section.
const (
	// DefaultContainerdAddress is containerd's own default socket.
	DefaultContainerdAddress = "/run/containerd/containerd.sock"
	// DefaultNamespace is containerd's default namespace (ctr's).
	DefaultNamespace = "default"
)

// maxQueue bounds a queue's concurrency: every run holds a connection,
// buffers and, unpacking, a mounted device.
const maxQueue = 64

// Config is the pipelines' part of the daemon's [pipeline] section (the
// toml tags are its keys).
type Config struct {
	// DownloadDir holds downloaded tarballs (Options.DownloadDir).
	DownloadDir string `toml:"download_dir"`
	// MaxImageSize is the largest image (sum of its tarballs) accepted,
	// and so the largest layer (Options.MaxImageSize, MaxLayerSize).
	MaxImageSize conf.Size `toml:"max_image_size"`
	// DownloadTimeout bounds one download attempt.
	DownloadTimeout conf.Duration `toml:"download_timeout"`
	// ExtractTimeout bounds one extraction attempt.
	ExtractTimeout conf.Duration `toml:"extract_timeout"`
	// MaxLayers is the most layers (tarballs) one image may have; the S3
	// source enforces it when it lists an image (s3source.Config.MaxLayers).
	MaxLayers int `toml:"max_layers"`
	// SpoolSize bounds the decompressed tar streams kept for the layers
	// that wait for their parent (Options.SpoolSize); 0 keeps none.
	SpoolSize conf.Size `toml:"spool_size"`
}

// DefaultConfig returns the pipelines' [pipeline] defaults, with
// DownloadDir empty (the daemon derives it from its root directory).
func DefaultConfig() Config {
	return Config{
		MaxImageSize:    DefaultMaxLayerSize,
		DownloadTimeout: conf.D(DefaultDownloadTimeout),
		ExtractTimeout:  conf.D(DefaultExtractTimeout),
		MaxLayers:       s3source.DefaultMaxLayers,
		SpoolSize:       DefaultSpoolSize,
	}
}

// Validate checks the pipelines' [pipeline] keys and returns one error per
// bad value, joined, each naming the key.
func (c Config) Validate() error {
	var p conf.Problems
	p.AbsPath("pipeline.download_dir", c.DownloadDir, false)
	tarball.LimitBytes(&p, "pipeline.max_image_size", c.MaxImageSize)
	p.PositiveDuration("pipeline.download_timeout", c.DownloadTimeout)
	p.PositiveDuration("pipeline.extract_timeout", c.ExtractTimeout)
	if c.SpoolSize < 0 || c.SpoolSize > tarball.MaxLimitBytes {
		p.Add("pipeline.spool_size", "must be at least 0 (none) and at most %s, got %s", conf.Size(tarball.MaxLimitBytes), c.SpoolSize)
	}
	if c.MaxLayers < 1 {
		p.Add("pipeline.max_layers", "must be at least 1, got %d", c.MaxLayers)
	}
	return p.Err()
}

// Options returns the Options that c, the queues q and the extraction
// policy pc describe; the caller adds what the pipelines work on (DB,
// Sources, Snapshots, ThinExists and the optional hooks).
func (c Config) Options(q QueuesConfig, pc tarball.PolicyConfig) Options {
	spool := c.SpoolSize.Bytes()
	if spool == 0 {
		spool = -1 // the key's 0 is none; the Options' 0 is the default
	}
	return Options{
		DownloadDir:     c.DownloadDir,
		MaxLayerSize:    c.MaxImageSize.Bytes(),
		MaxImageSize:    c.MaxImageSize.Bytes(),
		DownloadTimeout: c.DownloadTimeout.Duration,
		ExtractTimeout:  c.ExtractTimeout.Duration,
		Limits:          pc.Limits(),
		RequiredDirs:    pc.RequiredDirs,
		Downloads:       q.Downloads,
		Unpacking:       q.Unpacking,
		SpoolSize:       spool,
	}
}

// QueuesConfig is the daemon's [queues] section: how many runs of each
// queue may run at once.
type QueuesConfig struct {
	Downloads int `toml:"downloads"`
	Unpacking int `toml:"unpacking"`
}

// DefaultQueuesConfig returns the [queues] defaults.
func DefaultQueuesConfig() QueuesConfig {
	return QueuesConfig{Downloads: DefaultDownloads, Unpacking: DefaultUnpacking}
}

// Validate checks the [queues] keys.
func (c QueuesConfig) Validate() error {
	var p conf.Problems
	if q := c.Downloads; q < 1 || q > maxQueue {
		p.Add("queues.downloads", "must be between 1 and %d, got %d", maxQueue, q)
	}
	if q := c.Unpacking; q < 1 || q > maxQueue {
		p.Add("queues.unpacking", "must be between 1 and %d, got %d", maxQueue, q)
	}
	return p.Err()
}

// ContainerdConfig is the daemon's [containerd] section: the containerd
// the pipelines register images in.
type ContainerdConfig struct {
	// Address is containerd's gRPC socket (ContainerdRegistrar.Address).
	Address string `toml:"address"`
	// Namespace is where images are registered when a pull names none.
	Namespace string `toml:"namespace"`
	// Snapshotter is the name containerd's config gives this daemon's
	// proxy plugin ([proxy_plugins.NAME]); images are labelled with it.
	Snapshotter string `toml:"snapshotter"`
}

// DefaultContainerdConfig returns the [containerd] defaults.
func DefaultContainerdConfig() ContainerdConfig {
	return ContainerdConfig{Address: DefaultContainerdAddress, Namespace: DefaultNamespace, Snapshotter: DefaultSnapshotter}
}

// Validate checks the [containerd] keys.
func (c ContainerdConfig) Validate() error {
	var p conf.Problems
	p.SocketPath("containerd.address", strings.TrimPrefix(c.Address, "unix://"), false)
	if err := identifiers.Validate(c.Namespace); err != nil {
		p.Add("containerd.namespace", "must be a containerd namespace (letters, digits and ._- separators, at most 76 characters), got %q", c.Namespace)
	}
	if err := identifiers.Validate(c.Snapshotter); err != nil {
		p.Add("containerd.snapshotter", "must be the name of the proxy plugin in containerd's config (letters, digits and ._- separators, at most 76 characters), got %q", c.Snapshotter)
	}
	return p.Err()
}

// Registrar returns the registrar of c, or nil when no address is set.
func (c ContainerdConfig) Registrar() *ContainerdRegistrar {
	if c.Address == "" {
		return nil
	}
	return &ContainerdRegistrar{Address: c.Address, Namespace: c.Namespace, Snapshotter: c.Snapshotter}
}
