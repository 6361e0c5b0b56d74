package builtin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
	"github.com/containerd/containerd/v2/plugins"
	cplugin "github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// registration returns the flyio snapshot plugin's registration as
// containerd's registry lists it.
func registration(t *testing.T) cplugin.Registration {
	t.Helper()
	for _, r := range registry.Graph(func(*cplugin.Registration) bool { return false }) {
		if r.Type == plugins.SnapshotPlugin && r.ID == ID {
			return r
		}
	}
	t.Fatalf("no %s.%s plugin registered", plugins.SnapshotPlugin, ID)
	return cplugin.Registration{}
}

// decodeLikeContainerd loads a containerd config file and decodes the
// plugin's table the way containerd's server does.
func decodeLikeContainerd(t *testing.T, body string) *plugin.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "containerd.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var cc srvconfig.Config
	if err := srvconfig.LoadConfig(context.Background(), path, &cc); err != nil {
		t.Fatal(err)
	}
	r := registration(t)
	out, err := cc.Decode(context.Background(), r.URI(), r.Config)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*plugin.Config)
}

func TestRegisteredAsSnapshotterFlyio(t *testing.T) {
	r := registration(t)
	if r.URI() != "io.containerd.snapshotter.v1.flyio" {
		t.Errorf("URI = %s", r.URI())
	}
	if _, ok := r.Config.(*plugin.Config); !ok {
		t.Errorf("config type %T, want *plugin.Config", r.Config)
	}
}

func TestContainerdConfigSectionIsTheDaemonConfig(t *testing.T) {
	cfg := decodeLikeContainerd(t, `
version = 3
[plugins.'io.containerd.snapshotter.v1.flyio'.pool]
  name = "ctr-pool"
  base_image_size = "1GiB"
  async_remove = false
  min_free_space = "5%"
`)
	if err := plugin.ResolveBuiltin(cfg, "/var/lib/containerd/io.containerd.snapshotter.v1.flyio"); err != nil {
		t.Fatal(err)
	}
	if cfg.Pool.Name != "ctr-pool" || cfg.Pool.BaseImageSize != 1<<30 || cfg.Pool.AsyncRemove || cfg.Pool.MinFreeSpace != plugin.Pct(5) {
		t.Errorf("pool section not applied: %+v", cfg.Pool)
	}
	if cfg.Metadata.Path != "/var/lib/containerd/io.containerd.snapshotter.v1.flyio/metadata.db" {
		t.Errorf("metadata.path = %q, want it under containerd's plugin root", cfg.Metadata.Path)
	}
	if cfg.Pool.RootDir != "/var/lib/containerd/io.containerd.snapshotter.v1.flyio/pool" {
		t.Errorf("pool.root_dir = %q", cfg.Pool.RootDir)
	}
	if cfg.Pool.BlockSize != thinpool.DefaultBlockSize {
		t.Errorf("unset key lost its default: block_size = %s", cfg.Pool.BlockSize)
	}
}

func TestInitRejectsBadConfigBeforeTouchingAnything(t *testing.T) {
	r := registration(t)
	cfg := plugin.BuiltinDefaults()
	cfg.Pool.FSType = "btrfs"
	root := filepath.Join(t.TempDir(), "plugin-root")
	ic := cplugin.NewContext(context.Background(), cplugin.NewPluginSet(), map[string]string{plugins.PropertyRootDir: root})
	ic.Config = cfg
	_, err := r.Init(ic).Instance()
	if err == nil || !strings.Contains(err.Error(), "pool.fs_type") {
		t.Fatalf("Init err = %v, want one naming pool.fs_type", err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("plugin root was created by a rejected config: %v", err)
	}
}

// TestKeysTheBuiltinPluginDoesNotUseAreRefused: in containerd the plugin
// serves snapshots from [metadata] and [pool] only, and does not grow the
// pool; a key of another section set in containerd's config (image
// collection, S3, metrics), or of the pool's growth, would be validated
// and then ignored, so it is refused, named.
func TestKeysTheBuiltinPluginDoesNotUseAreRefused(t *testing.T) {
	cfg := decodeLikeContainerd(t, `
version = 3
[plugins.'io.containerd.snapshotter.v1.flyio'.pool]
  name = "ctr-pool"
  max_data_size = "200GiB"
  growth_reserve = "2GiB"
[plugins.'io.containerd.snapshotter.v1.flyio'.gc]
  high_threshold = 70.0
  low_threshold = 60.0
[plugins.'io.containerd.snapshotter.v1.flyio'.daemon]
  metrics_address = "127.0.0.1:9123"
`)
	err := plugin.ResolveBuiltin(cfg, "/var/lib/containerd/io.containerd.snapshotter.v1.flyio")
	if err == nil {
		t.Fatal("keys the built-in plugin never reads were accepted")
	}
	// The pool grows only at the daemon's low-water handling.
	for _, key := range []string{"gc.high_threshold", "gc.low_threshold", "daemon.metrics_address", "pool.max_data_size", "pool.growth_reserve"} {
		if !strings.Contains(err.Error(), key+": is not used by the built-in plugin") {
			t.Errorf("error %q does not name %s", err, key)
		}
	}
	if strings.Contains(err.Error(), "pool.name") {
		t.Errorf("error %q names pool.name, which the plugin uses", err)
	}
}
