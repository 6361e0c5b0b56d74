package main

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/containerd/log"
	systemd "github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/cheap"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

const serveDescription = `
Runs the daemon: takes the lock of daemon.root_dir (daemon.lock), of
metadata.path when it is outside that root (its name + ".lock"), and of
the pool (its name's, under /run/lock/containerd-flyio-snapshotter, and
its loop files' or block devices'); a second daemon on the same root,
database or pool exits at once naming the holder's pid. It opens
(migrating) the metadata database, opens the thin pool
(creating loop-file-backed pool files under pool.root_dir on the first start
when no devices are configured), reconciles the database with the pool, and
serves containerd's snapshots gRPC API on daemon.socket (mode 0600, root's
alone: its APIs act as root for their caller) for containerd's [proxy_plugins] entry. Snapshot keys are not scoped by the
request's containerd namespace: containerd already makes every key it sends
unique across namespaces, and its garbage collector calls without one.

It turns transparent huge pages off for itself (prctl PR_SET_THP_DISABLE,
then it executes itself again, same pid, so that the setting holds from
its first page fault) and bounds the C allocator (SQLite's) to two arenas:
under the kernel's "always" huge-page mode a small daemon's resident memory
otherwise climbs as huge pages fill its sparse heaps.

Readiness is reported to systemd (Type=notify) once the socket accepts
calls. SIGTERM or SIGINT stops it gracefully: no new calls are accepted,
in-flight calls finish (at most 30s), then the database is closed. Either
signal received while the daemon starts ends the start-up with status 0.

The S3 pipelines start with the daemon: runs a previous process left are
resumed, and daemon.control_socket (mode 0660, group daemon.socket_group;
callers other than root and that group's members are refused) serves pull
and activate.

With daemon.metrics_address set, Prometheus metrics are served at
http://ADDRESS/metrics: latency of every snapshotter method, pool data and
metadata usage, device counts by state, S3 requests by operation and
outcome, bytes read from S3, retried S3 requests, pull durations, and pulls
refused by policy rule.
`

func init() {
	cli.Register(&cli.Command{Name: "serve", Summary: "run the snapshotter daemon (containerd proxy plugin)", Run: runServe})
}

// serveFlags are serve's flags beyond --config and --db; each overrides
// the config key it names when given.
type serveFlags struct {
	socket, controlSocket, metrics, logLevel, logFormat string
}

func newServeFlagSet() (*serveFlags, func(args []string) error) {
	fs := cli.NewFlagSet("serve", "serve [--config FILE] [flags]", serveDescription)
	cli.AddDBFlags(fs)
	f := &serveFlags{}
	fs.Func("socket", "unix socket `PATH` of the snapshots gRPC API containerd's proxy plugin calls, overriding daemon.socket (the control socket is --control-socket)", cli.NonEmpty(&f.socket, "a socket"))
	fs.Func("control-socket", "unix socket `PATH` of the control API (pull, rm, activate), overriding daemon.control_socket", cli.NonEmpty(&f.controlSocket, "a socket"))
	fs.Func("metrics-address", "`HOST:PORT` of the metrics endpoint, overriding daemon.metrics_address", cli.NonEmpty(&f.metrics, "HOST:PORT"))
	fs.StringVar(&f.logLevel, "log-level", "", "log `LEVEL` (trace, debug, info, warn, error, fatal or panic), overriding daemon.log_level")
	fs.StringVar(&f.logFormat, "log-format", "", "log `FORMAT` (text or json), overriding daemon.log_format")
	return f, func(args []string) error {
		if err := cli.ParseFlags(fs, args); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return cli.UsageError(fs, fmt.Sprintf("unexpected argument %q (serve takes only flags)", fs.Arg(0)))
		}
		return nil
	}
}

// serveConfig loads the configuration and applies serve's overrides.
func (f *serveFlags) serveConfig() (*plugin.Config, error) {
	cfg, err := loadConfig()
	if err != nil {
		return nil, err
	}
	if f.socket != "" {
		cfg.Daemon.Socket = f.socket
	}
	if f.controlSocket != "" {
		cfg.Daemon.ControlSocket = f.controlSocket
	}
	if f.metrics != "" {
		cfg.Daemon.MetricsAddress = f.metrics
	}
	if f.logLevel != "" {
		cfg.Daemon.LogLevel = f.logLevel
	}
	if f.logFormat != "" {
		cfg.Daemon.LogFormat = f.logFormat
	}
	if err := cfg.Validate(); err != nil {
		return nil, &cli.ExitError{Code: 2, Msg: fmt.Sprintf("invalid configuration after flags: %v", err)}
	}
	return cfg, nil
}

func runServe(ctx context.Context, args []string) (err error) {
	// A log line that cannot be written is lost, not the daemon: without
	// this, Go's runtime kills the process with SIGPIPE at its first write
	// to a stderr whose reader is gone (a log pipe's reader died). Being
	// notified rather than ignoring it leaves the signal's default to the
	// programs the daemon runs (igzip).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	f, parse := newServeFlagSet()
	if err := parse(args); err != nil {
		return err
	}
	cfg, err := f.serveConfig()
	if err != nil {
		return err
	}
	if err := log.SetLevel(cfg.Daemon.LogLevel); err != nil {
		return fmt.Errorf("daemon.log_level %q: %w", cfg.Daemon.LogLevel, err)
	}
	if err := log.SetFormat(log.OutputFormat(cfg.Daemon.LogFormat)); err != nil {
		return fmt.Errorf("daemon.log_format %q: %w", cfg.Daemon.LogFormat, err)
	}
	l := log.G(ctx).WithField("version", cli.Version)
	// boundResidentMemory executes the binary again, which would forget a
	// SIGTERM or SIGINT caught so far (while the configuration was read):
	// the daemon would start over and run though asked to stop.
	if ctx.Err() != nil {
		l.Info("asked to stop before starting: not starting")
		return nil
	}
	boundResidentMemory(l)
	l.WithField("socket", cfg.Daemon.Socket).WithField("db", cfg.Metadata.Path).WithField("pool", cfg.Pool.Name).Info("starting")

	svc, err := plugin.Open(ctx, cfg)
	if err != nil {
		// A stop asked while the service opens (systemctl stop during a
		// long start-up) ends it as asked: status 0, so systemd does not
		// mark the unit failed. Open closes what it had opened.
		if ctx.Err() != nil {
			l.WithError(err).Info("stopped while starting: the service was not opened")
			return nil
		}
		return err
	}
	svc.Build = metrics.BuildInfo{Version: cli.Version, Commit: cli.Commit}
	defer func() {
		if cerr := svc.Close(); cerr != nil {
			l.WithError(cerr).Error("closing the service")
			if err == nil {
				err = cerr
			}
			return
		}
		l.Info("database closed, exiting")
	}()
	stopFetcher, err := svc.StartFetcher(ctx)
	if err != nil {
		// The same stop, once the service is open: the pipelines' start
		// fails on the canceled context (resuming the runs reads the
		// database with it). StartFetcher stops what it had started, and
		// the deferred Close closes the service.
		if ctx.Err() != nil {
			l.WithError(err).Info("stopped while starting: the S3 pipelines were not started")
			return nil
		}
		return err
	}
	defer stopFetcher()
	return svc.Serve(ctx, func() { sdNotify(ctx, systemd.SdNotifyReady) }, func() { sdNotify(ctx, systemd.SdNotifyStopping) })
}

// sdNotify tells systemd state when the daemon runs under a notify unit
// ($NOTIFY_SOCKET set); otherwise it does nothing.
func sdNotify(ctx context.Context, state string) {
	sent, err := systemd.SdNotify(false, state)
	switch {
	case err != nil:
		log.G(ctx).WithError(err).WithField("state", state).Warn("sd_notify failed")
	case sent:
		log.G(ctx).WithField("state", state).Debug("notified systemd")
	}
}

// cHeapArenas is how many malloc arenas the daemon's C heap (SQLite's)
// may use: two let two concurrent database calls allocate without waiting
// on one lock, and no more keep the freed pages of one connection's cache
// scattered where another cannot reuse them.
const cHeapArenas = 2

// boundResidentMemory sets the daemon's process-wide memory policies, so
// that a daemon running for months stays at the resident size its work
// needs: no transparent huge pages (hugePagesOffFromStart) and a bounded
// number of C heap arenas (cHeapArenas). Either failing only costs
// memory, so it is a warning.
func boundResidentMemory(l *log.Entry) {
	if err := hugePagesOffFromStart(); err != nil {
		l.WithError(err).Warn("transparent huge pages are not off for the daemon from its start; its resident memory may grow as the kernel fills huge pages in its heaps")
	}
	if !cheap.LimitArenas(cHeapArenas) {
		l.WithField("arenas", cHeapArenas).Warn("the C allocator refused a bound on its arenas; SQLite's freed memory may stay scattered across many")
	}
}

// hugePagesOffFromStart turns transparent huge pages off for the process
// and then executes the binary again with the same arguments and
// environment (same pid, so systemd and the lock see one daemon). Where
// the kernel's mode is "always" (Debian's default), page faults and
// khugepaged fill whole 2 MiB pages in any aligned range of an anonymous
// mapping; Go's and glibc's heaps are reserved in large aligned ranges and
// used sparsely, so resident memory climbs by megabytes with nothing more
// allocated, and a heap of a few MiB gains nothing from huge pages. The
// kernel keeps the setting across execve, and only a new image has it
// from the first fault: the Go runtime and the packages' initialisers
// have touched the heap before main runs. It returns nil once the setting
// is in force in this image; on an error the process goes on as it is.
func hugePagesOffFromStart() error {
	off, err := unix.PrctlRetInt(unix.PR_GET_THP_DISABLE, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("read the process's huge-page setting (PR_GET_THP_DISABLE): %w", err)
	}
	if off == 1 {
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("turn off transparent huge pages (PR_SET_THP_DISABLE): %w", err)
	}
	// Exec returns only when it failed.
	err = unix.Exec("/proc/self/exe", os.Args, os.Environ())
	return fmt.Errorf("execute the daemon again (/proc/self/exe) so that the setting covers its start; it covers only what the process maps from now: %w", err)
}
