package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"
	"google.golang.org/grpc"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
)

// DefaultShutdownTimeout bounds how long Serve waits for in-flight calls
// after its context is done before cutting them off.
const DefaultShutdownTimeout = 30 * time.Second

// SocketMode is the permission of the snapshots socket: containerd (root)
// and members of the socket's group may connect.
const SocketMode fs.FileMode = 0o660

// ServeOptions configure Serve.
type ServeOptions struct {
	// Socket is the unix socket path to listen on (required).
	Socket string
	// MetricsAddress is the host:port of the /metrics HTTP endpoint; empty
	// serves no metrics.
	MetricsAddress string
	// MetricsListener, when set, is used for the metrics endpoint instead
	// of listening on MetricsAddress (Serve closes it).
	MetricsListener net.Listener
	// Metrics is the registry served on the metrics endpoint; required when
	// MetricsAddress or MetricsListener is set.
	Metrics *metrics.Metrics
	// ShutdownTimeout bounds the graceful stop; 0 means
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Ready, when set, is called once both listeners accept connections.
	Ready func()
	// Stopping, when set, is called when the graceful stop begins.
	Stopping func()
}

// Serve serves sn as containerd's snapshots gRPC service on opts.Socket
// (created with SocketMode, its directory created, a stale socket left by
// a dead process replaced; a socket another live process serves is an
// error) and, when configured, the metrics endpoint. Namespaces come from
// each request's gRPC metadata, as containerd's proxy sends them. When ctx
// is done Serve stops accepting calls, lets in-flight calls finish for at
// most opts.ShutdownTimeout, cancels the rest, removes the socket and
// returns nil. It returns an error if a listener cannot be set up or fails.
// Serve does not close sn.
func Serve(ctx context.Context, sn snapshots.Snapshotter, opts ServeOptions) (err error) {
	l := log.G(ctx).WithField("socket", opts.Socket)
	mlis := opts.MetricsListener
	if (opts.MetricsAddress != "" || mlis != nil) && opts.Metrics == nil {
		if mlis != nil {
			mlis.Close()
		}
		return errors.New("serve: a metrics endpoint needs a metrics registry")
	}
	timeout := opts.ShutdownTimeout
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	if mlis == nil && opts.MetricsAddress != "" {
		if mlis, err = net.Listen("tcp", opts.MetricsAddress); err != nil {
			return fmt.Errorf("serve: metrics endpoint %s: %w", opts.MetricsAddress, err)
		}
	}
	if mlis != nil {
		defer mlis.Close()
	}
	lis, err := ListenUnix(ctx, opts.Socket, SocketMode)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer lis.Close()

	var httpSrv *http.Server
	if mlis != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", opts.Metrics.Handler())
		httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}

	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(sn))

	errc := make(chan error, 2)
	go func() {
		if err := srv.Serve(lis); err != nil {
			errc <- fmt.Errorf("grpc on %s: %w", opts.Socket, err)
		}
	}()
	if httpSrv != nil {
		go func() {
			if err := httpSrv.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics endpoint %s: %w", mlis.Addr(), err)
			}
		}()
		l = l.WithField("metrics", mlis.Addr().String())
	}
	l.Info("serving snapshots API")
	if opts.Ready != nil {
		opts.Ready()
	}

	var runErr error
	select {
	case <-ctx.Done():
		l.Info("stopping: waiting for in-flight calls")
	case runErr = <-errc:
		l.WithError(runErr).Error("listener failed, stopping")
	}
	if opts.Stopping != nil {
		opts.Stopping()
	}
	stopGracefully(ctx, srv, timeout)
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		if err := httpSrv.Shutdown(sctx); err != nil {
			l.WithError(err).Warn("metrics endpoint did not shut down cleanly")
		}
		cancel()
	}
	l.Info("stopped")
	if runErr != nil {
		return fmt.Errorf("serve: %w", runErr)
	}
	return nil
}

// stopGracefully lets in-flight calls finish for at most timeout, then
// cancels what is left.
func stopGracefully(ctx context.Context, srv *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.G(ctx).WithField("timeout", timeout).Warn("in-flight calls still running after the shutdown timeout: cancelling them")
		srv.Stop()
		<-done
	}
}

// ListenUnix listens on the unix socket path with permission mode. The
// parent directory is created (0711) when missing. An existing socket that
// nobody answers on is stale and replaced; one that answers belongs to a
// running process and is an error, as is a path that is not a socket.
func ListenUnix(ctx context.Context, path string, mode fs.FileMode) (net.Listener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("socket %q: must be an absolute path", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, fmt.Errorf("socket %s: create directory: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("socket %s: path exists and is not a socket (%s); refusing to replace it", path, fi.Mode().Type())
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s: another process is serving on it", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("socket %s: remove stale socket: %w", path, err)
		}
		log.G(ctx).WithField("socket", path).Info("removed stale socket")
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("socket %s: chmod %o: %w", path, mode, err)
	}
	return lis, nil
}

// Serve serves the service's snapshotter with Serve, on the configured
// socket; when daemon.metrics_address is set, every call is timed and the
// pool usage and device counts are exported there. ready and stopping are
// ServeOptions.Ready and Stopping.
func (s *Service) Serve(ctx context.Context, ready, stopping func()) error {
	var sn snapshots.Snapshotter = s.Snapshotter
	if s.served != nil {
		sn = s.served
	}
	opts := ServeOptions{Socket: s.Config.Daemon.Socket, Ready: ready, Stopping: stopping}
	if addr := s.Config.Daemon.MetricsAddress; addr != "" {
		m := metrics.New()
		m.AddPool(s.Pool)
		m.AddDevices(s.Snapshotter)
		m.AddPipeline(s.DB)
		if s.gcMetrics != nil {
			m.AddGC(s.gcMetrics)
		}
		sn = m.Wrap(sn)
		opts.MetricsAddress, opts.Metrics = addr, m
	}
	return Serve(ctx, sn, opts)
}
