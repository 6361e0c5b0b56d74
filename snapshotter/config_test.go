package snapshotter

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

// TestBadConfigRefusedBeforeAnyDevice: New refuses a config its Validate
// refuses, naming the [pool] key, before it touches the pool.
func TestBadConfigRefusedBeforeAnyDevice(t *testing.T) {
	ctx := context.Background()
	db := metadatatest.Open(t)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{FSType: "btrfs"}, `pool.fs_type: must be "ext4" or "xfs", got "btrfs"`},
		{Config{BaseImageSize: 1 << 20}, "pool.base_image_size: must be a multiple of 512 bytes and at least 16MiB, got 1MiB"},
		{Config{MkfsOptions: []string{"-K", ""}}, "pool.mkfs_options[1]: must not be empty"},
	} {
		pool := thinpooltest.NewFakePool()
		_, err := New(ctx, db, pool, c.cfg)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an invalid argument saying %q", c.cfg, err, c.want)
		}
		if ids, _ := pool.ThinIDs(ctx); len(ids) != 0 {
			t.Errorf("%+v: the refused config left devices %v", c.cfg, ids)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
}
