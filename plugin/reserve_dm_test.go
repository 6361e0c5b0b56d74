//go:build dm

package plugin_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// TestPullLeavesTheReserve: the reserve (pool.min_free_space) is kept for
// the writes of the running containers. A compressed layer looks small
// before its download (its tarball), so the room made for it is small; its
// extraction is what must stop at the reserve, not write into it, leaving
// the containers' writes to queue and fail on a pool the pull filled.
func TestPullLeavesTheReserve(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	plugin.LoopbackListener(t).Close()
	srv := s3test.NewServer(t)
	cfg := dmtest.Config(t)
	cfg.S3.Region, cfg.S3.Endpoint, cfg.S3.PathStyle, cfg.S3.Anonymous = "us-east-1", srv.URL, true, true
	cfg.Pool.DataSize = 96 << 20
	cfg.Pool.BaseImageSize = 256 << 20
	pull := daemonPulls(t, ctx, cfg)
	full := []string{"etc", "usr", "var"}
	srv.Put(t, "small/1.tar", tarOf(t, full, map[string]int{"etc/hostname": 6}))
	if _, err := pull(srv.Bucket, "small/"); err != nil {
		t.Fatal(err)
	}
	pool, err := thinpool.OpenActive(ctx, cfg.ThinpoolConfig())
	if err != nil {
		t.Fatal(err)
	}
	free := func() (free, reserve uint64) {
		t.Helper()
		st, err := pool.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		reserve, _ = st.ReserveBytes(cfg.Pool.MinFreeSpace.Value())
		return (st.TotalDataBlocks - st.UsedDataBlocks) * uint64(st.BlockSizeSectors) * 512, reserve
	}
	before, reserve := free()
	// One file of what is free less half the reserve: gzip makes it a few
	// hundred KiB, which the room made before the download counts.
	size := int(before - reserve/2)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarOf(t, full, map[string]int{"usr/big": size}))
	zw.Close()
	srv.Put(t, "big/1.tar.gz", gz.Bytes())
	_, err = pull(srv.Bucket, "big/")
	after, _ := free()
	t.Logf("pool free %d bytes, reserve %d; layer of %d bytes (%d compressed): %v; free after %d", before, reserve, size, gz.Len(), err, after)
	if after < reserve {
		t.Errorf("the pull of a %d-byte file (%d compressed) left the pool %d bytes free, under its %d-byte reserve (pull: %v)", size, gz.Len(), after, reserve, err)
	}
}
