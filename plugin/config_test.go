package plugin

import (
	"archive/tar"
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/differ"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultConfigIsValidAndDerivesPaths(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	want := map[string]string{
		"metadata.path":          "/var/lib/containerd-flyio-snapshotter/metadata.db",
		"pool.root_dir":          "/var/lib/containerd-flyio-snapshotter/pool",
		"pipeline.download_dir":  "/var/lib/containerd-flyio-snapshotter/images",
		"daemon.socket":          "/run/containerd-flyio-snapshotter/containerd-flyio-snapshotter.sock",
		"containerd.address":     "/run/containerd/containerd.sock",
		"containerd.namespace":   "default",
		"containerd.snapshotter": "flyio",
		"pool.name":              "flyio-pool",
		"pool.fs_type":           "ext4",
		"pool.block_size(bytes)": "65536",
	}
	got := map[string]string{
		"metadata.path":          c.Metadata.Path,
		"pool.root_dir":          c.Pool.RootDir,
		"pipeline.download_dir":  c.Pipeline.DownloadDir,
		"daemon.socket":          c.Daemon.Socket,
		"containerd.address":     c.Containerd.Address,
		"containerd.namespace":   c.Containerd.Namespace,
		"containerd.snapshotter": c.Containerd.Snapshotter,
		"pool.name":              c.Pool.Name,
		"pool.fs_type":           c.Pool.FSType,
		"pool.block_size(bytes)": strconv.FormatInt(c.Pool.BlockSize.Bytes(), 10),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults:\n got %v\nwant %v", got, want)
	}
	if c.Queues.Downloads != 5 || c.Queues.Unpacking != 2 {
		t.Errorf("queues = %+v, want downloads=5 unpacking=2", c.Queues)
	}
	if !c.Pool.AsyncRemove {
		t.Error("pool.async_remove default is false, want true")
	}
}

func TestEmptyPathLoadsDefaults(t *testing.T) {
	c, err := LoadConfig("")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, DefaultConfig()) {
		t.Errorf("LoadConfig(\"\") = %+v, want defaults", c)
	}
}

func TestRootDirMovesDerivedPaths(t *testing.T) {
	p := writeConfig(t, "[daemon]\nroot_dir = \"/srv/flyio\"\n[pool]\nroot_dir = \"/mnt/pool\"\n")
	c, err := LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Metadata.Path != "/srv/flyio/metadata.db" {
		t.Errorf("metadata.path = %q", c.Metadata.Path)
	}
	if c.Pool.RootDir != "/mnt/pool" {
		t.Errorf("explicit pool.root_dir overridden: %q", c.Pool.RootDir)
	}
	if c.Pipeline.DownloadDir != "/srv/flyio/images" {
		t.Errorf("pipeline.download_dir = %q", c.Pipeline.DownloadDir)
	}
}

func TestExampleFileEqualsDefaults(t *testing.T) {
	c, err := LoadConfig("../config.toml.example")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, DefaultConfig()) {
		t.Errorf("config.toml.example drifted from DefaultConfig:\n file %+v\n code %+v", c, DefaultConfig())
	}
}

// configKeys lists every key of Config as "section.key", in field order.
func configKeys() []string {
	var keys []string
	for _, f := range configFields() {
		keys = append(keys, f.Section+"."+f.Key)
	}
	return keys
}

// TestExampleDocumentsEveryKey checks that every key of Config appears,
// uncommented, in config.toml.example, so a new key cannot go undocumented.
func TestExampleDocumentsEveryKey(t *testing.T) {
	data, err := os.ReadFile("../config.toml.example")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]map[string]any
	if err := toml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range configKeys() {
		sec, key, _ := strings.Cut(k, ".")
		if _, ok := doc[sec][key]; !ok {
			t.Errorf("config.toml.example does not set %s", k)
		}
	}
}

// configKeyPattern is how a configuration key is spelled in the docs.
var configKeyPattern = regexp.MustCompile(`^[a-z0-9_]+\.[a-z0-9_]+$`)

// TestOperatingGuideListsEveryKey checks that the configuration reference
// in docs/operating.md has a row for every key of Config, with the default
// written as config.toml.example writes it (which TestExampleFileEqualsDefaults
// ties to the code), and no row for a key the code does not have.
func TestOperatingGuideListsEveryKey(t *testing.T) {
	example, err := os.ReadFile("../config.toml.example")
	if err != nil {
		t.Fatal(err)
	}
	literal := map[string]string{} // "section.key" -> value as written
	sec := ""
	for _, line := range strings.Split(string(example), "\n") {
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			sec = strings.Trim(line, "[]")
			continue
		}
		if k, v, ok := strings.Cut(line, " = "); ok && !strings.HasPrefix(line, "#") {
			literal[sec+"."+k] = v
		}
	}
	guide, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // "section.key" -> default column
	for _, line := range strings.Split(string(guide), "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) < 3 || !strings.HasPrefix(cells[0], "| `") {
			continue
		}
		rows[strings.Trim(cells[0], "| `")] = strings.Trim(cells[1], "`")
	}
	keys := configKeys()
	for _, k := range keys {
		got, ok := rows[k]
		switch {
		case !ok:
			t.Errorf("docs/operating.md: the configuration reference has no row for %s", k)
		case got != literal[k]:
			t.Errorf("docs/operating.md: %s default is %s, config.toml.example says %s", k, got, literal[k])
		}
	}
	for k := range rows {
		if configKeyPattern.MatchString(k) && !slices.Contains(keys, k) {
			t.Errorf("docs/operating.md: the configuration reference lists %s, which is not a key", k)
		}
	}
}

func TestFullFileRoundTrip(t *testing.T) {
	body := `
[daemon]
socket = "/run/x/snap.sock"
control_socket = ""
root_dir = "/srv/x"
log_level = "debug"
log_format = "json"
metrics_address = "127.0.0.1:9123"
socket_group = "1000"
gzip_command = "/usr/bin/gzip"
[metadata]
path = "/srv/db/meta.db"
synchronous = "normal"
[pool]
name = "pool-2"
root_dir = "/srv/pool"
data_device = "/dev/vdb"
metadata_device = "/dev/vdc"
data_size = 1073741824
metadata_size = "64MiB"
block_size = "256KiB"
low_water_mark = 1024
growth_reserve = "2GiB"
metadata_threshold = 90
min_free_space = "2.5%"
no_space_timeout = "5s"
base_image_size = "1.5GiB"
fs_type = "xfs"
mkfs_options = ["-K", "-m", "crc=1"]
async_remove = false
discard_blocks = false
delete_unknown_devices = true
[s3]
bucket = "my-images"
region = "eu-west-1"
endpoint = "http://127.0.0.1:9000"
path_style = true
anonymous = true
prefix = "images/"
allowed_buckets = ["b-two", "b-three"]
connect_timeout = "3s"
response_header_timeout = "7s"
idle_timeout = "20s"
part_size = "16MiB"
connections_per_object = 8
[pipeline]
download_dir = "/srv/dl"
tarball_cache_size = "1GiB"
spool_size = "512MiB"
max_image_size = "2GB"
download_timeout = "90s"
extract_timeout = "1h"
allow_setid = true
max_entries = 500
max_file_size = "2MiB"
max_total_size = "8MiB"
max_xattrs_per_entry = 16
max_xattr_bytes_per_entry = "8KiB"
required_dirs = []
max_layers = 64
[queues]
downloads = 8
unpacking = 3
[containerd]
address = "/run/k3s/containerd.sock"
namespace = "k8s.io"
snapshotter = "flyio-k3s"
[differ]
allow_setid = false
allow_device_nodes = false
max_entries = 200000
max_file_size = "4GiB"
max_total_size = "40GiB"
[gc]
enabled = false
high_threshold = 90
low_threshold = 70.5
interval = "1m"
pinned = ["base", "s3://b/base/"]

[retention]
interval = "10m"
runs_max_age = "48h"
runs_max_count = 500
failed_images_max_age = "24h"
`
	c, err := LoadConfig(writeConfig(t, body))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Daemon:   DaemonConfig{Socket: "/run/x/snap.sock", RootDir: "/srv/x", LogLevel: "debug", LogFormat: "json", MetricsAddress: "127.0.0.1:9123", SocketGroup: "1000", GzipCommand: "/usr/bin/gzip"},
		Metadata: metadata.Options{Path: "/srv/db/meta.db", Synchronous: "normal"},
		Pool: PoolConfig{
			thinpool.Config{Name: "pool-2", RootDir: "/srv/pool", DataDevice: "/dev/vdb", MetadataDevice: "/dev/vdc",
				DataSize: 1 << 30, MetadataSize: 64 << 20, BlockSize: 256 << 10, LowWaterMark: 1024,
				GrowthReserve: 2 << 30, MetadataThreshold: 90, MinFreeSpace: Pct(2.5), NoSpaceTimeout: D(5 * time.Second)},
			DevicesConfig{BaseImageSize: 3 << 29, FSType: "xfs", MkfsOptions: []string{"-K", "-m", "crc=1"},
				AsyncRemove: false, DeleteUnknownDevices: true}},
		S3: S3Config{Bucket: "my-images", Prefix: "images/", AllowedBuckets: []string{"b-two", "b-three"},
			Config: s3source.Config{Region: "eu-west-1", Endpoint: "http://127.0.0.1:9000", PathStyle: true, Anonymous: true,
				ConnectTimeout: D(3 * time.Second), ResponseHeaderTimeout: D(7 * time.Second), IdleTimeout: D(20 * time.Second),
				PartSize: 16 << 20, ConnectionsPerObject: 8}},
		Pipeline: PipelineConfig{
			pipeline.Config{DownloadDir: "/srv/dl", MaxImageSize: 2_000_000_000,
				DownloadTimeout: D(90 * time.Second), ExtractTimeout: D(time.Hour), MaxLayers: 64, SpoolSize: 512 << 20},
			gc.TarballCacheConfig{TarballCacheSize: 1 << 30},
			tarball.PolicyConfig{AllowSetID: true, MaxEntries: 500, MaxFileSize: 2 << 20, MaxTotalSize: 8 << 20,
				MaxXattrsPerEntry: 16, MaxXattrBytesPerEntry: 8 << 10, RequiredDirs: []string{}}},
		Queues:     pipeline.QueuesConfig{Downloads: 8, Unpacking: 3},
		Containerd: pipeline.ContainerdConfig{Address: "/run/k3s/containerd.sock", Namespace: "k8s.io", Snapshotter: "flyio-k3s"},
		Differ:     differ.Config{AllowSetID: false, AllowDeviceNodes: false, MaxEntries: 200_000, MaxFileSize: 4 << 30, MaxTotalSize: 40 << 30},
		GC:         gc.Config{HighThreshold: 90, LowThreshold: 70.5, Interval: D(time.Minute), Pinned: []string{"base", "s3://b/base/"}},
		Retention:  pipeline.RetentionConfig{Interval: D(10 * time.Minute), RunsMaxAge: D(48 * time.Hour), RunsMaxCount: 500, FailedImagesMaxAge: D(24 * time.Hour)},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("loaded\n %+v\nwant\n %+v", c, want)
	}
	// Marshal and load again: the written form reads back to the same value.
	out, err := MarshalConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseConfig("marshalled", out)
	if err != nil {
		t.Fatalf("re-reading marshalled config: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(again, want) {
		t.Fatalf("round trip changed the config:\n%s\n got %+v", out, again)
	}
}

func TestUnknownKeysNameKeyFileAndLine(t *testing.T) {
	p := writeConfig(t, "[daemon]\nsocket = \"/run/a.sock\"\nsockett = \"/x\"\n\n[pool]\nblocksize = 1\n[extra]\na = 1\n")
	_, err := LoadConfig(p)
	if err == nil {
		t.Fatal("unknown keys accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		p + ":3:1: unknown key \"daemon.sockett\"",
		p + ":6:1: unknown key \"pool.blocksize\"",
		"unknown table \"extra\"",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
}

// TestStaleLockAgeIsRejected: pipeline.stale_lock_age no longer exists (an
// image lock is a live run, released when the run ends), so a file still
// setting it is refused like any unknown key, naming it and its line.
func TestStaleLockAgeIsRejected(t *testing.T) {
	p := writeConfig(t, "[pipeline]\ndownload_timeout = \"5m\"\nstale_lock_age = \"1h\"\n")
	_, err := LoadConfig(p)
	if err == nil || !strings.Contains(err.Error(), p+":3:1: unknown key \"pipeline.stale_lock_age\"") {
		t.Fatalf("err = %v, want the unknown key pipeline.stale_lock_age named with its line", err)
	}
}

func TestTypeErrorsNameKeyAndLine(t *testing.T) {
	cases := []struct{ body, want string }{
		{"[queues]\ndownloads = \"five\"\n", ":2:13: queues.downloads:"},
		{"[pool]\nblock_size = \"64 KB/s\"\n", ":2:14: pool.block_size: size \"64 KB/s\""},
		{"[pool]\ndata_size = \"ten\"\n", "pool.data_size: size \"ten\""},
		{"[pipeline]\ndownload_timeout = 30\n", "pipeline.download_timeout: duration \"30\""},
		{"[pipeline]\nextract_timeout = \"soon\"\n", "pipeline.extract_timeout: duration \"soon\""},
		{"[pool]\nasync_remove = \"yes\"\n", "pool.async_remove:"},
		{"[pipeline]\nallow_setid = \"yes\"\n", ":2:15: pipeline.allow_setid:"},
		{"[pool]\nbase_image_size = 1.5\n", "pool.base_image_size: size \"1.5\""},
		{"[pool]\nmetadata_size = -1\n", ": pool.metadata_size: must be a multiple of 4KiB between 2MiB and 16GiB (the kernel uses at most 15.9GiB), got -1"},
		{"[pool]\nmetadata_size = \"-1MiB\"\n", "pool.metadata_size: size \"-1MiB\": must not be negative"},
		{"[pool]\nmin_free_space = 10\n", "pool.min_free_space: percent \"10\": write a number followed by %"},
		{"[pool]\nmin_free_space = \"ten%\"\n", ":2:18: pool.min_free_space: percent \"ten%\""},
		{"[pool]\nmin_free_space = \"0.1\"\n", "pool.min_free_space: percent \"0.1\""},
		{"[pool]\nno_space_timeout = 60\n", "pool.no_space_timeout: duration \"60\""},
		// A whole float is a valid size: the error is the other key's.
		{"[pool]\ndata_size = 17179869184.0\n[s3]\nidle_timeout = 5\n", "s3.idle_timeout: duration \"5\""},
	}
	for _, tc := range cases {
		p := writeConfig(t, tc.body)
		_, err := LoadConfig(p)
		if err == nil {
			t.Errorf("%q accepted", tc.body)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "config "+p) {
			t.Errorf("%q: error %q, want it to start with the file and contain %q", tc.body, err, tc.want)
		}
	}
}

// TestSyntaxErrorsNameKeyAndLine: a value the TOML parser cannot read
// (an unquoted size, duration or percent, the likeliest slip) and a key
// set twice are named by their dotted key, table included, beside the
// line, as every other problem of the file is.
func TestSyntaxErrorsNameKeyAndLine(t *testing.T) {
	cases := []struct{ body, want string }{
		{"[pool]\ndata_size = 10GiB\n", ":2:15: pool.data_size: strings must be quoted"},
		{"[pool]\nmin_free_space = 10%\n", ":2:20: pool.min_free_space: expected newline"},
		{"[daemon]\nsocket = /run/x.sock\n", ":2:10: daemon.socket: unexpected character"},
		{"# retention\n[gc] # collection\n  interval = 5m  \n", ":3:15: gc.interval: strings must be quoted"},
		{"[pool]\nname = \"a\"\n[gc]\nenabled = true\nenabled = false\n", ":5:1: gc.enabled: key enabled is already defined"},
		{"[pool]\nname = \"a\"\nname = \"b\"\n", ":3:1: pool.name: key name is already defined"},
		// No key on the line: the position alone.
		{"[pool\nname = \"a\"\n", ":1:6: expected ']' to close table name"},
	}
	for _, tc := range cases {
		p := writeConfig(t, tc.body)
		_, err := LoadConfig(p)
		if err == nil {
			t.Errorf("%q accepted", tc.body)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "config "+p) {
			t.Errorf("%q: error %q, want it to start with the file and contain %q", tc.body, err, tc.want)
		}
	}
}

func TestMissingFile(t *testing.T) {
	_, err := LoadConfig("/nonexistent/flyio.toml")
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/flyio.toml") {
		t.Fatalf("err = %v, want it to name the file", err)
	}
}

func TestValidateRules(t *testing.T) {
	long := "/" + strings.Repeat("s", 120)
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"socket relative", func(c *Config) { c.Daemon.Socket = "run/x.sock" }, `daemon.socket: must be an absolute path, got "run/x.sock"`},
		{"socket empty", func(c *Config) { c.Daemon.Socket = "" }, "daemon.socket: must be an absolute path, got an empty value"},
		{"socket too long", func(c *Config) { c.Daemon.Socket = long }, "daemon.socket: unix socket path must be at most 107 bytes, got 121"},
		{"control relative", func(c *Config) { c.Daemon.ControlSocket = "c.sock" }, "daemon.control_socket: must be an absolute path"},
		{"control equals socket", func(c *Config) { c.Daemon.ControlSocket = c.Daemon.Socket }, "daemon.control_socket: must differ from daemon.socket"},
		{"root relative", func(c *Config) { c.Daemon.RootDir = "var/lib" }, "daemon.root_dir: must be an absolute path"},
		{"log level", func(c *Config) { c.Daemon.LogLevel = "loud" }, `daemon.log_level: must be one of trace, debug, info, warn, error, fatal, panic, got "loud"`},
		{"log level empty", func(c *Config) { c.Daemon.LogLevel = "" }, "daemon.log_level: must be one of"},
		{"log format", func(c *Config) { c.Daemon.LogFormat = "xml" }, `daemon.log_format: must be "text" or "json", got "xml"`},
		{"gzip command not a path", func(c *Config) { c.Daemon.GzipCommand = "igzip" }, `daemon.gzip_command: must be "auto", "builtin" or the absolute path of a program such as /usr/bin/igzip, got "igzip"`},
		{"gzip command missing", func(c *Config) { c.Daemon.GzipCommand = "/nonexistent/igzip" }, `daemon.gzip_command: stat /nonexistent/igzip: no such file or directory`},
		{"gzip command not executable", func(c *Config) { c.Daemon.GzipCommand = "/etc/passwd" }, `daemon.gzip_command: /etc/passwd is not an executable file`},
		{"metrics address", func(c *Config) { c.Daemon.MetricsAddress = "9123" }, `daemon.metrics_address: must be host:port`},
		{"metrics port out of range", func(c *Config) { c.Daemon.MetricsAddress = "0.0.0.0:91230" }, `daemon.metrics_address: must be host:port with a port up to 65535 (e.g. "127.0.0.1:9123") or empty to disable, got "0.0.0.0:91230"`},
		{"debug port out of range", func(c *Config) { c.Daemon.DebugAddress = "127.0.0.1:65536" }, `daemon.debug_address: must be host:port with a port up to 65535 (e.g. "127.0.0.1:9124") or empty to disable, got "127.0.0.1:65536"`},
		{"debug address", func(c *Config) { c.Daemon.DebugAddress = "localhost" }, `daemon.debug_address: must be host:port with a port up to 65535 (e.g. "127.0.0.1:9124") or empty to disable, got "localhost"`},
		{"debug address equals metrics", func(c *Config) { c.Daemon.MetricsAddress, c.Daemon.DebugAddress = "127.0.0.1:9123", "127.0.0.1:9123" },
			`daemon.debug_address: must differ from daemon.metrics_address, both are "127.0.0.1:9123"`},
		{"metadata path", func(c *Config) { c.Metadata.Path = "meta.db" }, "metadata.path: must be an absolute path"},
		{"metadata synchronous", func(c *Config) { c.Metadata.Synchronous = "off" }, `metadata.synchronous: must be "full" or "normal", got "off"`},
		{"pool name empty", func(c *Config) { c.Pool.Name = "" }, "pool.name: must not be empty"},
		{"pool name slash", func(c *Config) { c.Pool.Name = "a/b" }, `pool.name: must be at most 96 characters`},
		{"pool name long", func(c *Config) { c.Pool.Name = strings.Repeat("p", 97) }, `pool.name: must be at most 96 characters`},
		{"pool root", func(c *Config) { c.Pool.RootDir = "pool" }, "pool.root_dir: must be an absolute path"},
		{"data device relative", func(c *Config) { c.Pool.DataDevice, c.Pool.MetadataDevice = "vdb", "/dev/vdc" }, "pool.data_device: must be an absolute path"},
		{"metadata device relative", func(c *Config) { c.Pool.DataDevice, c.Pool.MetadataDevice = "/dev/vdb", "vdc" }, "pool.metadata_device: must be an absolute path"},
		{"data device alone", func(c *Config) { c.Pool.DataDevice = "/dev/vdb" }, "pool.metadata_device: must be set when pool.data_device is set"},
		{"metadata device alone", func(c *Config) { c.Pool.MetadataDevice = "/dev/vdc" }, "pool.data_device: must be set when pool.metadata_device is set"},
		{"same devices", func(c *Config) { c.Pool.DataDevice, c.Pool.MetadataDevice = "/dev/vdb", "/dev/vdb" }, "pool.metadata_device: must differ from pool.data_device"},
		{"block size 100", func(c *Config) { c.Pool.BlockSize = 100 }, "pool.block_size: must be a multiple of 128 sectors (64 KiB) between 64 KiB and 1 GiB, got 100"},
		{"block size odd", func(c *Config) { c.Pool.BlockSize = 96 << 10 }, "pool.block_size: must be a multiple of 128 sectors (64 KiB) between 64 KiB and 1 GiB, got 96KiB"},
		{"block size huge", func(c *Config) { c.Pool.BlockSize = 2 << 30 }, "got 2GiB"},
		{"data size small", func(c *Config) { c.Pool.DataSize = 1 << 20 }, "pool.data_size: must be a multiple of 512 bytes and at least 16MiB, got 1MiB"},
		{"data size unaligned", func(c *Config) { c.Pool.DataSize = 100<<20 + 1 }, "pool.data_size: must be a multiple of 512 bytes"},
		{"data size below block", func(c *Config) { c.Pool.BlockSize, c.Pool.DataSize = 1<<30, 512<<20 }, "pool.data_size: must hold at least one data block of pool.block_size 1GiB, got 512MiB"},
		{"metadata size small", func(c *Config) { c.Pool.MetadataSize = 1 << 20 }, "pool.metadata_size: must be a multiple of 4KiB between 2MiB and 16GiB"},
		{"metadata size big", func(c *Config) { c.Pool.MetadataSize = 17 << 30 }, "pool.metadata_size: must be a multiple of 4KiB between 2MiB and 16GiB (the kernel uses at most 15.9GiB), got 17GiB"},
		{"low water mark", func(c *Config) { c.Pool.DataSize, c.Pool.LowWaterMark = 64<<20, 1024 }, "pool.low_water_mark: must be fewer than the pool's 1024 data blocks"},
		{"max data size below data size", func(c *Config) { c.Pool.MaxDataSize = c.Pool.DataSize - 512 }, "pool.max_data_size: must be 0 (no growth) or a multiple of 512 bytes at least pool.data_size"},
		{"max data size with devices", func(c *Config) {
			c.Pool.DataDevice, c.Pool.MetadataDevice, c.Pool.MaxDataSize = "/dev/vdb", "/dev/vdc", 1<<40
		}, "pool.max_data_size: must be 0 when pool.data_device is set"},
		{"negative growth reserve", func(c *Config) { c.Pool.GrowthReserve = -1 }, "pool.growth_reserve: must not be negative"},
		{"reserve above half", func(c *Config) { c.Pool.MinFreeSpace = Pct(60) }, "pool.min_free_space: must be between 0% (no reserve) and 50%, got 60%"},
		{"reserve negative", func(c *Config) { c.Pool.MinFreeSpace = Pct(-1) }, "pool.min_free_space: must be between 0% (no reserve) and 50%, got -1%"},
		{"gc high inside the reserve", func(c *Config) { c.Pool.MinFreeSpace = Pct(20) }, "gc.high_threshold: must be at most 80% (100% less pool.min_free_space 20%)"},
		{"no space timeout zero", func(c *Config) { c.Pool.NoSpaceTimeout = D(0) }, `pool.no_space_timeout: must be whole seconds between 1s and 1h0m0s (the kernel counts seconds; 0, waiting forever, would hang every writer of a full pool), got "0s"`},
		{"no space timeout fraction", func(c *Config) { c.Pool.NoSpaceTimeout = D(1500 * time.Millisecond) }, `pool.no_space_timeout: must be whole seconds between 1s and 1h0m0s`},
		{"no space timeout long", func(c *Config) { c.Pool.NoSpaceTimeout = D(2 * time.Hour) }, `got "2h0m0s"`},
		{"metadata threshold above 100", func(c *Config) { c.Pool.MetadataThreshold = 101 }, "pool.metadata_threshold: must be a percent above 0 and at most 100, got 101"},
		{"base size small", func(c *Config) { c.Pool.BaseImageSize = 1 << 20 }, "pool.base_image_size: must be a multiple of 512 bytes and at least 16MiB, got 1MiB"},
		{"base size unaligned", func(c *Config) { c.Pool.BaseImageSize = 20<<20 + 3 }, "pool.base_image_size: must be a multiple of 512 bytes"},
		{"fs type", func(c *Config) { c.Pool.FSType = "btrfs" }, `pool.fs_type: must be "ext4" or "xfs", got "btrfs"`},
		{"gc low above high", func(c *Config) { c.GC.HighThreshold, c.GC.LowThreshold = 80, 85 }, "gc.low_threshold: must be a percent above 0 and below gc.high_threshold (80), got 85"},
		{"gc low zero", func(c *Config) { c.GC.LowThreshold = 0 }, "gc.low_threshold: must be a percent above 0 and below gc.high_threshold (85), got 0"},
		{"gc high above the metadata threshold", func(c *Config) { c.Pool.MetadataThreshold = 50 }, "gc.high_threshold: must be at most pool.metadata_threshold (50): new devices are refused from that metadata use on, and collection frees metadata only from this threshold on, got 85"},
		{"gc high above 100", func(c *Config) { c.GC.HighThreshold = 120 }, "gc.high_threshold: must be a percent above 0 and at most 100, got 120"},
		{"gc interval", func(c *Config) { c.GC.Interval = D(0) }, `gc.interval: must be a positive duration such as "30m", got "0s"`},
		{"retention interval", func(c *Config) { c.Retention.Interval = D(0) }, `retention.interval: must be a positive duration such as "30m", got "0s"`},
		{"retention runs age", func(c *Config) { c.Retention.RunsMaxAge = D(-time.Hour) }, `retention.runs_max_age: must be a positive duration`},
		{"retention runs count", func(c *Config) { c.Retention.RunsMaxCount = 0 }, "retention.runs_max_count: must be positive, got 0"},
		{"retention failed images age", func(c *Config) { c.Retention.FailedImagesMaxAge = D(0) }, `retention.failed_images_max_age: must be a positive duration`},
		{"gc pinned empty", func(c *Config) { c.GC.Pinned = []string{" "} }, "gc.pinned[0]: must not be empty"},
		{"mkfs empty option", func(c *Config) { c.Pool.MkfsOptions = []string{"-E", " "} }, "pool.mkfs_options[1]: must not be empty"},
		{"bucket", func(c *Config) { c.S3.Bucket = "My_Bucket" }, `s3.bucket: must be an S3 bucket name`},
		{"bucket dots", func(c *Config) { c.S3.Bucket = "a..b" }, `s3.bucket: must be an S3 bucket name`},
		{"endpoint", func(c *Config) { c.S3.Endpoint = "127.0.0.1:9000" }, `s3.endpoint: must be an http:// or https:// URL with a host, got "127.0.0.1:9000"`},
		{"prefix", func(c *Config) { c.S3.Prefix = "/images" }, "s3.prefix: must not start with '/'"},
		{"prefix not a folder", func(c *Config) { c.S3.Prefix = "images" }, `s3.prefix: must end with '/' (a folder of the bucket, such as "images/"), got "images"`},
		{"allowed bucket", func(c *Config) { c.S3.AllowedBuckets = []string{"ok-bucket", "Not_OK"} }, `s3.allowed_buckets[1]: must be an S3 bucket name (3-63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit), got "Not_OK"`},
		{"max entries", func(c *Config) { c.Pipeline.MaxEntries = 0 }, "pipeline.max_entries: must be positive and at most 2147483647 (larger counts overflow the byte counts derived from it), got 0"},
		{"max entries huge", func(c *Config) { c.Pipeline.MaxEntries = math.MaxInt }, "pipeline.max_entries: must be positive and at most 2147483647"},
		{"max total size huge", func(c *Config) { c.Pipeline.MaxTotalSize = math.MaxInt64 }, "pipeline.max_total_size: must be positive and at most 1048576TiB (larger sizes overflow the byte counts derived from it), got 9223372036854775807"},
		{"max file size huge", func(c *Config) { c.Pipeline.MaxFileSize = tarball.MaxLimitBytes + 1 }, "pipeline.max_file_size: must be positive and at most 1048576TiB"},
		{"max image size huge", func(c *Config) { c.Pipeline.MaxImageSize = math.MaxInt64 }, "pipeline.max_image_size: must be positive and at most 1048576TiB"},
		{"tarball cache huge", func(c *Config) { c.Pipeline.TarballCacheSize = math.MaxInt64 }, "pipeline.tarball_cache_size: must be at least 0 and at most 1048576TiB"},
		{"spool size negative", func(c *Config) { c.Pipeline.SpoolSize = -1 }, "pipeline.spool_size: must be at least 0 (none) and at most 1048576TiB, got -1"},
		{"max xattrs zero", func(c *Config) { c.Pipeline.MaxXattrsPerEntry = 0 }, "pipeline.max_xattrs_per_entry: must be positive and at most 2147483647"},
		{"max xattrs huge", func(c *Config) { c.Pipeline.MaxXattrsPerEntry = math.MaxInt }, "pipeline.max_xattrs_per_entry: must be positive and at most 2147483647"},
		{"max xattr bytes negative", func(c *Config) { c.Pipeline.MaxXattrBytesPerEntry = -1 }, "pipeline.max_xattr_bytes_per_entry: must be positive and at most 1048576TiB"},
		{"max xattr bytes huge", func(c *Config) { c.Pipeline.MaxXattrBytesPerEntry = math.MaxInt64 }, "pipeline.max_xattr_bytes_per_entry: must be positive and at most 1048576TiB"},
		{"max file size", func(c *Config) { c.Pipeline.MaxFileSize = -1 }, "pipeline.max_file_size: must be positive and at most"},
		{"differ max entries", func(c *Config) { c.Differ.MaxEntries = 0 }, "differ.max_entries: must be positive and at most 2147483647"},
		{"differ max file size", func(c *Config) { c.Differ.MaxFileSize = 0 }, "differ.max_file_size: must be positive and at most"},
		{"differ max total size", func(c *Config) { c.Differ.MaxTotalSize = tarball.MaxLimitBytes + 1 }, "differ.max_total_size: must be positive and at most 1048576TiB"},
		{"max total size", func(c *Config) { c.Pipeline.MaxTotalSize = 0 }, "pipeline.max_total_size: must be positive"},
		{"required dir path", func(c *Config) { c.Pipeline.RequiredDirs = []string{"etc", "usr/bin"} }, `pipeline.required_dirs[1]: must be one top-level directory name such as "etc" (no '/', not "." or ".."), got "usr/bin"`},
		{"required dir dotdot", func(c *Config) { c.Pipeline.RequiredDirs = []string{".."} }, `pipeline.required_dirs[0]: must be one top-level directory name`},
		{"download dir", func(c *Config) { c.Pipeline.DownloadDir = "dl" }, "pipeline.download_dir: must be an absolute path"},
		{"max image size", func(c *Config) { c.Pipeline.MaxImageSize = 0 }, "pipeline.max_image_size: must be positive and at most 1048576TiB (larger sizes overflow the byte counts derived from it), got 0"},
		{"download timeout", func(c *Config) { c.Pipeline.DownloadTimeout = D(0) }, `pipeline.download_timeout: must be a positive duration such as "30m", got "0s"`},
		{"extract timeout", func(c *Config) { c.Pipeline.ExtractTimeout = D(-time.Second) }, "pipeline.extract_timeout: must be a positive duration"},
		{"socket group", func(c *Config) { c.Daemon.SocketGroup = "no-such-group-here" }, "daemon.socket_group: must be a group name or id"},
		// The kernel's gid_t is 32 bits and (gid_t)-1 means "leave the
		// group": a larger id would be cut to another group's (2^32+1 is
		// gid 1), and 4294967295 would leave the socket root's.
		{"socket group id past gid_t", func(c *Config) { c.Daemon.SocketGroup = "4294967297" }, `daemon.socket_group: must be a group name or an id from 0 to 4294967294, got "4294967297"`},
		{"socket group id of no group", func(c *Config) { c.Daemon.SocketGroup = "4294967295" }, `daemon.socket_group: must be a group name or an id from 0 to 4294967294, got "4294967295"`},
		{"max layers", func(c *Config) { c.Pipeline.MaxLayers = 0 }, "pipeline.max_layers: must be at least 1, got 0"},
		{"s3 idle timeout", func(c *Config) { c.S3.IdleTimeout = D(0) }, "s3.idle_timeout: must be a positive duration"},
		{"s3 part size small", func(c *Config) { c.S3.PartSize = 512 << 10 }, "s3.part_size: must be between 1MiB and 5GiB, got 512KiB"},
		{"s3 part size big", func(c *Config) { c.S3.PartSize = 6 << 30 }, "s3.part_size: must be between 1MiB and 5GiB, got 6GiB"},
		{"s3 connections zero", func(c *Config) { c.S3.ConnectionsPerObject = 0 }, "s3.connections_per_object: must be between 1 and 64, got 0"},
		{"s3 connections big", func(c *Config) { c.S3.ConnectionsPerObject = 65 }, "s3.connections_per_object: must be between 1 and 64, got 65"},
		{"downloads zero", func(c *Config) { c.Queues.Downloads = 0 }, "queues.downloads: must be between 1 and 64, got 0"},
		{"unpacking big", func(c *Config) { c.Queues.Unpacking = 65 }, "queues.unpacking: must be between 1 and 64, got 65"},
		{"containerd address", func(c *Config) { c.Containerd.Address = "containerd.sock" }, "containerd.address: must be an absolute path"},
		{"namespace", func(c *Config) { c.Containerd.Namespace = "bad ns" }, `containerd.namespace: must be a containerd namespace`},
		{"snapshotter", func(c *Config) { c.Containerd.Snapshotter = "" }, `containerd.snapshotter: must be the name of the proxy plugin`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(c)
			err := c.Validate()
			if err == nil {
				t.Fatalf("accepted; want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestValidateAcceptsVariants(t *testing.T) {
	c := DefaultConfig()
	c.Pool.MinFreeSpace = Pct(0) // no reserve: any gc.high_threshold up to the metadata threshold
	c.Pool.MetadataThreshold = 99
	c.GC.HighThreshold = 99
	c.Daemon.ControlSocket = ""
	c.Daemon.MetricsAddress = ":9123"
	c.Pool.DataDevice, c.Pool.MetadataDevice = "/dev/vdb", "/dev/vdc"
	c.Pool.DataSize = 0 // ignored with devices
	c.Pool.FSType = "xfs"
	c.Pool.BlockSize = 1 << 30
	c.Containerd.Address = "unix:///run/containerd/containerd.sock"
	c.S3.Bucket = "flyio.images-1"
	c.S3.Endpoint = "https://s3.example.com"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := DefaultConfig()
	c.Pool.FSType = "zfs"
	c.Queues.Downloads = 0
	err := c.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, k := range []string{"pool.fs_type:", "queues.downloads:"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error %q misses %s", err, k)
		}
	}
}

func TestLoadConfigValidates(t *testing.T) {
	p := writeConfig(t, "[pool]\nblock_size = 100\n")
	_, err := LoadConfig(p)
	want := "config " + p + ": pool.block_size: must be a multiple of 128 sectors (64 KiB) between 64 KiB and 1 GiB, got 100"
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v\nwant %s", err, want)
	}
}

// TestEndpointCredentialsNeverPrinted: an s3.endpoint carrying user
// information is refused, and no message about it, valid URL or not,
// prints the credentials.
func TestEndpointCredentialsNeverPrinted(t *testing.T) {
	for _, ep := range []string{
		"http://AKIDEXAMPLE:s3cr3t@127.0.0.1:9000",
		"https://AKIDEXAMPLE:s3cr3t@s3.example.com/base/path",
		"http://AKIDEXAMPLE:s3cr3t@127.0.0.1:port",
		"ftp://AKIDEXAMPLE:s3cr3t@host",
		"AKIDEXAMPLE:s3cr3t@127.0.0.1:9000",
		"http://AKIDEXAMPLE:s3cr3t@[::1",
		"//AKIDEXAMPLE:s3cr3t@host",
	} {
		c := DefaultConfig()
		c.S3.Endpoint = ep
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "s3.endpoint: must") {
			t.Errorf("endpoint %s: %v, want an s3.endpoint error", ep, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "AKIDEXAMPLE") {
			t.Errorf("endpoint %s: the error prints the credentials: %v", ep, err)
		}
	}
}

// TestLargestLimitsStillAcceptLayers: the largest limits the config
// accepts make no layer fail (the stream bound derived from them does not
// overflow into a negative byte count).
func TestLargestLimitsStillAcceptLayers(t *testing.T) {
	c := DefaultConfig()
	c.Pipeline.MaxEntries = tarball.MaxLimitCount
	c.Pipeline.MaxFileSize = tarball.MaxLimitBytes
	c.Pipeline.MaxTotalSize = tarball.MaxLimitBytes
	c.Pipeline.MaxXattrsPerEntry = tarball.MaxLimitCount
	c.Pipeline.MaxXattrBytesPerEntry = tarball.MaxLimitBytes
	c.Pipeline.MaxImageSize = tarball.MaxLimitBytes
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/hostname", Mode: 0o644, Size: 2}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("h\n"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tarball.Validate(context.Background(), &buf, c.TarLimits()); err != nil {
		t.Fatalf("a one-file layer under the largest limits: %v", err)
	}
}

// TestClientReadsTheDaemonsControlSocket checks that a client finds the
// control socket the daemon binds: control.SocketFromConfig, which reads
// only that key, agrees with LoadConfig on the annotated example, on a
// file that sets the key, and on one that leaves it to the default.
func TestClientReadsTheDaemonsControlSocket(t *testing.T) {
	for name, path := range map[string]string{
		"example":  "../config.toml.example",
		"set":      writeConfig(t, "[daemon]\ncontrol_socket = \"/run/elsewhere/control.sock\"\n"),
		"left out": writeConfig(t, "[daemon]\nlog_level = \"debug\"\n"),
	} {
		cfg, err := LoadConfig(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := control.SocketFromConfig(path)
		if err != nil || got != cfg.Daemon.ControlSocket {
			t.Errorf("%s: the client reads control socket %q (%v), the daemon binds %q", name, got, err, cfg.Daemon.ControlSocket)
		}
	}
}

// TestKeysDifferingInCaseAreUnknown: keys are matched as written, as TOML
// defines them. A table or key that names a known one in another case is
// refused, naming it, its line and the key meant, rather than applied:
// otherwise [pipeline] and [Pipeline] in one file would both be read, the
// later silently winning.
func TestKeysDifferingInCaseAreUnknown(t *testing.T) {
	p := writeConfig(t, "[daemon]\nlog_level = \"info\"\n\n[Daemon]\nlog_level = \"debug\"\n\n[gc]\nInterval = \"1h\"\n")
	_, err := LoadConfig(p)
	if err == nil {
		t.Fatal("keys differing in case from the known ones accepted")
	}
	for _, want := range []string{
		p + ":4:1: unknown table \"Daemon\" (keys are case-sensitive: did you mean \"daemon\"?)",
		p + ":8:1: unknown key \"gc.Interval\" (keys are case-sensitive: did you mean \"gc.interval\"?)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}
