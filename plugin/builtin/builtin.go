// Package builtin registers the flyio snapshotter as a containerd v2
// built-in snapshot plugin (type io.containerd.snapshotter.v1, id "flyio").
// A custom containerd build links it in with a blank import:
//
//	import _ "github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/builtin"
//
// Its configuration is the same as the daemon's config file, under the
// plugin's table of containerd's config:
//
//	[plugins.'io.containerd.snapshotter.v1.flyio'.pool]
//	  name = "flyio-pool"
//	  base_image_size = "10GiB"
//
// The plugin reads [metadata], [pool] and daemon.root_dir only: the S3
// pipelines, image collection, retention, the pool's growth
// (pool.max_data_size, pool.growth_reserve), the diff service, metrics
// and the sockets are the daemon's, under serve, and a key of theirs set
// here is refused rather than ignored. When daemon.root_dir is not set, the
// plugin's root under containerd's root directory is used
// (/var/lib/containerd/io.containerd.snapshotter.v1.flyio by default), and
// the database and the pool files are derived from it.
package builtin

import (
	"fmt"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/platforms"
	cplugin "github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// ID is the plugin's id: containerd's snapshotter name ("--snapshotter flyio").
const ID = "flyio"

func init() {
	registry.Register(&cplugin.Registration{
		Type:   plugins.SnapshotPlugin,
		ID:     ID,
		Config: plugin.BuiltinDefaults(),
		InitFn: func(ic *cplugin.InitContext) (any, error) {
			ic.Meta.Platforms = append(ic.Meta.Platforms, platforms.DefaultSpec())
			cfg, ok := ic.Config.(*plugin.Config)
			if !ok {
				return nil, fmt.Errorf("flyio snapshotter: config is %T, want *plugin.Config", ic.Config)
			}
			root := ic.Properties[plugins.PropertyRootDir]
			if err := plugin.ResolveBuiltin(cfg, root); err != nil {
				return nil, fmt.Errorf("flyio snapshotter: %w", err)
			}
			svc, err := plugin.Open(ic.Context, cfg)
			if err != nil {
				return nil, fmt.Errorf("flyio snapshotter: %w", err)
			}
			ic.Meta.Exports[plugins.SnapshotterRootDir] = cfg.Daemon.RootDir
			return &serviceSnapshotter{Snapshotter: svc.Snapshotter, svc: svc}, nil
		},
	})
}

// serviceSnapshotter is the snapshotter containerd gets: Close closes the
// whole service (snapshotter, pool handles, database), which containerd
// does on shutdown. Cleanup and the rest come from the embedded
// snapshotter.
type serviceSnapshotter struct {
	*snapshotter.Snapshotter
	svc *plugin.Service
}

// Close closes the service.
func (s *serviceSnapshotter) Close() error { return s.svc.Close() }

var _ snapshots.Cleaner = (*serviceSnapshotter)(nil)
