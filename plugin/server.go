package plugin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	diffapi "github.com/containerd/containerd/api/services/diff/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/diffservice"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	contentproxy "github.com/containerd/containerd/v2/core/content/proxy"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/differ"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
)

// DefaultShutdownTimeout bounds how long Serve waits for in-flight calls
// after its context is done before cutting them off.
const DefaultShutdownTimeout = 30 * time.Second

// SocketMode is the permission of the control socket: root and members
// of its group (daemon.socket_group) may connect.
const SocketMode fs.FileMode = 0o660

// DaemonSocketMode is the permission of daemon.socket, owned by root and
// root's group, whatever daemon.socket_group says: only root may connect.
// Its snapshots and diff APIs act as root for their caller (Apply mounts
// what the caller names and writes a layer there, setuid bits and owners
// kept; a snapshot committed under a chain ID is what the S3 pipelines
// take as that chain), and containerd, their one client, runs as root.
const DaemonSocketMode fs.FileMode = 0o600

// DefaultSocketGroup is daemon.socket_group's default: root's group, so
// only root may drive the daemon.
const DefaultSocketGroup = "0"

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
	// DebugAddress is the host:port of the debug endpoint (pprof and
	// /healthz); empty serves none.
	DebugAddress string
	// DebugListener, when set, is used for the debug endpoint instead of
	// listening on DebugAddress (Serve closes it).
	DebugListener net.Listener
	// Debug is what the debug endpoint serves (DebugHandler); required
	// when DebugAddress or DebugListener is set.
	Debug http.Handler
	// ShutdownTimeout bounds the graceful stop; 0 means
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Ready, when set, is called once every listener accepts connections.
	Ready func()
	// Stopping, when set, is called when the graceful stop begins.
	Stopping func()
	// Applier, when set, is served beside the snapshotter as containerd's
	// diff API (Apply only), for a [proxy_plugins] entry of type "diff".
	Applier diff.Applier
}

// httpIdleTimeout is how long the metrics and debug endpoints keep a
// connection open with no request under way: they listen on TCP, and a
// client that goes quiet must not hold a descriptor and a goroutine for
// the daemon's life. A scraper reconnects at its next scrape.
const httpIdleTimeout = 10 * time.Second

// httpEndpoint is one of Serve's optional HTTP listeners.
type httpEndpoint struct {
	name    string // for logs and errors: "metrics", "debug"
	addr    string
	lis     net.Listener
	handler http.Handler
	srv     *http.Server
}

// listen opens e's listener on its address unless one was given; an
// endpoint with neither is not served.
func (e *httpEndpoint) listen() error {
	if e.lis == nil && e.addr != "" {
		lis, err := net.Listen("tcp", e.addr)
		if err != nil {
			return fmt.Errorf("serve: %s endpoint %s: %w", e.name, e.addr, err)
		}
		e.lis = lis
	}
	if e.lis != nil {
		e.srv = &http.Server{Handler: e.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: httpIdleTimeout}
	}
	return nil
}

// Serve serves sn as containerd's snapshots gRPC service on opts.Socket
// (created with DaemonSocketMode, its directory created, a stale socket left by
// a dead process replaced; a socket another live process serves is an
// error) and, when configured, the metrics and debug endpoints. Namespaces
// come from each request's gRPC metadata, as containerd's proxy sends them.
// When ctx is done Serve stops accepting calls, lets in-flight calls finish
// for at most opts.ShutdownTimeout, cancels the rest, removes the socket
// and returns nil. It returns an error if a listener cannot be set up or
// fails. Serve does not close sn.
func Serve(ctx context.Context, sn snapshots.Snapshotter, opts ServeOptions) (err error) {
	l := log.G(ctx).WithField("socket", opts.Socket)
	eps := []*httpEndpoint{{name: "metrics", addr: opts.MetricsAddress, lis: opts.MetricsListener},
		{name: "debug", addr: opts.DebugAddress, lis: opts.DebugListener, handler: opts.Debug}}
	defer func() {
		for _, e := range eps {
			if e.lis != nil {
				e.lis.Close()
			}
		}
	}()
	if (opts.MetricsAddress != "" || opts.MetricsListener != nil) && opts.Metrics == nil {
		return errors.New("serve: a metrics endpoint needs a metrics registry")
	}
	if (opts.DebugAddress != "" || opts.DebugListener != nil) && opts.Debug == nil {
		return errors.New("serve: a debug endpoint needs a handler")
	}
	if opts.Metrics != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", opts.Metrics.Handler())
		eps[0].handler = mux
	}
	timeout := opts.ShutdownTimeout
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	for _, e := range eps {
		if err := e.listen(); err != nil {
			return err
		}
	}
	lis, err := ListenUnix(ctx, opts.Socket, DaemonSocketMode, 0)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer lis.Close()

	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotsServer{snapshotservice.FromSnapshotter(sn)})
	if opts.Applier != nil {
		diffapi.RegisterDiffServer(srv, diffservice.FromApplierAndComparer(opts.Applier, nil))
	}

	errc := make(chan error, 1+len(eps))
	go func() {
		if err := srv.Serve(lis); err != nil {
			errc <- fmt.Errorf("grpc on %s: %w", opts.Socket, err)
		}
	}()
	for _, e := range eps {
		if e.srv == nil {
			continue
		}
		go func() {
			if err := e.srv.Serve(e.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s endpoint %s: %w", e.name, e.lis.Addr(), err)
			}
		}()
		l = l.WithField(e.name, e.lis.Addr().String())
	}
	l.WithField("diff", opts.Applier != nil).Info("serving snapshots API")
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
	// One deadline for every listener, stopped side by side: the timeout
	// bounds the whole stop, and an HTTP request still running at its end
	// is cut off like a gRPC call, not left running after Serve returns.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	var stops sync.WaitGroup
	for _, e := range eps {
		if e.srv == nil {
			continue
		}
		stops.Go(func() {
			if err := e.srv.Shutdown(sctx); err != nil {
				l.WithError(err).WithField("endpoint", e.name).Warn("HTTP endpoint did not shut down cleanly: cutting off its requests")
				e.srv.Close()
			}
		})
	}
	stopGracefully(ctx, srv, timeout)
	stops.Wait()
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

// ListenUnix listens on the unix socket path, which it gives group gid and
// permission mode. The parent directory is created (0711) when missing. An
// existing socket that nobody answers on is stale and replaced; one that
// answers belongs to a running process and is an error, as is a path that
// is not a socket.
//
// The socket is bound in a private directory (0700) beside path, given its
// group and mode there, and only then linked at path (never replacing a
// socket another process bound there meanwhile): at no moment can a
// process the mode does not admit connect, whatever the process umask.
// Closing the listener removes the socket, unless another one replaced it.
func ListenUnix(ctx context.Context, path string, mode fs.FileMode, gid int) (net.Listener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("socket %q: must be an absolute path", path)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o711); err != nil {
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
	private, err := os.MkdirTemp(dir, ".bind-")
	if err != nil {
		return nil, fmt.Errorf("socket %s: private directory: %w", path, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	// The private directory's name makes the bound path longer than path,
	// which may already be as long as a unix address holds: past that, the
	// socket is bound through the directory's descriptor, whose path under
	// /proc is short whatever the directory's is.
	bindAt := tmp
	if len(tmp) > conf.MaxSocketPath {
		fd, err := unix.Open(private, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("socket %s: private directory: %w", path, err)
		}
		defer unix.Close(fd)
		bindAt = fmt.Sprintf("/proc/self/fd/%d/s", fd)
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: bindAt, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	lis.SetUnlinkOnClose(false)
	fail := func(step string, err error) (net.Listener, error) {
		lis.Close()
		return nil, fmt.Errorf("socket %s: %s: %w", path, step, err)
	}
	if err := os.Lchown(tmp, -1, gid); err != nil {
		return fail(fmt.Sprintf("give group %d", gid), err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(fmt.Sprintf("chmod %o", mode), err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(tmp, &st); err != nil {
		return fail("stat", err)
	}
	// A link, not a rename: a rename would silently replace a socket that
	// another process bound at path since the check above (two daemons
	// started together), leaving that one serving on an unreachable inode.
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fail("move into place", fmt.Errorf("another process bound it meanwhile: %w", err))
		}
		return fail("move into place", err)
	}
	return &unixListener{UnixListener: lis, path: path, ino: st.Ino}, nil
}

// unixListener removes its socket file when closed, if the file is still
// the one it bound (same inode).
type unixListener struct {
	*net.UnixListener
	path string
	ino  uint64
}

// Addr is the socket's path (it was bound under a temporary name).
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	var st unix.Stat_t
	if unix.Lstat(l.path, &st) == nil && st.Ino == l.ino {
		os.Remove(l.path)
	}
	return err
}

// ErrPeerRefused is matched by the error a refused caller of a socket
// guarded by PeerCheck is told about.
var ErrPeerRefused = errors.New("caller is neither root nor a member of the socket's group")

// PeerCheck wraps a unix socket listener so that only root and members of
// group gid (primary or supplementary, from SO_PEERCRED and SO_PEERGROUPS:
// what the caller was when it connected) get their connections through. Others are answered, on
// the connection, an HTTP 403 whose JSON body's "error" names their uid,
// the group and the rule, and are logged; Accept goes on to the next
// caller. It is a second line behind the socket's own mode.
func PeerCheck(ctx context.Context, lis net.Listener, gid int) net.Listener {
	return &peerListener{Listener: lis, gid: gid, ctx: ctx}
}

type peerListener struct {
	net.Listener
	gid int
	ctx context.Context
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, groups, err := peerCred(c)
		if err == nil && allowed(cred, groups, l.gid) {
			return c, nil
		}
		msg := fmt.Sprintf("control socket: %v (peer credentials: %v)", ErrPeerRefused, err)
		if err == nil {
			msg = fmt.Sprintf("control socket: uid %d (pid %d): %v %d (daemon.socket_group)", cred.Uid, cred.Pid, ErrPeerRefused, l.gid)
			log.G(l.ctx).WithField("uid", cred.Uid).WithField("pid", cred.Pid).WithField("gid", l.gid).Warn("control socket: caller refused")
		}
		go refuse(c, msg)
	}
}

// peerCred returns the credentials and the supplementary groups the
// kernel recorded for the caller of c when it connected. Both are read
// from the socket, not from /proc/PID, whose process may have exited and
// its pid been reused since.
func peerCred(c net.Conn) (*unix.Ucred, []uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, nil, fmt.Errorf("not a unix socket connection (%T)", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	var (
		cred   *unix.Ucred
		groups []uint32
		cerr   error
	)
	if err := raw.Control(func(fd uintptr) {
		if cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); cerr == nil {
			groups, cerr = peerGroups(int(fd))
		}
	}); err != nil {
		return nil, nil, err
	}
	return cred, groups, cerr
}

// peerGroups reads SO_PEERGROUPS, the supplementary groups of the peer of
// unix socket fd when it connected: an array of gids, whose length the
// kernel gives with ERANGE when the buffer is too short.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case errno == unix.ERANGE && int(n/4) > len(buf):
			buf = make([]uint32, n/4)
		case errno != 0:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", errno)
		default:
			return buf[:n/4], nil
		}
	}
}

// allowed: root, the group as primary group, or the group among the
// caller's supplementary groups.
func allowed(cred *unix.Ucred, groups []uint32, gid int) bool {
	return cred.Uid == 0 || int(cred.Gid) == gid || slices.Contains(groups, uint32(gid))
}

// refuse reads the caller's request head (briefly) so that closing does
// not reset the connection under the answer, then answers 403.
func refuse(c net.Conn, msg string) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil || line == "\r\n" || line == "\n" {
			break
		}
	}
	body, _ := json.Marshal(map[string]string{"error": msg})
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n", len(body)+1, body)
}

// Serve serves the service's snapshotter with Serve, on the configured
// socket; when daemon.metrics_address is set, every call is timed and the
// pool usage and device counts are exported there; when
// daemon.debug_address is set, pprof and /healthz are served there. ready
// and stopping are ServeOptions.Ready and Stopping.
func (s *Service) Serve(ctx context.Context, ready, stopping func()) error {
	var sn snapshots.Snapshotter = s.Snapshotter
	if s.served != nil {
		sn = s.served
	}
	applier, closeApplier, err := s.applier(ctx)
	if err != nil {
		return err
	}
	defer closeApplier()
	opts := ServeOptions{Socket: s.Config.Daemon.Socket, Ready: ready, Stopping: stopping}
	if addr := s.Config.Daemon.DebugAddress; addr != "" {
		opts.DebugAddress, opts.Debug = addr, DebugHandler(s.healthSources())
	}
	if addr := s.Config.Daemon.MetricsAddress; addr != "" {
		m := s.metricsRegistry()
		m.AddBuildInfo(s.Build)
		m.AddPool(s.Pool)
		m.AddPoolBacking(s.Pool)
		m.AddDevices(s.Snapshotter)
		m.AddPipeline(pipeline.RecordsOf(s.DB))
		if s.gcMetrics != nil {
			m.AddGC(s.gcMetrics)
		}
		if s.poolEvents != nil {
			m.AddPoolEvents(s.poolEvents)
		}
		if s.pipelines != nil {
			m.AddSpools(s.pipelines)
		}
		sn = m.Wrap(sn)
		applier = m.WrapApplier(applier)
		opts.MetricsAddress, opts.Metrics = addr, m
	}
	opts.Applier = applier
	return Serve(ctx, sn, opts)
}

// applier is the diff service's Applier: registry layers read from
// containerd's content store (containerd.address, dialled at the first
// call, so containerd may start after the daemon) and extracted under
// [differ]'s rules, onto snapshots mounted under MountDir (cleared of what
// an earlier run left first). close releases the connection.
func (s *Service) applier(ctx context.Context) (diff.Applier, func(), error) {
	if err := differ.SetMountDir(ctx, s.Config.MountDir()); err != nil {
		return nil, nil, fmt.Errorf("serve: %w", err)
	}
	addr := "unix://" + strings.TrimPrefix(s.Config.Containerd.Address, "unix://")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("serve: containerd's content store at %s: %w", addr, err)
	}
	a := &differ.Applier{Content: contentproxy.NewContentStore(conn), Limits: s.Config.Differ.Limits(), GzipCommand: s.inflateWith()}
	return a, func() { conn.Close() }, nil
}

// snapshotsServer is containerd's snapshots service over a snapshotter,
// with List's error sent by its errdefs class as every other method's is:
// containerd's service returns Walk's error as it is, which reaches the
// client as Unknown (an invalid filter, a closed snapshotter).
type snapshotsServer struct{ snapshotsapi.SnapshotsServer }

// List is the service's List, its error converted for the wire.
func (s snapshotsServer) List(req *snapshotsapi.ListSnapshotsRequest, ss snapshotsapi.Snapshots_ListServer) error {
	return errgrpc.ToGRPC(s.SnapshotsServer.List(req, ss))
}
