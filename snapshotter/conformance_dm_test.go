//go:build dm

package snapshotter

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/core/snapshots/testsuite"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// containerd's conformance suite against the snapshotter in-process: every
// case gets its own pool and database.
func TestConformanceInProcess(t *testing.T) {
	t.Parallel() // with TestConformanceGRPC: their long 128-layer cases overlap
	testsuite.SnapshotterSuite(t, "flyio", func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		e := newTestEnv(t, "cfi")
		s, err := New(ctx, e.db, e.pool, Config{BaseImageSize: testBaseSize, AsyncRemove: true})
		if err != nil {
			return nil, nil, err
		}
		return s, func() error { return checkAfterSuite(ctx, s) }, nil
	})
}

// The same suite through gRPC: the snapshotter served by containerd's
// snapshotservice on a unix socket, used through containerd's proxy client
// (what containerd does with a [proxy_plugins] entry).
func TestConformanceGRPC(t *testing.T) {
	t.Parallel()
	testsuite.SnapshotterSuite(t, "flyio", func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		e := newTestEnv(t, "cfg")
		s, err := New(ctx, e.db, e.pool, Config{BaseImageSize: testBaseSize, AsyncRemove: true})
		if err != nil {
			return nil, nil, err
		}
		sock := filepath.Join(root, "snapshotter.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			return nil, nil, err
		}
		srv := grpc.NewServer()
		snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(s))
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			srv.Stop()
			return nil, nil, err
		}
		client := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "flyio")
		return client, func() error {
			cerr := conn.Close()
			srv.GracefulStop()
			if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				cerr = errors.Join(cerr, err)
			}
			return errors.Join(cerr, checkAfterSuite(ctx, s))
		}, nil
	})
}

// checkAfterSuite reclaims removed devices and checks the pool and the
// database agree.
func checkAfterSuite(ctx context.Context, s *Snapshotter) error {
	s.closed.Store(false) // the suite may have closed it (CloseTwice)
	if err := s.Cleanup(ctx); err != nil {
		return err
	}
	ids, err := s.pool.ThinIDs(ctx)
	if err != nil {
		return err
	}
	devs, err := s.reads().ThinDevices(ctx, "")
	if err != nil {
		return err
	}
	if len(ids) != len(devs) {
		return errors.New("pool thin ids and device records differ after the suite")
	}
	return nil
}
