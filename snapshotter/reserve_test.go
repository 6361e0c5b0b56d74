package snapshotter

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// serveProxy serves s over containerd's snapshots gRPC API on a unix
// socket and returns the client containerd's proxy plugin would use.
func serveProxy(t *testing.T, s snapshots.Snapshotter) snapshots.Snapshotter {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(s))
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "flyio")
}

// TestReserveRefusesNewSnapshots: with the pool's free data under the
// reserve, Prepare and View of a container's snapshot are refused, both
// on the snapshotter and through containerd's proxy client (what `ctr run`
// goes through): ResourceExhausted, with a message naming the free space,
// the reserve and the key to change; no device, record or intent is left.
// Once space is freed the same Prepare succeeds, and a snapshot made
// before keeps its device throughout.
func TestReserveRefusesNewSnapshots(t *testing.T) {
	ctx := context.Background()
	s, pool := newFakeSnapshotter(t, Config{})
	if _, err := s.Prepare(ctx, "layer", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "image", "layer"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "running", "image"); err != nil {
		t.Fatal(err)
	}
	// 4096 blocks of 64 KiB, 300 free: under the 10% reserve (410 blocks).
	under := thinpool.PoolStatus{UsedMetadataBlocks: 50, TotalMetadataBlocks: 4096, UsedDataBlocks: 4096 - 300,
		TotalDataBlocks: 4096, BlockSizeSectors: 128, Mode: thinpool.ModeReadWrite, QueueIfNoSpace: true}
	pool.SetSpace(under, 10)
	before, _ := pool.Counts()
	client := serveProxy(t, s)
	for _, c := range []struct {
		via  string
		call func() error
	}{
		{"Prepare", func() error { _, err := s.Prepare(ctx, "ctr-1", "image"); return err }},
		{"View", func() error { _, err := s.View(ctx, "view-1", "image"); return err }},
		{"proxy Prepare", func() error { _, err := client.Prepare(ctx, "ctr-2", "image"); return err }},
		{"proxy View", func() error { _, err := client.View(ctx, "view-2", "image"); return err }},
	} {
		err := c.call()
		if !errdefs.IsResourceExhausted(err) {
			t.Fatalf("%s under the reserve: %v; want ResourceExhausted", c.via, err)
		}
		for _, want := range []string{"data 7.3% free (18.8 MiB of 256.0 MiB)", "10% reserve (25.6 MiB)", "pool.min_free_space"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s refusal %q does not say %q", c.via, err, want)
			}
		}
		t.Logf("%s: %v", c.via, err)
	}
	if _, err := s.Prepare(ctx, "ctr-1", "image"); !errors.Is(err, thinpool.ErrBelowReserve) {
		t.Fatalf("in process the refusal also matches thinpool.ErrBelowReserve (the pipelines stop a pull on it): %v", err)
	}
	if after, _ := pool.Counts(); after != before {
		t.Fatalf("refused creates left devices: %d thin ids, was %d", after, before)
	}
	for _, key := range []string{"ctr-1", "view-1", "ctr-2", "view-2"} {
		if _, err := s.Stat(ctx, key); !errdefs.IsNotFound(err) {
			t.Fatalf("Stat %s after its refusal: %v; want NotFound", key, err)
		}
	}
	assertSettled(t, s, pool)
	if _, err := s.Mounts(ctx, "running"); err != nil {
		t.Fatalf("the running container's mounts under the reserve: %v", err)
	}

	// A pool out of data space refuses the same way (ResourceExhausted).
	full := under
	full.UsedDataBlocks, full.Mode = full.TotalDataBlocks, thinpool.ModeOutOfDataSpace
	pool.SetSpace(full, 10)
	if _, err := client.Prepare(ctx, "ctr-3", "image"); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Prepare on a full pool: %v; want ResourceExhausted", err)
	}

	freed := under
	freed.UsedDataBlocks = 4096 - 410
	pool.SetSpace(freed, 10)
	if _, err := client.Prepare(ctx, "ctr-1", "image"); err != nil {
		t.Fatalf("Prepare with the reserve free again: %v", err)
	}
	assertSettled(t, s, pool)
}
