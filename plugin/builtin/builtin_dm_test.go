//go:build dm

package builtin

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins"
	cplugin "github.com/containerd/plugin"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
)

// TestInitBuildsWorkingSnapshotter runs the registration's InitFn the way
// containerd does at start-up, on a real pool, with daemon.root_dir left to
// containerd's plugin root, and uses the snapshotter it returns.
func TestInitBuildsWorkingSnapshotter(t *testing.T) {
	ctx := context.Background()
	cfg := dmtest.Config(t)
	root := cfg.Daemon.RootDir
	cfg.Daemon.RootDir = "" // containerd's plugin root fills it in
	cfg.Metadata.Path, cfg.Pool.RootDir, cfg.Pipeline.DownloadDir = "", "", ""
	// The sockets are the daemon's: the plugin refuses keys it does not use.
	def := plugin.BuiltinDefaults()
	cfg.Daemon.Socket, cfg.Daemon.ControlSocket = def.Daemon.Socket, def.Daemon.ControlSocket

	ic := cplugin.NewContext(ctx, cplugin.NewPluginSet(), map[string]string{plugins.PropertyRootDir: root})
	ic.Config = cfg
	p := registration(t).Init(ic)
	inst, err := p.Instance()
	if err != nil {
		t.Fatalf("Init: %v", err)
	}
	cfg.Daemon.RootDir = root // for the teardown
	sn, ok := inst.(snapshots.Snapshotter)
	if !ok {
		t.Fatalf("instance is %T, not a snapshots.Snapshotter", inst)
	}
	if _, ok := inst.(snapshots.Cleaner); !ok {
		t.Error("instance is not a snapshots.Cleaner: containerd's GC would never reclaim devices")
	}
	if got := p.Meta.Exports[plugins.SnapshotterRootDir]; got != root {
		t.Errorf("exported root = %q, want %q", got, root)
	}
	nctx := namespaces.WithNamespace(ctx, "default")
	if _, err := sn.Prepare(nctx, "k", ""); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if err := sn.Commit(nctx, "c", "k"); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if err := sn.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := sn.Stat(nctx, "c"); err == nil {
		t.Error("Stat after Close succeeded: Close did not close the service")
	}
}
