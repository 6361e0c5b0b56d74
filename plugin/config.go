// Package plugin holds the daemon's TOML configuration, composed of the
// sections each package owns with their defaults and rules, the wiring
// that builds the whole service from a Config, and the containerd plugin
// registration that links the snapshotter into a custom containerd build.
// Its own rules are the ones no single package can judge: the rules that
// join sections (the GC threshold against the pool's reserve, paths
// derived from the root directory) and which S3 buckets the daemon may
// pull from.
package plugin

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/log"
	toml "github.com/pelletier/go-toml/v2"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/differ"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// Defaults of the [daemon] keys; every other section's defaults are its
// package's (DefaultConfig).
const (
	DefaultRootDir   = "/var/lib/containerd-flyio-snapshotter"
	DefaultSocket    = "/run/containerd-flyio-snapshotter/containerd-flyio-snapshotter.sock"
	DefaultLogLevel  = "info"
	DefaultLogFormat = "text"
)

// Config is the whole daemon configuration: one TOML file with a table per
// section. Each section is the configuration of the package that uses it
// (embedded where a section serves several packages), which owns its
// defaults and its rules; Config adds the [daemon] section, the paths
// derived from daemon.root_dir (filled in by LoadConfig) and the rules
// that tie sections together.
type Config struct {
	Daemon     DaemonConfig              `toml:"daemon"`
	Metadata   metadata.Options          `toml:"metadata"`
	Pool       PoolConfig                `toml:"pool"`
	S3         S3Config                  `toml:"s3"`
	Pipeline   PipelineConfig            `toml:"pipeline"`
	Queues     pipeline.QueuesConfig     `toml:"queues"`
	Containerd pipeline.ContainerdConfig `toml:"containerd"`
	Differ     differ.Config             `toml:"differ"`
	GC         gc.Config                 `toml:"gc"`
	Retention  pipeline.RetentionConfig  `toml:"retention"`
}

// DaemonConfig is the [daemon] section: where the daemon listens and keeps
// its state.
type DaemonConfig struct {
	// Socket is the unix socket of the snapshots gRPC service that
	// containerd's [proxy_plugins] entry names.
	Socket string `toml:"socket"`
	// control_socket, the unix socket of the daemon's operator API
	// (empty disables it), is defined with its client.
	control.Config
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
	// DebugAddress is the host:port of the debug endpoint: Go's profiler
	// under /debug/pprof/ and the health check /healthz; empty disables
	// it.
	DebugAddress string `toml:"debug_address"`
	// SocketGroup is the group (a name or a number) given the control
	// socket: its members, and root, may use it. Socket is root's alone
	// (DaemonSocketMode).
	SocketGroup string `toml:"socket_group"`
	// GzipCommand says how gzip layers are inflated, S3 layers and the
	// registry layers the diff service applies alike: tarball's
	// GzipCommandAuto, GzipCommandBuiltin or a program's path (see
	// InflateWith).
	GzipCommand string `toml:"gzip_command"`
}

// PoolConfig is the [pool] section: the thin pool's keys (thinpool.Config)
// and those of the devices the snapshotter makes in it (DevicesConfig).
type PoolConfig struct {
	thinpool.Config
	DevicesConfig
}

// DevicesConfig is snapshotter.Config, named apart from thinpool.Config
// so that PoolConfig can embed both.
type DevicesConfig = snapshotter.Config

// Validate checks the [pool] keys, the pool's and the devices'.
func (c PoolConfig) Validate() error {
	return errors.Join(c.Config.Validate(), c.DevicesConfig.Validate())
}

// S3Config is the [s3] section: the pull policy's keys (which buckets a
// pull may name, and where a path without a bucket is looked up) and the
// S3 client's (s3source.Config).
type S3Config struct {
	// Bucket is the default bucket of `pull`; empty means it must be given.
	Bucket string `toml:"bucket"`
	// Prefix is prepended to the image path of a pull that names no
	// bucket (`pull debian/`); an s3://BUCKET/KEY URL names its key whole.
	// It is a folder of the bucket: empty, or ending with '/'.
	Prefix string `toml:"prefix"`
	// AllowedBuckets are the buckets a pull may name besides Bucket. When
	// Bucket or AllowedBuckets is set, the daemon refuses every other
	// bucket, whoever asks; when both are empty any bucket the daemon's
	// credentials reach may be pulled from.
	AllowedBuckets []string `toml:"allowed_buckets"`
	s3source.Config
}

// Validate checks the [s3] keys, the pull policy's and the client's.
func (c S3Config) Validate() error {
	var p conf.Problems
	if c.Bucket != "" {
		s3source.CheckBucketName(&p, "s3.bucket", c.Bucket)
	}
	for i, b := range c.AllowedBuckets {
		s3source.CheckBucketName(&p, fmt.Sprintf("s3.allowed_buckets[%d]", i), b)
	}
	if strings.HasPrefix(c.Prefix, "/") {
		p.Add("s3.prefix", "must not start with '/' (S3 keys have no leading slash), got %q", c.Prefix)
	} else if c.Prefix != "" && !strings.HasSuffix(c.Prefix, "/") {
		// Prepended as written, "images" would make `pull debian/` pull
		// imagesdebian/.
		p.Add("s3.prefix", "must end with '/' (a folder of the bucket, such as %q), got %q", c.Prefix+"/", c.Prefix)
	}
	p.Join(c.Config.Validate())
	return p.Err()
}

// PipelineConfig is the [pipeline] section: the pipelines' keys, the
// tarball cache's (trimmed by gc) and the extraction policy's.
type PipelineConfig struct {
	pipeline.Config
	gc.TarballCacheConfig
	tarball.PolicyConfig
}

// Validate checks the [pipeline] keys of the three packages.
func (c PipelineConfig) Validate() error {
	return errors.Join(c.Config.Validate(), c.TarballCacheConfig.Validate(), c.PolicyConfig.Validate())
}

// defaults returns the default configuration with the derived paths still
// empty, so that a file changing daemon.root_dir moves them too.
func defaults() *Config {
	return &Config{
		Daemon: DaemonConfig{
			Socket:      DefaultSocket,
			Config:      control.Config{ControlSocket: control.DefaultSocket},
			RootDir:     DefaultRootDir,
			LogLevel:    DefaultLogLevel,
			LogFormat:   DefaultLogFormat,
			SocketGroup: DefaultSocketGroup,
			GzipCommand: tarball.GzipCommandAuto,
		},
		Metadata:   metadata.DefaultOptions(),
		Pool:       PoolConfig{thinpool.DefaultConfig(), snapshotter.DefaultConfig()},
		S3:         S3Config{Config: s3source.DefaultConfig()},
		Pipeline:   PipelineConfig{pipeline.DefaultConfig(), gc.DefaultTarballCacheConfig(), tarball.DefaultPolicyConfig()},
		Queues:     pipeline.DefaultQueuesConfig(),
		Containerd: pipeline.DefaultContainerdConfig(),
		Differ:     differ.DefaultConfig(),
		GC:         gc.DefaultConfig(),
		Retention:  pipeline.DefaultRetentionConfig(),
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

// builtinSections are the sections the built-in plugin reads: it opens
// the database and the pool and serves snapshots from them (Open), with
// daemon.root_dir beside them; the S3 pipelines, image collection,
// retention, the diff service, metrics and the sockets run only under
// the daemon's serve.
var builtinSections = map[string]bool{"metadata": true, "pool": true}

// builtinUnread are the keys of builtinSections the built-in plugin does
// not read: the pool grows only where the daemon handles its low-water
// events (watchPool) and collects images (gc's Grow).
var builtinUnread = map[string]bool{"pool.max_data_size": true, "pool.growth_reserve": true}

// ResolveBuiltin completes a config that containerd decoded over
// BuiltinDefaults: an unset daemon.root_dir becomes pluginRoot (the
// plugin's directory under containerd's root), the derived paths are
// filled in, and the result is validated. A key the built-in plugin does
// not read set to other than its default is refused, named, like an
// unknown key: it would be validated and then ignored.
func ResolveBuiltin(c *Config, pluginRoot string) error {
	if c.Daemon.RootDir == "" {
		c.Daemon.RootDir = pluginRoot
	}
	c.resolve()
	var p conf.Problems
	p.Join(c.Validate())
	def := BuiltinDefaults()
	def.Daemon.RootDir = c.Daemon.RootDir
	def.resolve()
	have, want := reflect.ValueOf(c).Elem(), reflect.ValueOf(def).Elem()
	for _, f := range configFields() {
		key := f.Section + "." + f.Key
		if builtinSections[f.Section] && !builtinUnread[key] || key == "daemon.root_dir" {
			continue
		}
		if !reflect.DeepEqual(have.FieldByIndex(f.Index).Interface(), want.FieldByIndex(f.Index).Interface()) {
			p.Add(key, "is not used by the built-in plugin, which reads only [metadata], [pool] but its growth, and daemon.root_dir (the rest is the daemon's, under serve): remove it")
		}
	}
	return p.Err()
}

// MountDir is where the diff service mounts the snapshots it applies
// layers onto, under daemon.root_dir: the daemon clears it at its start.
func (c *Config) MountDir() string { return filepath.Join(c.Daemon.RootDir, "tmpmounts") }

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
	if err := caseMismatches(source, data); err != nil {
		return nil, err
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
		// go-toml names the key of a value of the wrong type in full, but
		// that of a key set twice without its table, and none for a
		// value it cannot parse (an unquoted "10GiB"): the line says.
		key := strings.Join(de.Key(), ".")
		if len(de.Key()) <= 1 {
			if k := keyAt(data, row); k != "" {
				key = k
			}
		}
		if key != "" {
			msg = key + ": " + msg
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

// caseMismatches refuses the tables and keys of the document data that
// name a known one in another case: go-toml matches keys to fields
// ignoring case, where TOML keys are case-sensitive, so [Daemon] would be
// read as [daemon], and with both in one file the later silently wins.
func caseMismatches(source string, data []byte) error {
	var doc map[string]any
	if toml.Unmarshal(data, &doc) != nil {
		return nil // the decode that accepted data said what it held
	}
	known := map[string]map[string]bool{}
	for _, f := range configFields() {
		if known[f.Section] == nil {
			known[f.Section] = map[string]bool{}
		}
		known[f.Section][f.Key] = true
	}
	// meant is the known name in names that name equals but for case.
	meant := func(name string, names map[string]bool) string {
		for n := range names {
			if strings.EqualFold(n, name) {
				return n
			}
		}
		return ""
	}
	var lines []string
	refuse := func(what, key, want string) {
		at := ""
		if row := rowOf(data, key, what == "unknown table"); row > 0 {
			at = fmt.Sprintf(":%d:1", row)
		}
		lines = append(lines, fmt.Sprintf("config %s%s: %s %q (keys are case-sensitive: did you mean %q?)", source, at, what, key, want))
	}
	sections := slices.Sorted(maps.Keys(doc))
	for _, sec := range sections {
		keys, ok := known[sec]
		if !ok {
			sectionNames := map[string]bool{}
			for n := range known {
				sectionNames[n] = true
			}
			refuse("unknown table", sec, meant(sec, sectionNames))
			continue
		}
		table, _ := doc[sec].(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(table)) {
			if !keys[k] {
				refuse("unknown key", sec+"."+k, sec+"."+meant(k, keys))
			}
		}
	}
	if len(lines) == 0 {
		return nil
	}
	return &configError{msg: strings.Join(lines, "\n")}
}

// rowOf returns the line (from 1) of data that opens table key (table)
// or sets the dotted key, or 0 when none does.
func rowOf(data []byte, key string, table bool) int {
	for i, line := range strings.Split(string(data), "\n") {
		if table {
			if h := tomlHeader.FindStringSubmatch(line); h != nil && strings.Join(strings.Fields(h[1]), "") == key {
				return i + 1
			}
		} else if keyAt(data, i+1) == key {
			return i + 1
		}
	}
	return 0
}

var (
	// tomlHeader is a line opening a table: [section].
	tomlHeader = regexp.MustCompile(`^\s*\[\s*([A-Za-z0-9_-]+(?:\s*\.\s*[A-Za-z0-9_-]+)*)\s*\]\s*(?:#.*)?$`)
	// tomlAssign is a line setting a bare (maybe dotted) key.
	tomlAssign = regexp.MustCompile(`^\s*([A-Za-z0-9_-]+(?:\s*\.\s*[A-Za-z0-9_-]+)*)\s*=`)
)

// keyAt returns the dotted key that line row (from 1) of the TOML document
// data sets, with the table opened last before it, or "" when that line
// sets no key (a header, the rest of a value begun above).
func keyAt(data []byte, row int) string {
	lines := strings.Split(string(data), "\n")
	if row < 1 || row > len(lines) {
		return ""
	}
	m := tomlAssign.FindStringSubmatch(lines[row-1])
	if m == nil {
		return ""
	}
	var parts []string
	for _, line := range lines[:row-1] {
		if h := tomlHeader.FindStringSubmatch(line); h != nil {
			parts = strings.Split(h[1], ".")
		}
	}
	parts = append(slices.Clone(parts), strings.Split(m[1], ".")...)
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return strings.Join(parts, ".")
}

// misTypedKey returns the dotted key of the first Size, Duration or
// Percent of the document whose value, decoded alone, fails: the key the
// error was about, whatever the other keys hold.
func misTypedKey(data []byte) string {
	var doc map[string]any
	if toml.Unmarshal(data, &doc) != nil {
		return ""
	}
	sizeT, durT, pctT := reflect.TypeOf(Size(0)), reflect.TypeOf(Duration{}), reflect.TypeOf(Percent{})
	for _, k := range configFields() {
		if k.Type != sizeT && k.Type != durT && k.Type != pctT {
			continue
		}
		table, _ := doc[k.Section].(map[string]any)
		v, ok := table[k.Key]
		if !ok {
			continue
		}
		alone, err := toml.Marshal(map[string]any{k.Section: map[string]any{k.Key: v}})
		if err != nil {
			continue
		}
		var c Config
		if toml.Unmarshal(alone, &c) != nil {
			return k.Section + "." + k.Key
		}
	}
	return ""
}

// configField is one key of the configuration file.
type configField struct {
	Section, Key string
	Type         reflect.Type
	// Index is the field's index path in Config (reflect.Value.FieldByIndex).
	Index []int
}

// configFields lists every key of Config, section by section, in field
// order: the fields of a section's struct and of the structs it embeds,
// as go-toml reads them, leaving out those tagged "-".
func configFields() []configField {
	var out []configField
	var walk func(sec string, t reflect.Type, index []int)
	walk = func(sec string, t reflect.Type, index []int) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			idx := append(slices.Clone(index), i)
			tag := f.Tag.Get("toml")
			switch {
			case f.Anonymous && tag == "":
				walk(sec, f.Type, idx)
			case tag != "" && tag != "-":
				out = append(out, configField{Section: sec, Key: tag, Type: f.Type, Index: idx})
			}
		}
	}
	rt := reflect.TypeOf(Config{})
	for i := 0; i < rt.NumField(); i++ {
		walk(rt.Field(i).Tag.Get("toml"), rt.Field(i).Type, []int{i})
	}
	return out
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

// Validate checks every key and returns one error per bad value, joined,
// each starting with the dotted key ("pool.block_size: ...") and saying
// what it must be and what it got. Each section's package checks its own
// keys; Validate checks [daemon] and the rules between sections. It
// expects derived paths to be resolved (LoadConfig and DefaultConfig do
// that).
func (c *Config) Validate() error {
	var p conf.Problems
	d := c.Daemon
	p.SocketPath("daemon.socket", d.Socket, false)
	p.SocketPath("daemon.control_socket", d.ControlSocket, true)
	if d.ControlSocket != "" && d.ControlSocket == d.Socket {
		p.Add("daemon.control_socket", "must differ from daemon.socket, both are %q", d.Socket)
	}
	p.AbsPath("daemon.root_dir", d.RootDir, false)
	switch d.LogLevel {
	case "trace", "debug", "info", "warn", "error", "fatal", "panic":
	default:
		p.Add("daemon.log_level", "must be one of trace, debug, info, warn, error, fatal, panic, got %q", d.LogLevel)
	}
	switch d.LogFormat {
	case string(log.TextFormat), string(log.JSONFormat):
	default:
		p.Add("daemon.log_format", "must be %q or %q, got %q", log.TextFormat, log.JSONFormat, d.LogFormat)
	}
	if d.MetricsAddress != "" && !listenAddress(d.MetricsAddress) {
		p.Add("daemon.metrics_address", "must be host:port with a port up to 65535 (e.g. \"127.0.0.1:9123\") or empty to disable, got %q", d.MetricsAddress)
	}
	if d.DebugAddress != "" {
		if !listenAddress(d.DebugAddress) {
			p.Add("daemon.debug_address", "must be host:port with a port up to 65535 (e.g. \"127.0.0.1:9124\") or empty to disable, got %q", d.DebugAddress)
		} else if d.DebugAddress == d.MetricsAddress {
			p.Add("daemon.debug_address", "must differ from daemon.metrics_address, both are %q", d.DebugAddress)
		}
	}
	if _, err := c.SocketGID(); err != nil {
		p.Add("daemon.socket_group", "%v", err)
	}
	tarball.CheckGzipCommand(&p, "daemon.gzip_command", d.GzipCommand)

	p.Join(c.Metadata.Validate())
	p.Join(c.Pool.Validate())
	p.Join(c.S3.Validate())
	p.Join(c.Pipeline.Validate())
	p.Join(c.Queues.Validate())
	p.Join(c.Containerd.Validate())
	p.Join(c.Differ.Validate())
	p.Join(c.GC.Validate())
	p.Join(c.Retention.Validate())

	// Collection starts at the low-water event, which comes at the edge
	// of the pool's reserve: the threshold must be crossed by then.
	if edge := 100 - c.Pool.MinFreeSpace.Value(); c.GC.Enabled && c.GC.HighThreshold > edge && gc.ValidateThresholds(c.GC.HighThreshold, c.GC.LowThreshold) == nil {
		p.Add("gc.high_threshold", "must be at most %v%% (100%% less %s %s): collection starts at the low-water event of the reserve, and must find the pool past this threshold there, got %v%%",
			edge, thinpool.KeyMinFreeSpace, c.Pool.MinFreeSpace, c.GC.HighThreshold)
	}
	// New devices are refused from the metadata threshold on; collection
	// frees metadata only from its high threshold on, so it must start
	// first or the pool stays stuck in between.
	if c.GC.Enabled && c.GC.HighThreshold > c.Pool.MetadataThreshold && c.Pool.Validate() == nil && c.GC.Validate() == nil {
		p.Add("gc.high_threshold", "must be at most pool.metadata_threshold (%v): new devices are refused from that metadata use on, and collection frees metadata only from this threshold on, got %v",
			c.Pool.MetadataThreshold, c.GC.HighThreshold)
	}
	return p.Err()
}

// listenAddress reports whether addr is a host:port a TCP listener can
// take: a port from 0 to 65535 or a service name of the host's, which
// only net.Listen would refuse otherwise, once the pool is open.
func listenAddress(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return false
	}
	_, err = net.LookupPort("tcp", port)
	return err == nil
}

// InflateWith is the program daemon.gzip_command names for the
// extractions (tarball.ExtractOptions.GzipCommand): "" for the built-in
// inflater.
func (c *Config) InflateWith() string { return tarball.ResolveGzipCommand(c.Daemon.GzipCommand) }

// maxGID is the largest id a socket can be given: the kernel's gid_t is
// 32 bits, cutting a larger id down to another group's, and (gid_t)-1
// asks chown to leave the group as it is.
const maxGID = math.MaxUint32 - 1

// SocketGID resolves daemon.socket_group: a group id, or a group name
// looked up in the group database.
func (c *Config) SocketGID() (int, error) {
	g := c.Daemon.SocketGroup
	if id, err := strconv.ParseInt(g, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if err != nil || id < 0 || id > maxGID {
			return 0, fmt.Errorf("must be a group name or an id from 0 to %d, got %q", maxGID, g)
		}
		return int(id), nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("must be a group name or id: %w", err)
	}
	return strconv.Atoi(grp.Gid)
}
