package plugin

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/differ"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/gc"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// packageViews is what each package receives of a loaded Config, through
// the same conversions the daemon uses (Open, PipelineOptions,
// newCollector, StartFetcher, the CLI): the key of the map names the
// receiver.
func packageViews(c *Config) map[string]any {
	s := &Service{Config: c}
	po := s.PipelineOptions()
	// Functions never compare equal; what they close over is checked
	// through the views that build them (s3source: Sources).
	po.Sources, po.ThinExists, po.OnRetry, po.PoolFree = nil, nil, nil, nil
	resolved, err := c.ResolvePull(api.PullRequest{Key: "k"})
	other := c.BucketAllowed("zz-other")
	return map[string]any{
		// [daemon] and the pull policy of [s3] are the plugin's own.
		"plugin":      []any{c.Daemon, resolved, fmt.Sprint(err), fmt.Sprint(other)},
		"metadata":    c.MetadataOptions(false),
		"retention":   []any{c.Retention.Policy(), c.Retention.Interval.Duration},
		"thinpool":    c.ThinpoolConfig(),
		"snapshotter": c.SnapshotterConfig(),
		"s3source":    c.S3SourceConfig("b-one"),
		"tarball":     c.TarLimits(),
		"differ":      c.Differ.Limits(),
		"pipeline":    po,
		"gc":          c.GC.Options(c.Pipeline.TarballCacheConfig),
	}
}

// setKey returns the TOML text doc with key (in section sec) set to the
// literal value: its line replaced, or added at the end of the section.
func setKey(t *testing.T, doc, sec, key, value string) string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	cur, end := "", -1
	for i, line := range lines {
		if strings.HasPrefix(line, "[") {
			if cur == sec {
				end = i
			}
			cur = strings.Trim(line, "[]")
			continue
		}
		if cur == sec && strings.HasPrefix(line, key+" = ") {
			lines[i] = key + " = " + value
			return strings.Join(lines, "\n")
		}
	}
	if end < 0 && cur == sec {
		end = len(lines)
	}
	if end < 0 {
		t.Fatalf("config.toml.example has no section [%s]", sec)
	}
	return strings.Join(slices.Insert(lines, end, key+" = "+value), "\n")
}

// TestEveryKeyReachesItsPackage loads config.toml.example with one key
// changed at a time and checks that the package using that key receives
// the change: each conversion from Config to a package's options carries
// every key it should. Where a key is only valid beside others (a device
// pair, a bucket for a prefix), those others are set in both files.
func TestEveryKeyReachesItsPackage(t *testing.T) {
	example, err := os.ReadFile("../config.toml.example")
	if err != nil {
		t.Fatal(err)
	}
	type change struct {
		key, value, receiver string
		base                 map[string]string // set in both files
	}
	devices := map[string]string{"pool.data_device": `"/dev/vdb"`, "pool.metadata_device": `"/dev/vdc"`}
	changes := []change{
		{"daemon.socket", `"/run/x/snap.sock"`, "plugin", nil},
		{"daemon.control_socket", `""`, "plugin", nil},
		{"daemon.root_dir", `"/srv/x"`, "plugin", nil},
		{"daemon.log_level", `"debug"`, "plugin", nil},
		{"daemon.log_format", `"json"`, "plugin", nil},
		{"daemon.metrics_address", `"127.0.0.1:9123"`, "plugin", nil},
		{"daemon.debug_address", `"127.0.0.1:9124"`, "plugin", nil},
		{"daemon.socket_group", `"1"`, "plugin", nil},
		{"daemon.gzip_command", `"/usr/bin/gzip"`, "pipeline", nil},
		{"metadata.path", `"/srv/m.db"`, "metadata", nil},
		{"metadata.synchronous", `"normal"`, "metadata", nil},
		{"pool.name", `"pool-x"`, "thinpool", nil},
		{"pool.root_dir", `"/srv/pool"`, "thinpool", nil},
		{"pool.data_device", `"/dev/vdd"`, "thinpool", devices},
		{"pool.metadata_device", `"/dev/vdd"`, "thinpool", devices},
		{"pool.data_size", `"200GiB"`, "thinpool", nil},
		{"pool.metadata_size", `"2GiB"`, "thinpool", nil},
		{"pool.block_size", `"128KiB"`, "thinpool", nil},
		{"pool.low_water_mark", `1000`, "thinpool", nil},
		{"pool.max_data_size", `"200GiB"`, "thinpool", nil},
		{"pool.growth_reserve", `"2GiB"`, "thinpool", nil},
		{"pool.metadata_threshold", `90.0`, "thinpool", nil},
		{"pool.min_free_space", `"5%"`, "thinpool", nil},
		{"pool.no_space_timeout", `"2m0s"`, "thinpool", nil},
		{"pool.base_image_size", `"20GiB"`, "snapshotter", nil},
		{"pool.fs_type", `"xfs"`, "snapshotter", nil},
		{"pool.mkfs_options", `["-K"]`, "snapshotter", nil},
		{"pool.async_remove", `false`, "snapshotter", nil},
		{"pool.discard_blocks", `false`, "snapshotter", nil},
		{"pool.delete_unknown_devices", `true`, "snapshotter", nil},
		{"s3.bucket", `"b-one"`, "plugin", nil},
		{"s3.region", `"eu-west-1"`, "s3source", nil},
		{"s3.endpoint", `"http://127.0.0.1:9000"`, "s3source", nil},
		{"s3.path_style", `true`, "s3source", nil},
		{"s3.anonymous", `true`, "s3source", nil},
		{"s3.prefix", `"images/"`, "plugin", map[string]string{"s3.bucket": `"b-one"`}},
		{"s3.allowed_buckets", `["b-two"]`, "plugin", nil},
		{"s3.connect_timeout", `"5s"`, "s3source", nil},
		{"s3.response_header_timeout", `"10s"`, "s3source", nil},
		{"s3.idle_timeout", `"2m0s"`, "s3source", nil},
		{"s3.part_size", `"16MiB"`, "s3source", nil},
		{"s3.connections_per_object", `8`, "s3source", nil},
		{"pipeline.download_dir", `"/srv/dl"`, "pipeline", nil},
		{"pipeline.tarball_cache_size", `"1GiB"`, "gc", nil},
		{"pipeline.spool_size", `"512MiB"`, "pipeline", nil},
		{"pipeline.max_image_size", `"5GiB"`, "pipeline", nil},
		{"pipeline.download_timeout", `"1m0s"`, "pipeline", nil},
		{"pipeline.extract_timeout", `"1h0m0s"`, "pipeline", nil},
		{"pipeline.allow_setid", `true`, "tarball", nil},
		{"pipeline.max_entries", `10`, "tarball", nil},
		{"pipeline.max_file_size", `"1MiB"`, "tarball", nil},
		{"pipeline.max_total_size", `"2MiB"`, "tarball", nil},
		{"pipeline.max_xattrs_per_entry", `4`, "tarball", nil},
		{"pipeline.max_xattr_bytes_per_entry", `"1KiB"`, "tarball", nil},
		{"pipeline.required_dirs", `["etc"]`, "pipeline", nil},
		{"pipeline.max_layers", `16`, "s3source", nil},
		{"queues.downloads", `3`, "pipeline", nil},
		{"queues.unpacking", `1`, "pipeline", nil},
		{"containerd.address", `"/run/k3s/containerd.sock"`, "pipeline", nil},
		{"containerd.namespace", `"k8s.io"`, "pipeline", nil},
		{"containerd.snapshotter", `"flyio-k3s"`, "pipeline", nil},
		{"differ.allow_setid", `false`, "differ", nil},
		{"differ.allow_device_nodes", `false`, "differ", nil},
		{"differ.max_entries", `5000`, "differ", nil},
		{"differ.max_file_size", `"2GiB"`, "differ", nil},
		{"differ.max_total_size", `"20GiB"`, "differ", nil},
		{"gc.enabled", `false`, "gc", nil},
		{"gc.high_threshold", `88.0`, "gc", nil},
		{"gc.low_threshold", `70.0`, "gc", nil},
		{"gc.interval", `"1m0s"`, "gc", nil},
		{"gc.pinned", `["base"]`, "gc", nil},
		{"retention.interval", `"2h0m0s"`, "retention", nil},
		{"retention.runs_max_age", `"24h0m0s"`, "retention", nil},
		{"retention.runs_max_count", `100`, "retention", nil},
		{"retention.failed_images_max_age", `"48h0m0s"`, "retention", nil},
	}
	var listed []string
	for _, ch := range changes {
		listed = append(listed, ch.key)
	}
	keys := configKeys()
	slices.Sort(listed)
	slices.Sort(keys)
	if !slices.Equal(listed, keys) {
		t.Fatalf("the test's keys differ from Config's: add the new key with a value and the package it reaches\n test %v\n code %v", listed, keys)
	}
	load := func(name string, sets map[string]string) *Config {
		t.Helper()
		doc := string(example)
		for k, v := range sets {
			sec, key, _ := strings.Cut(k, ".")
			doc = setKey(t, doc, sec, key, v)
		}
		c, err := ParseConfig(name, []byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return c
	}
	for _, ch := range changes {
		t.Run(ch.key, func(t *testing.T) {
			sets := map[string]string{}
			for k, v := range ch.base {
				sets[k] = v
			}
			before := packageViews(load("base", sets))
			sets[ch.key] = ch.value
			after := packageViews(load(ch.key+" = "+ch.value, sets))
			if _, ok := after[ch.receiver]; !ok {
				t.Fatalf("no view of package %q", ch.receiver)
			}
			if reflect.DeepEqual(before[ch.receiver], after[ch.receiver]) {
				t.Errorf("%s = %s: %s receives the same as without it:\n %+v", ch.key, ch.value, ch.receiver, after[ch.receiver])
			}
		})
	}
}

// TestPackageDefaultsAreTheExample decodes config.toml.example as written
// (over nothing: no default fills a key it leaves out) and checks that
// each section is its package's DefaultConfig, so a default changed in a
// package and not in the example, or the other way round, fails here.
func TestPackageDefaultsAreTheExample(t *testing.T) {
	example, err := os.ReadFile("../config.toml.example")
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := toml.NewDecoder(bytes.NewReader(example)).DisallowUnknownFields().Decode(&c); err != nil {
		t.Fatal(err)
	}
	// The example writes derived paths as "" and empty lists as [], which
	// the packages' defaults leave nil.
	if len(c.Pool.MkfsOptions) == 0 {
		c.Pool.MkfsOptions = nil
	}
	if len(c.S3.AllowedBuckets) == 0 {
		c.S3.AllowedBuckets = nil
	}
	if len(c.GC.Pinned) == 0 {
		c.GC.Pinned = nil
	}
	for _, s := range []struct {
		name          string
		example, code any
	}{
		{"[daemon]", c.Daemon, defaults().Daemon},
		{"[metadata] (metadata.DefaultOptions)", c.Metadata, metadata.DefaultOptions()},
		{"[pool] (thinpool.DefaultConfig)", c.Pool.Config, thinpool.DefaultConfig()},
		{"[pool] (snapshotter.DefaultConfig)", c.Pool.DevicesConfig, snapshotter.DefaultConfig()},
		{"[s3] (s3source.DefaultConfig)", c.S3.Config, s3source.DefaultConfig()},
		{"[s3] pull policy (none)", []any{c.S3.Bucket, c.S3.Prefix, c.S3.AllowedBuckets}, []any{"", "", []string(nil)}},
		{"[pipeline] (pipeline.DefaultConfig)", c.Pipeline.Config, pipeline.DefaultConfig()},
		{"[pipeline] (gc.DefaultTarballCacheConfig)", c.Pipeline.TarballCacheConfig, gc.DefaultTarballCacheConfig()},
		{"[pipeline] (tarball.DefaultPolicyConfig)", c.Pipeline.PolicyConfig, tarball.DefaultPolicyConfig()},
		{"[queues] (pipeline.DefaultQueuesConfig)", c.Queues, pipeline.DefaultQueuesConfig()},
		{"[containerd] (pipeline.DefaultContainerdConfig)", c.Containerd, pipeline.DefaultContainerdConfig()},
		{"[differ] (differ.DefaultConfig)", c.Differ, differ.DefaultConfig()},
		{"[gc] (gc.DefaultConfig)", c.GC, gc.DefaultConfig()},
		{"[retention] (pipeline.DefaultRetentionConfig)", c.Retention, pipeline.DefaultRetentionConfig()},
	} {
		if !reflect.DeepEqual(s.example, s.code) {
			t.Errorf("%s: config.toml.example says\n %+v\nthe package's default is\n %+v", s.name, s.example, s.code)
		}
	}
}
