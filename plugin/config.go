// Package plugin holds the daemon's TOML configuration (defaults and
// validation), the wiring that builds the whole service from a Config, and
// the containerd plugin registration that links the snapshotter into a
// custom containerd build. It holds no business logic.
package plugin

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/log"
	toml "github.com/pelletier/go-toml/v2"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// Defaults of the keys that are not derived from daemon.root_dir. A key
// that a lower package also defaults takes that package's value, so the
// daemon and a caller of the package agree.
const (
	DefaultRootDir          = "/var/lib/containerd-flyio-snapshotter"
	DefaultSocket           = "/run/containerd-flyio-snapshotter/containerd-flyio-snapshotter.sock"
	DefaultControlSocket    = "/run/containerd-flyio-snapshotter/control.sock"
	DefaultLogLevel         = "info"
	DefaultLogFormat        = "text"
	DefaultPoolName         = "flyio-pool"
	DefaultDataSize         = Size(thinpool.DefaultDataSize)
	DefaultMetadataSize     = Size(thinpool.DefaultMetadataSize)
	DefaultBlockSize        = Size(thinpool.DefaultBlockSizeSectors * 512)
	DefaultGrowthReserve    = Size(thinpool.DefaultGrowthReserve)
	DefaultTarballCacheSize = Size(gc.DefaultTarballCache)
	DefaultBaseImageSize    = Size(snapshotter.DefaultBaseImageSize)
	DefaultFSType           = string(thinpool.FSExt4)
	DefaultMaxImageSize     = Size(pipeline.DefaultMaxLayerSize)
	DefaultDownloadTimeout  = pipeline.DefaultDownloadTimeout
	DefaultExtractTimeout   = pipeline.DefaultExtractTimeout
	DefaultDownloads        = pipeline.DefaultDownloads
	DefaultUnpacking        = pipeline.DefaultUnpacking
	DefaultContainerdSocket = "/run/containerd/containerd.sock"
	DefaultNamespace        = "default"
)

// Config is the whole daemon configuration: one TOML file with a table per
// section. Every key has a default (DefaultConfig); paths left empty that
// are derived from daemon.root_dir are filled in by LoadConfig.
type Config struct {
	Daemon     DaemonConfig     `toml:"daemon"`
	Metadata   MetadataConfig   `toml:"metadata"`
	Pool       PoolConfig       `toml:"pool"`
	S3         S3Config         `toml:"s3"`
	Pipeline   PipelineConfig   `toml:"pipeline"`
	Queues     QueuesConfig     `toml:"queues"`
	Containerd ContainerdConfig `toml:"containerd"`
	GC         GCConfig         `toml:"gc"`
	Retention  RetentionConfig  `toml:"retention"`
}

// DaemonConfig is the [daemon] section: where the daemon listens and keeps
// its state.
type DaemonConfig struct {
	// Socket is the unix socket of the snapshots gRPC service that
	// containerd's [proxy_plugins] entry names.
	Socket string `toml:"socket"`
	// ControlSocket is the unix socket of the daemon's operator API; empty
	// disables it.
	ControlSocket string `toml:"control_socket"`
	// RootDir holds the daemon's state: the database, the loop-file pool
	// and downloads, unless their own keys say otherwise.
	RootDir string `toml:"root_dir"`
	// LogLevel is one of trace, debug, info, warn, error, fatal, panic.
	LogLevel string `toml:"log_level"`
	// LogFormat is "text" (logfmt) or "json" (one object a line), both
	// with nanosecond RFC 3339 timestamps, as containerd writes them.
	LogFormat string `toml:"log_format"`
	// MetricsAddress is the host:port of the Prometheus /metrics endpoint;
	// empty disables it.
	MetricsAddress string `toml:"metrics_address"`
	// SocketGroup is the group (a name or a number) given both sockets:
	// its members, and root, may use them.
	SocketGroup string `toml:"socket_group"`
}

// MetadataConfig is the [metadata] section.
type MetadataConfig struct {
	// Path is the SQLite database file; empty means <root_dir>/metadata.db.
	Path string `toml:"path"`
	// Synchronous is "full" (every acknowledged operation survives a power
	// loss) or "normal" (one fsync less per write; the last operations
	// before a power loss can be lost and their devices quarantined).
	Synchronous string `toml:"synchronous"`
}

// PoolConfig is the [pool] section: the device-mapper thin pool and the
// devices the snapshotter makes in it.
type PoolConfig struct {
	// Name is the device-mapper name of the pool.
	Name string `toml:"name"`
	// RootDir holds the pool's loop files; empty means <root_dir>/pool.
	RootDir string `toml:"root_dir"`
	// DataDevice and MetadataDevice are existing block devices used instead
	// of loop files; both or neither.
	DataDevice     string `toml:"data_device"`
	MetadataDevice string `toml:"metadata_device"`
	// DataSize and MetadataSize are the sparse loop-file sizes made on the
	// first start (ignored when the files or devices exist).
	DataSize     Size `toml:"data_size"`
	MetadataSize Size `toml:"metadata_size"`
	// BlockSize is the pool's data block size.
	BlockSize Size `toml:"block_size"`
	// LowWaterMark is the free data block count under which the kernel
	// raises a dm event, which starts garbage collection and growth; 0
	// means the edge of MinFreeSpace (thinpool.DefaultLowWaterPercent of
	// the data blocks when there is no reserve).
	LowWaterMark uint64 `toml:"low_water_mark"`
	// MaxDataSize, when set, lets a loop-file pool's data grow up to this
	// size at low-water events; 0 keeps data_size.
	MaxDataSize Size `toml:"max_data_size"`
	// GrowthReserve is the free space growth leaves on the filesystem
	// holding the loop files.
	GrowthReserve Size `toml:"growth_reserve"`
	// MetadataThreshold is the metadata usage, in percent, from which new
	// devices are refused, keeping the rest for deletes.
	MetadataThreshold float64 `toml:"metadata_threshold"`
	// MinFreeSpace is the reserve: while less than this share of the
	// pool's data or of its metadata is free, every new device (a pull's,
	// a container's) is refused, and what is left serves the writes of
	// the running containers.
	MinFreeSpace Percent `toml:"min_free_space"`
	// NoSpaceTimeout is how long writes that find the pool out of data
	// space wait for space to be freed or added before they fail (the
	// kernel's dm_thin_pool no_space_timeout, one value for the host).
	NoSpaceTimeout Duration `toml:"no_space_timeout"`
	// BaseImageSize is the virtual size of every snapshot device.
	BaseImageSize Size `toml:"base_image_size"`
	// FSType is the filesystem of the base device: ext4 or xfs.
	FSType string `toml:"fs_type"`
	// MkfsOptions replace the mkfs defaults when not empty.
	MkfsOptions []string `toml:"mkfs_options"`
	// AsyncRemove leaves device deletion to Cleanup (containerd's garbage
	// collector) instead of doing it inside Remove.
	AsyncRemove bool `toml:"async_remove"`
	// DeleteUnknownDevices makes start-up reconciliation delete thin devices
	// that nothing in the database explains instead of only quarantining
	// them.
	DeleteUnknownDevices bool `toml:"delete_unknown_devices"`
}

// S3Config is the [s3] section: where S3 tarball images are fetched from.
type S3Config struct {
	// Bucket is the default bucket of `pull`; empty means it must be given.
	Bucket string `toml:"bucket"`
	// Region is the bucket's region; empty means the AWS SDK's default
	// chain (AWS_REGION, ~/.aws/config).
	Region string `toml:"region"`
	// Endpoint overrides the S3 endpoint URL (S3-compatible servers).
	Endpoint string `toml:"endpoint"`
	// PathStyle addresses buckets as <endpoint>/<bucket> instead of
	// <bucket>.<endpoint>.
	PathStyle bool `toml:"path_style"`
	// Anonymous sends unsigned requests (public buckets).
	Anonymous bool `toml:"anonymous"`
	// Prefix is prepended to the image path of a pull that names no
	// bucket (`pull debian/`); an s3://BUCKET/KEY URL names its key whole.
	Prefix string `toml:"prefix"`
	// AllowedBuckets are the buckets a pull may name besides Bucket. When
	// Bucket or AllowedBuckets is set, the daemon refuses every other
	// bucket, whoever asks; when both are empty any bucket the daemon's
	// credentials reach may be pulled from.
	AllowedBuckets []string `toml:"allowed_buckets"`
	// ConnectTimeout bounds connecting to the server.
	ConnectTimeout Duration `toml:"connect_timeout"`
	// ResponseHeaderTimeout bounds the wait for a response's headers.
	ResponseHeaderTimeout Duration `toml:"response_header_timeout"`
	// IdleTimeout bounds the wait for more of a response's body.
	IdleTimeout Duration `toml:"idle_timeout"`
	// PartSize is the size of the byte-range GETs an object larger than
	// it is downloaded in, ConnectionsPerObject at a time; each part in
	// flight is held in memory.
	PartSize Size `toml:"part_size"`
	// ConnectionsPerObject is how many ranged GETs of one object are in
	// flight at once; 1 downloads every object as one stream.
	ConnectionsPerObject int `toml:"connections_per_object"`
}

// PipelineConfig is the [pipeline] section: limits of the download, unpack
// and activate state machines.
type PipelineConfig struct {
	// DownloadDir holds downloaded tarballs; empty means <root_dir>/images.
	DownloadDir string `toml:"download_dir"`
	// TarballCacheSize is the byte budget of the tarballs kept of unpacked
	// layers, least recently used out first; 0 keeps none once unpacked.
	TarballCacheSize Size `toml:"tarball_cache_size"`
	// MaxImageSize is the largest image (sum of its tarballs) accepted.
	MaxImageSize Size `toml:"max_image_size"`
	// DownloadTimeout bounds one download attempt.
	DownloadTimeout Duration `toml:"download_timeout"`
	// ExtractTimeout bounds one extraction attempt.
	ExtractTimeout Duration `toml:"extract_timeout"`
	// AllowSetID admits setuid and setgid files and file capabilities in
	// layer tarballs (the validator refuses them by default). Real
	// distribution images carry some (su, passwd, mount); turn it on only
	// for image sources you trust.
	AllowSetID bool `toml:"allow_setid"`
	// MaxEntries bounds the tar headers of one layer.
	MaxEntries int `toml:"max_entries"`
	// MaxFileSize bounds one regular file of a layer.
	MaxFileSize Size `toml:"max_file_size"`
	// MaxTotalSize bounds the regular files of one layer together, and
	// their extended attributes.
	MaxTotalSize Size `toml:"max_total_size"`
	// MaxXattrsPerEntry bounds the extended attributes of one tar entry.
	MaxXattrsPerEntry int `toml:"max_xattrs_per_entry"`
	// MaxXattrBytesPerEntry bounds the names and values of one tar entry's
	// extended attributes together.
	MaxXattrBytesPerEntry Size `toml:"max_xattr_bytes_per_entry"`
	// RequiredDirs must be real directories at the top of every pulled
	// image's tree; an empty list requires none (images built FROM
	// scratch).
	RequiredDirs []string `toml:"required_dirs"`
	// MaxLayers is the most layers (tarballs) one image may have.
	MaxLayers int `toml:"max_layers"`
}

// QueuesConfig is the [queues] section: how many state-machine runs of each
// kind may run at once.
type QueuesConfig struct {
	Downloads int `toml:"downloads"`
	Unpacking int `toml:"unpacking"`
}

// ContainerdConfig is the [containerd] section: the containerd the pipeline
// registers images in.
type ContainerdConfig struct {
	// Address is containerd's gRPC socket.
	Address string `toml:"address"`
	// Namespace is the containerd namespace images are registered in
	// when a pull names none.
	Namespace string `toml:"namespace"`
	// Snapshotter is the name containerd's config gives this daemon's
	// proxy plugin ([proxy_plugins.NAME]); images are labelled with it.
	Snapshotter string `toml:"snapshotter"`
}

// GCConfig is the [gc] section: garbage collection of the images in the
// pool, S3 and registry images alike (package fetcher/gc).
type GCConfig struct {
	// Enabled collects after every pull, every Interval, and before a
	// pull's devices are made.
	Enabled bool `toml:"enabled"`
	// HighThreshold is the pool data or metadata usage, in percent, at
	// which unused images are removed, least recently used first, until
	// usage is under LowThreshold.
	HighThreshold float64 `toml:"high_threshold"`
	LowThreshold  float64 `toml:"low_threshold"`
	// Interval spaces the collections between pulls.
	Interval Duration `toml:"interval"`
	// Pinned names images never removed.
	Pinned []string `toml:"pinned"`
}

// RetentionConfig is the [retention] section: how long the daemon keeps
// history records (metadata.Retention), forgotten in bounded batches every
// Interval.
type RetentionConfig struct {
	// Interval spaces the retention passes.
	Interval Duration `toml:"interval"`
	// RunsMaxAge and RunsMaxCount bound the finished state-machine runs
	// kept (`ls runs`): older ones, and the oldest beyond the count, go.
	RunsMaxAge   Duration `toml:"runs_max_age"`
	RunsMaxCount int      `toml:"runs_max_count"`
	// FailedImagesMaxAge is how long an image never pulled successfully is
	// kept with its failure.
	FailedImagesMaxAge Duration `toml:"failed_images_max_age"`
}

// RetentionPolicy is [retention] as the metadata package takes it.
func (c *Config) RetentionPolicy() metadata.Retention {
	r := c.Retention
	return metadata.Retention{RunsMaxAge: r.RunsMaxAge.Duration, RunsMaxCount: r.RunsMaxCount, FailedImagesMaxAge: r.FailedImagesMaxAge.Duration}
}

// defaults returns the default configuration with the derived paths still
// empty, so that a file changing daemon.root_dir moves them too.
func defaults() *Config {
	return &Config{
		Daemon: DaemonConfig{
			Socket:        DefaultSocket,
			ControlSocket: DefaultControlSocket,
			RootDir:       DefaultRootDir,
			LogLevel:      DefaultLogLevel,
			LogFormat:     DefaultLogFormat,
			SocketGroup:   DefaultSocketGroup,
		},
		Metadata: MetadataConfig{
			Synchronous: string(metadata.DefaultSynchronous),
		},
		Pool: PoolConfig{
			Name:              DefaultPoolName,
			DataSize:          DefaultDataSize,
			MetadataSize:      DefaultMetadataSize,
			BlockSize:         DefaultBlockSize,
			GrowthReserve:     DefaultGrowthReserve,
			MetadataThreshold: thinpool.DefaultMetadataThreshold,
			MinFreeSpace:      Pct(thinpool.DefaultMinFreePercent),
			NoSpaceTimeout:    D(thinpool.DefaultNoSpaceTimeout),
			BaseImageSize:     DefaultBaseImageSize,
			FSType:            DefaultFSType,
			AsyncRemove:       true,
		},
		S3: S3Config{
			ConnectTimeout:        D(s3source.DefaultConnectTimeout),
			ResponseHeaderTimeout: D(s3source.DefaultResponseHeaderTimeout),
			IdleTimeout:           D(s3source.DefaultIdleTimeout),
			PartSize:              Size(s3source.DefaultPartSize),
			ConnectionsPerObject:  s3source.DefaultConnectionsPerObject,
		},
		Pipeline: PipelineConfig{
			TarballCacheSize:      DefaultTarballCacheSize,
			MaxLayers:             s3source.DefaultMaxLayers,
			MaxImageSize:          DefaultMaxImageSize,
			DownloadTimeout:       D(DefaultDownloadTimeout),
			ExtractTimeout:        D(DefaultExtractTimeout),
			MaxEntries:            tarball.DefaultMaxEntries,
			MaxFileSize:           Size(tarball.DefaultMaxFileSize),
			MaxTotalSize:          Size(tarball.DefaultMaxTotalSize),
			MaxXattrsPerEntry:     tarball.DefaultMaxXattrs,
			MaxXattrBytesPerEntry: Size(tarball.DefaultMaxXattrBytes),
			RequiredDirs:          slices.Clone(tarball.RequiredDirs),
		},
		Queues: QueuesConfig{
			Downloads: DefaultDownloads,
			Unpacking: DefaultUnpacking,
		},
		Containerd: ContainerdConfig{
			Address:     DefaultContainerdSocket,
			Namespace:   DefaultNamespace,
			Snapshotter: pipeline.DefaultSnapshotter,
		},
		GC: GCConfig{
			Enabled:       true,
			HighThreshold: gc.DefaultHighThreshold,
			LowThreshold:  gc.DefaultLowThreshold,
			Interval:      D(gc.DefaultInterval),
		},
		Retention: RetentionConfig{
			Interval:           D(metadata.DefaultRetentionInterval),
			RunsMaxAge:         D(metadata.DefaultRunsMaxAge),
			RunsMaxCount:       metadata.DefaultRunsMaxCount,
			FailedImagesMaxAge: D(metadata.DefaultFailedImagesMaxAge),
		},
	}
}

// DefaultConfig returns the configuration used when no file is given, with
// the derived paths resolved against the default root directory. It is
// valid.
func DefaultConfig() *Config {
	c := defaults()
	c.resolve()
	return c
}

// BuiltinDefaults returns the defaults of the containerd built-in plugin's
// config: DefaultConfig's values except daemon.root_dir and the paths
// derived from it, which ResolveBuiltin takes from containerd.
func BuiltinDefaults() *Config {
	c := defaults()
	c.Daemon.RootDir = ""
	return c
}

// ResolveBuiltin completes a config that containerd decoded over
// BuiltinDefaults: an unset daemon.root_dir becomes pluginRoot (the
// plugin's directory under containerd's root), the derived paths are
// filled in, and the result is validated.
func ResolveBuiltin(c *Config, pluginRoot string) error {
	if c.Daemon.RootDir == "" {
		c.Daemon.RootDir = pluginRoot
	}
	c.resolve()
	return c.Validate()
}

// resolve fills the keys whose defaults derive from other keys and
// normalizes empty lists to nil.
func (c *Config) resolve() {
	root := c.Daemon.RootDir
	if c.Metadata.Path == "" {
		c.Metadata.Path = filepath.Join(root, "metadata.db")
	}
	if c.Pool.RootDir == "" {
		c.Pool.RootDir = filepath.Join(root, "pool")
	}
	if c.Pipeline.DownloadDir == "" {
		c.Pipeline.DownloadDir = filepath.Join(root, "images")
	}
	if len(c.Pool.MkfsOptions) == 0 {
		c.Pool.MkfsOptions = nil
	}
	if len(c.S3.AllowedBuckets) == 0 {
		c.S3.AllowedBuckets = nil
	}
	// An empty required_dirs is a choice (no layout requirement), kept
	// apart from an absent key, which keeps the default list.
	if c.Pipeline.RequiredDirs == nil {
		c.Pipeline.RequiredDirs = []string{}
	}
	if len(c.GC.Pinned) == 0 {
		c.GC.Pinned = nil
	}
}

// LoadConfig reads the TOML file at path over the defaults, resolves the
// derived paths and validates the result. An empty path returns
// DefaultConfig. Unknown keys, values of the wrong type and invalid values
// are errors, one line per problem, each starting with "config PATH" and,
// when go-toml knows it, ":LINE:COLUMN", then the dotted key and why.
func LoadConfig(path string) (*Config, error) {
	if path == "" {
		return DefaultConfig(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return ParseConfig(path, data)
}

// ParseConfig is LoadConfig on the bytes of a file; source names the file
// in errors.
func ParseConfig(source string, data []byte) (*Config, error) {
	c := defaults()
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, decodeErrors(source, data, err)
	}
	c.resolve()
	if err := c.Validate(); err != nil {
		return nil, prefixLines("config "+source+": ", err)
	}
	return c, nil
}

// prefixLines puts prefix in front of every line of err's message; the
// result unwraps to err.
func prefixLines(prefix string, err error) error {
	lines := strings.Split(err.Error(), "\n")
	return &configError{msg: prefix + strings.Join(lines, "\n"+prefix), err: err}
}

// configError is a reformatted error that still unwraps to the original.
type configError struct {
	msg string
	err error
}

func (e *configError) Error() string { return e.msg }
func (e *configError) Unwrap() error { return e.err }

// decodeErrors turns go-toml's errors into one line per problem naming the
// file, the position and the dotted key.
func decodeErrors(source string, data []byte, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var lines []string
		for i := range strict.Errors {
			e := &strict.Errors[i]
			row, col := e.Position()
			what := "unknown key"
			if strings.Contains(e.Error(), "table") {
				what = "unknown table"
			}
			lines = append(lines, fmt.Sprintf("config %s:%d:%d: %s %q", source, row, col, what, strings.Join(e.Key(), ".")))
		}
		return &configError{msg: strings.Join(lines, "\n"), err: err}
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		if k := de.Key(); len(k) > 0 {
			msg = strings.Join(k, ".") + ": " + msg
		}
		return &configError{msg: fmt.Sprintf("config %s:%d:%d: %s", source, row, col, msg), err: err}
	}
	// go-toml returns a TextUnmarshaler's error without its key when the
	// TOML value was not a string (an integer duration, a float size):
	// find the key by type.
	if key := misTypedKey(data); key != "" {
		return fmt.Errorf("config %s: %s: %w", source, key, err)
	}
	return fmt.Errorf("config %s: %w", source, err)
}

// misTypedKey returns the dotted key of the first Size that holds neither a
// string nor an integer, or Duration or Percent that holds no string, in
// the document.
func misTypedKey(data []byte) string {
	var doc map[string]any
	if toml.Unmarshal(data, &doc) != nil {
		return ""
	}
	sizeT, durT, pctT := reflect.TypeOf(Size(0)), reflect.TypeOf(Duration{}), reflect.TypeOf(Percent{})
	rt := reflect.TypeOf(Config{})
	for i := 0; i < rt.NumField(); i++ {
		sec := rt.Field(i).Tag.Get("toml")
		table, _ := doc[sec].(map[string]any)
		st := rt.Field(i).Type
		for j := 0; j < st.NumField(); j++ {
			f := st.Field(j)
			v, ok := table[f.Tag.Get("toml")]
			if !ok {
				continue
			}
			_, isString := v.(string)
			_, isInt := v.(int64)
			if (f.Type == sizeT && !isString && !isInt) || ((f.Type == durT || f.Type == pctT) && !isString) {
				return sec + "." + f.Tag.Get("toml")
			}
		}
	}
	return ""
}

// MarshalConfig writes c as TOML that LoadConfig reads back to an equal
// Config (sizes with binary units, durations as Go duration strings).
func MarshalConfig(c *Config) ([]byte, error) {
	b, err := toml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("marshal config: %w", err)
	}
	return b, nil
}

// Limits enforced by Validate.
const (
	minBlockSize    = 64 << 10 // 128 sectors, the kernel's minimum
	maxBlockSize    = 1 << 30  // 2097152 sectors, the kernel's maximum
	minMetadataSize = 2 << 20
	// The kernel uses at most 255 * 2^14 * 8 sectors (15.9 GiB) of a thin
	// pool's metadata device.
	maxMetadataSize  = 16 << 30
	minBaseImageSize = 16 << 20
	minDataSize      = 16 << 20
	maxQueue         = 64
	// sun_path holds 108 bytes including the terminating NUL.
	maxSocketPath = 107
	// DM_NAME_LEN is 128 including the NUL; leave room for device suffixes.
	maxPoolName = 96
	// A reserve over half the pool would leave images less room than the
	// containers' writes.
	maxMinFreeSpace = 50
	// The kernel queues a full pool's writes at most this long here: a
	// writer hung longer than an hour is an outage, not a wait.
	maxNoSpaceTimeout = time.Hour
)

// KeyMinFreeSpace is the key of the reserve, which refusals name so the
// operator knows what to change.
const KeyMinFreeSpace = "pool.min_free_space"

var (
	poolNameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)
	bucketNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
)

// Validate checks every key and returns one error per bad value, joined,
// each starting with the dotted key ("pool.block_size: ...") and saying
// what it must be and what it got. It expects derived paths to be resolved
// (LoadConfig and DefaultConfig do that).
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
	}
	absPath := func(key, p string, optional bool) {
		switch {
		case p == "" && optional:
		case p == "":
			bad(key, "must be an absolute path, got an empty value")
		case !filepath.IsAbs(p):
			bad(key, "must be an absolute path, got %q", p)
		}
	}
	socket := func(key, p string, optional bool) {
		absPath(key, p, optional)
		if len(p) > maxSocketPath {
			bad(key, "unix socket path must be at most %d bytes, got %d (%q)", maxSocketPath, len(p), p)
		}
	}
	positiveDuration := func(key string, d Duration) {
		if d.Duration <= 0 {
			bad(key, "must be a positive duration such as \"30m\", got %q", d.String())
		}
	}

	d := c.Daemon
	socket("daemon.socket", d.Socket, false)
	socket("daemon.control_socket", d.ControlSocket, true)
	if d.ControlSocket != "" && d.ControlSocket == d.Socket {
		bad("daemon.control_socket", "must differ from daemon.socket, both are %q", d.Socket)
	}
	absPath("daemon.root_dir", d.RootDir, false)
	switch d.LogLevel {
	case "trace", "debug", "info", "warn", "error", "fatal", "panic":
	default:
		bad("daemon.log_level", "must be one of trace, debug, info, warn, error, fatal, panic, got %q", d.LogLevel)
	}
	switch d.LogFormat {
	case string(log.TextFormat), string(log.JSONFormat):
	default:
		bad("daemon.log_format", "must be %q or %q, got %q", log.TextFormat, log.JSONFormat, d.LogFormat)
	}
	if d.MetricsAddress != "" {
		if _, port, err := net.SplitHostPort(d.MetricsAddress); err != nil || port == "" {
			bad("daemon.metrics_address", "must be host:port (e.g. \"127.0.0.1:9123\") or empty to disable, got %q", d.MetricsAddress)
		}
	}

	absPath("metadata.path", c.Metadata.Path, false)
	if metadata.Synchronous(c.Metadata.Synchronous).Validate() != nil {
		bad("metadata.synchronous", "must be %q or %q, got %q", metadata.SynchronousFull, metadata.SynchronousNormal, c.Metadata.Synchronous)
	}

	p := c.Pool
	switch {
	case p.Name == "":
		bad("pool.name", "must not be empty")
	case len(p.Name) > maxPoolName || !poolNameRE.MatchString(p.Name):
		bad("pool.name", "must be at most %d characters of letters, digits and ._+- starting with a letter or digit (a device-mapper name), got %q", maxPoolName, p.Name)
	}
	absPath("pool.root_dir", p.RootDir, false)
	absPath("pool.data_device", p.DataDevice, true)
	absPath("pool.metadata_device", p.MetadataDevice, true)
	if (p.DataDevice == "") != (p.MetadataDevice == "") {
		if p.DataDevice == "" {
			bad("pool.data_device", "must be set when pool.metadata_device is set (give both devices or neither)")
		} else {
			bad("pool.metadata_device", "must be set when pool.data_device is set (give both devices or neither)")
		}
	}
	if p.DataDevice != "" && p.DataDevice == p.MetadataDevice {
		bad("pool.metadata_device", "must differ from pool.data_device, both are %q", p.DataDevice)
	}
	blockOK := p.BlockSize >= minBlockSize && p.BlockSize <= maxBlockSize && p.BlockSize%minBlockSize == 0
	if !blockOK {
		bad("pool.block_size", "must be a multiple of 128 sectors (64 KiB) between 64 KiB and 1 GiB, got %s", p.BlockSize)
	}
	if p.DataDevice == "" {
		switch {
		case p.DataSize < minDataSize || p.DataSize%512 != 0:
			bad("pool.data_size", "must be a multiple of 512 bytes and at least 16MiB, got %s", p.DataSize)
		case blockOK && p.DataSize < p.BlockSize:
			bad("pool.data_size", "must hold at least one data block of pool.block_size %s, got %s", p.BlockSize, p.DataSize)
		}
		if p.MetadataSize < minMetadataSize || p.MetadataSize > maxMetadataSize || p.MetadataSize%4096 != 0 {
			bad("pool.metadata_size", "must be a multiple of 4KiB between 2MiB and 16GiB (the kernel uses at most 15.9GiB), got %s", p.MetadataSize)
		}
		if blockOK && p.DataSize >= minDataSize {
			if blocks := uint64(p.DataSize / p.BlockSize); p.LowWaterMark >= blocks {
				bad("pool.low_water_mark", "must be fewer than the pool's %d data blocks (pool.data_size / pool.block_size), got %d", blocks, p.LowWaterMark)
			}
		}
		if p.MaxDataSize != 0 && (p.MaxDataSize < p.DataSize || p.MaxDataSize%512 != 0) {
			bad("pool.max_data_size", "must be 0 (no growth) or a multiple of 512 bytes at least pool.data_size %s, got %s", p.DataSize, p.MaxDataSize)
		}
		if p.GrowthReserve < 0 {
			bad("pool.growth_reserve", "must not be negative, got %s", p.GrowthReserve)
		}
	} else if p.MaxDataSize != 0 {
		bad("pool.max_data_size", "must be 0 when pool.data_device is set (only a loop-file pool grows), got %s", p.MaxDataSize)
	}
	if !(p.MetadataThreshold > 0 && p.MetadataThreshold <= 100) {
		bad("pool.metadata_threshold", "must be a percent above 0 and at most 100, got %v", p.MetadataThreshold)
	}
	if v := p.MinFreeSpace.Value(); v < 0 || v > maxMinFreeSpace {
		bad(KeyMinFreeSpace, "must be between 0%% (no reserve) and %s, got %s", Pct(maxMinFreeSpace), p.MinFreeSpace)
	}
	if t := p.NoSpaceTimeout.Duration; t < time.Second || t > maxNoSpaceTimeout || t%time.Second != 0 {
		bad("pool.no_space_timeout", "must be whole seconds between 1s and %s (the kernel counts seconds; 0, waiting forever, would hang every writer of a full pool), got %q",
			maxNoSpaceTimeout, p.NoSpaceTimeout.String())
	}
	if p.BaseImageSize < minBaseImageSize || p.BaseImageSize%512 != 0 {
		bad("pool.base_image_size", "must be a multiple of 512 bytes and at least 16MiB, got %s", p.BaseImageSize)
	}
	if p.FSType != "ext4" && p.FSType != "xfs" {
		bad("pool.fs_type", "must be \"ext4\" or \"xfs\", got %q", p.FSType)
	}
	for i, o := range p.MkfsOptions {
		if strings.TrimSpace(o) == "" {
			bad(fmt.Sprintf("pool.mkfs_options[%d]", i), "must not be empty")
		}
	}

	if _, err := c.SocketGID(); err != nil {
		bad("daemon.socket_group", "%v", err)
	}

	s := c.S3
	bucketName := func(key, b string) {
		if !bucketNameRE.MatchString(b) || strings.Contains(b, "..") {
			bad(key, "must be an S3 bucket name (3-63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit), got %q", b)
		}
	}
	if s.Bucket != "" {
		bucketName("s3.bucket", s.Bucket)
	}
	for i, b := range s.AllowedBuckets {
		bucketName(fmt.Sprintf("s3.allowed_buckets[%d]", i), b)
	}
	if s.Endpoint != "" {
		u, err := url.Parse(s.Endpoint)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			bad("s3.endpoint", "must be an http:// or https:// URL with a host, got %q", redactURL(s.Endpoint))
		case u.User != nil:
			bad("s3.endpoint", "must not carry user information (user:password@; S3 credentials come from the AWS credential chain), got %q", redactURL(s.Endpoint))
		}
	}
	if strings.HasPrefix(s.Prefix, "/") {
		bad("s3.prefix", "must not start with '/' (S3 keys have no leading slash), got %q", s.Prefix)
	}
	positiveDuration("s3.connect_timeout", s.ConnectTimeout)
	positiveDuration("s3.response_header_timeout", s.ResponseHeaderTimeout)
	positiveDuration("s3.idle_timeout", s.IdleTimeout)
	if s.PartSize < s3source.MinPartSize || s.PartSize > s3source.MaxPartSize {
		bad("s3.part_size", "must be between %s and %s, got %s", Size(s3source.MinPartSize), Size(s3source.MaxPartSize), s.PartSize)
	}
	if n := s.ConnectionsPerObject; n < 1 || n > s3source.MaxConnectionsPerObject {
		bad("s3.connections_per_object", "must be between 1 and %d, got %d", s3source.MaxConnectionsPerObject, n)
	}

	pl := c.Pipeline
	absPath("pipeline.download_dir", pl.DownloadDir, false)
	// Limits are added to and multiplied when the pipelines bound what they
	// read: tarball's maxima keep those sums far from overflowing.
	limitBytes := func(key string, v Size) {
		if v <= 0 || v > tarball.MaxLimitBytes {
			bad(key, "must be positive and at most %s (larger sizes overflow the byte counts derived from it), got %s", Size(tarball.MaxLimitBytes), v)
		}
	}
	limitCount := func(key string, v int) {
		if v <= 0 || v > tarball.MaxLimitCount {
			bad(key, "must be positive and at most %d (larger counts overflow the byte counts derived from it), got %d", tarball.MaxLimitCount, v)
		}
	}
	if pl.TarballCacheSize < 0 || pl.TarballCacheSize > tarball.MaxLimitBytes {
		bad("pipeline.tarball_cache_size", "must be at least 0 and at most %s, got %s", Size(tarball.MaxLimitBytes), pl.TarballCacheSize)
	}
	limitBytes("pipeline.max_image_size", pl.MaxImageSize)
	positiveDuration("pipeline.download_timeout", pl.DownloadTimeout)
	positiveDuration("pipeline.extract_timeout", pl.ExtractTimeout)
	limitCount("pipeline.max_entries", pl.MaxEntries)
	limitBytes("pipeline.max_file_size", pl.MaxFileSize)
	limitBytes("pipeline.max_total_size", pl.MaxTotalSize)
	limitCount("pipeline.max_xattrs_per_entry", pl.MaxXattrsPerEntry)
	limitBytes("pipeline.max_xattr_bytes_per_entry", pl.MaxXattrBytesPerEntry)
	for i, d := range pl.RequiredDirs {
		if d == "" || d == "." || d == ".." || strings.ContainsRune(d, '/') {
			bad(fmt.Sprintf("pipeline.required_dirs[%d]", i), "must be one top-level directory name such as \"etc\" (no '/', not \".\" or \"..\"), got %q", d)
		}
	}
	if pl.MaxLayers < 1 {
		bad("pipeline.max_layers", "must be at least 1, got %d", pl.MaxLayers)
	}

	if q := c.Queues.Downloads; q < 1 || q > maxQueue {
		bad("queues.downloads", "must be between 1 and %d, got %d", maxQueue, q)
	}
	if q := c.Queues.Unpacking; q < 1 || q > maxQueue {
		bad("queues.unpacking", "must be between 1 and %d, got %d", maxQueue, q)
	}

	socket("containerd.address", strings.TrimPrefix(c.Containerd.Address, "unix://"), false)
	if err := identifiers.Validate(c.Containerd.Namespace); err != nil {
		bad("containerd.namespace", "must be a containerd namespace (letters, digits and ._- separators, at most 76 characters), got %q", c.Containerd.Namespace)
	}
	if err := identifiers.Validate(c.Containerd.Snapshotter); err != nil {
		bad("containerd.snapshotter", "must be the name of the proxy plugin in containerd's config (letters, digits and ._- separators, at most 76 characters), got %q", c.Containerd.Snapshotter)
	}

	if err := gc.ValidateThresholds(c.GC.HighThreshold, c.GC.LowThreshold); err != nil {
		bad("gc.high_threshold", "%v", err)
	} else if edge := 100 - p.MinFreeSpace.Value(); c.GC.Enabled && c.GC.HighThreshold > edge {
		bad("gc.high_threshold", "must be at most %v%% (100%% less %s %s): collection starts at the low-water event of the reserve, and must find the pool past this threshold there, got %v%%",
			edge, KeyMinFreeSpace, p.MinFreeSpace, c.GC.HighThreshold)
	}
	positiveDuration("gc.interval", c.GC.Interval)
	positiveDuration("retention.interval", c.Retention.Interval)
	positiveDuration("retention.runs_max_age", c.Retention.RunsMaxAge)
	positiveDuration("retention.failed_images_max_age", c.Retention.FailedImagesMaxAge)
	if c.Retention.RunsMaxCount <= 0 {
		bad("retention.runs_max_count", "must be positive, got %d", c.Retention.RunsMaxCount)
	}
	for i, n := range c.GC.Pinned {
		if strings.TrimSpace(n) == "" {
			bad(fmt.Sprintf("gc.pinned[%d]", i), "must not be empty")
		}
	}
	return errors.Join(errs...)
}

// SocketGID resolves daemon.socket_group: a group id, or a group name
// looked up in the group database.
func (c *Config) SocketGID() (int, error) {
	g := c.Daemon.SocketGroup
	if id, err := strconv.Atoi(g); err == nil {
		if id < 0 {
			return 0, fmt.Errorf("must be a group name or a non-negative id, got %d", id)
		}
		return id, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("must be a group name or id: %w", err)
	}
	return strconv.Atoi(grp.Gid)
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
