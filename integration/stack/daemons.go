package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Namespace is the containerd namespace of the end-to-end run.
const Namespace = "flyio-e2e"

// Daemon is our snapshotter daemon (`serve`) with its config file.
type Daemon struct {
	Bin     string // containerd-flyio-snapshotter
	Config  string // its config.toml
	Root    string // daemon.root_dir
	Socket  string // snapshots gRPC socket (containerd's proxy plugin address)
	Control string // control socket (pull, activate)
	Pool    string // dm name of its pool
	Metrics string // host:port its /metrics endpoint is bound to, if any (set by Start)
	Debug   string // host:port its pprof endpoint is bound to, if any (set by Start)
	Proc    *Proc
}

// DaemonOptions are what the end-to-end run sets in the daemon's config;
// everything else is the embedded default.
type DaemonOptions struct {
	Dir        string // root_dir; the pool's loop files live in Dir/pool
	PoolName   string
	DataSize   string // pool.data_size, e.g. "3GiB"
	S3         *S3    // the bucket pull reads, anonymously
	Containerd string // containerd's socket, where pull registers images
	Metrics    string // daemon.metrics_address (host:port, AnyLoopbackPort), empty for none
	Debug      string // daemon.debug_address (host:port, AnyLoopbackPort: pprof), empty for none
	// GzipCommand is daemon.gzip_command, empty for the default.
	GzipCommand string
	// ExtraTOML is appended to the config as is: whole tables a test sets
	// beyond these (say, a [retention] compressed to a test's time scale).
	ExtraTOML string
}

// WriteDaemonConfig writes the daemon's config into opts.Dir and returns a
// Daemon ready to Start.
func WriteDaemonConfig(bin string, opts DaemonOptions) (*Daemon, error) {
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("daemon folder: %w", err)
	}
	d := &Daemon{
		Bin: bin, Root: opts.Dir, Pool: opts.PoolName,
		Config:  filepath.Join(opts.Dir, "config.toml"),
		Socket:  filepath.Join(opts.Dir, "run", "snapshotter.sock"),
		Control: filepath.Join(opts.Dir, "run", "control.sock"),
	}
	var b strings.Builder
	d.Metrics, d.Debug = opts.Metrics, opts.Debug
	fmt.Fprintf(&b, "[daemon]\nsocket = %q\ncontrol_socket = %q\nroot_dir = %q\nlog_level = \"info\"\nmetrics_address = %q\n", d.Socket, d.Control, d.Root, opts.Metrics)
	if opts.Debug != "" {
		// Only when asked: the upgrade test's previous release predates
		// the key and refuses a config that names it.
		fmt.Fprintf(&b, "debug_address = %q\n", opts.Debug)
	}
	if opts.GzipCommand != "" {
		fmt.Fprintf(&b, "gzip_command = %q\n", opts.GzipCommand)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "[pool]\nname = %q\ndata_size = %q\nmetadata_size = \"64MiB\"\nbase_image_size = \"1GiB\"\n\n", opts.PoolName, opts.DataSize)
	if opts.S3 != nil {
		fmt.Fprintf(&b, "[s3]\nbucket = %q\nregion = %q\nendpoint = %q\npath_style = true\nanonymous = true\n\n", opts.S3.Bucket, S3Region, opts.S3.Endpoint)
	}
	if opts.Containerd != "" {
		fmt.Fprintf(&b, "[containerd]\naddress = %q\nnamespace = %q\n\n", opts.Containerd, Namespace)
	}
	b.WriteString(opts.ExtraTOML)
	if err := os.WriteFile(d.Config, []byte(b.String()), 0o644); err != nil {
		return nil, fmt.Errorf("daemon config: %w", err)
	}
	return d, nil
}

// Start runs `serve --config` and waits for its snapshots socket.
func (d *Daemon) Start(ctx context.Context) error {
	var err error
	d.Proc, err = StartProc("containerd-flyio-snapshotter", filepath.Join(d.Root, "snapshotter.log"), os.Environ(),
		d.Bin, "serve", "--config", d.Config)
	if err != nil {
		return err
	}
	if err := waitDial(ctx, d.Proc, "unix", d.Socket); err != nil {
		_ = d.Proc.Stop(10 * time.Second)
		return err
	}
	if d.Metrics != "" || d.Debug != "" {
		if err := d.readEndpoints(ctx); err != nil {
			_ = d.Proc.Stop(10 * time.Second)
			return err
		}
	}
	return nil
}

// readEndpoints sets Metrics and Debug to the addresses the running daemon
// bound them to, as it logs them once serving: a configured port 0
// (AnyLoopbackPort) becomes the port the kernel gave.
func (d *Daemon) readEndpoints(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		log, err := d.Proc.RunLog()
		if err != nil {
			return err
		}
		if eps, ok := ServedEndpoints(log); ok {
			if d.Metrics != "" {
				d.Metrics = eps["metrics"]
			}
			if d.Debug != "" {
				d.Debug = eps["debug"]
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s serves its socket but logged no \"serving snapshots API\" line: %w; log %s", d.Proc.Name, ctx.Err(), d.Proc.LogPath)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop ends the daemon with SIGTERM (the pool and its devices survive).
func (d *Daemon) Stop() error {
	if d.Proc == nil {
		return nil
	}
	return d.Proc.Stop(60 * time.Second)
}

// CLI runs one operator subcommand with the daemon's config inserted
// after the subcommand's words: CLI(ctx, []string{"ls", "unpacked"},
// "--format", "json") runs `containerd-flyio-snapshotter ls unpacked
// --config FILE --format json`.
func (d *Daemon) CLI(ctx context.Context, words []string, rest ...string) (string, error) {
	argv := append([]string{d.Bin}, words...)
	argv = append(argv, "--config", d.Config)
	argv = append(argv, rest...)
	return Run(ctx, os.Environ(), argv...)
}

// Containerd is a running containerd with our daemon as proxy plugin
// "flyio".
type Containerd struct {
	Tools   string // folder of containerd, containerd-shim-runc-v2, ctr
	Root    string
	Socket  string
	Config  string
	Proc    *Proc
	env     []string
	started time.Time
}

// ToolsDir is where integration/tools/build.sh put containerd, its runc
// shim and ctr for the version pinned in integration/tools/go.mod.
func ToolsDir(repo string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repo, "integration/tools/go.mod"))
	if err != nil {
		return "", fmt.Errorf("containerd version: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "github.com/containerd/containerd/v2" {
			dir := filepath.Join(repo, ".cache/tools", "containerd-"+f[1])
			for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
				if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
					return "", fmt.Errorf("%s %s not built (run integration/tools/build.sh on the host, before the VM): %w", bin, f[1], err)
				}
			}
			return dir, nil
		}
	}
	return "", errors.New("integration/tools/go.mod does not require github.com/containerd/containerd/v2")
}

// StartContainerd writes a containerd config (version 4, CRI off, our
// daemon's socket as [proxy_plugins.flyio] and flyio in the transfer
// service's unpack_config), starts containerd and waits for its socket.
func StartContainerd(ctx context.Context, tools, dir, proxySocket string) (*Containerd, error) {
	c := &Containerd{Tools: tools, Root: dir, Socket: filepath.Join(dir, "containerd.sock"), Config: filepath.Join(dir, "config.toml")}
	var b strings.Builder
	fmt.Fprintf(&b, "version = 4\nroot = %q\nstate = %q\ntemp = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "tmp"))
	b.WriteString(`disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]` + "\n")
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.server.v1.grpc']\naddress = %q\n", c.Socket)
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.server.v1.ttrpc']\naddress = %q\n", c.Socket+".ttrpc")
	fmt.Fprintf(&b, "\n[proxy_plugins.flyio]\ntype = \"snapshot\"\naddress = %q\n", proxySocket)
	// An OS-only platform, which every containerd 2.x completes with the
	// host's architecture, as in contrib/containerd/config.toml.snippet.
	b.WriteString("\n[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]\nplatform = \"linux\"\nsnapshotter = \"flyio\"\n")
	var err error
	if c.Proc, c.env, err = RunContainerd(ctx, tools, dir, b.String(), c.Socket, "info"); err != nil {
		return nil, err
	}
	c.started = time.Now()
	return c, nil
}

// RunContainerd writes config (the text of a containerd config.toml) to
// dir/config.toml, starts the containerd of tools (ToolsDir) on it at
// logLevel, logging to dir/containerd.log, and waits until it listens on
// socket (the config's grpc address). It returns the process and the
// environment it runs in, which ctr wants too: the caller's, with tools
// first on PATH for the runc shim (runc is Debian's, in /usr/sbin).
func RunContainerd(ctx context.Context, tools, dir, config, socket, logLevel string) (*Proc, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("containerd folder: %w", err)
	}
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return nil, nil, fmt.Errorf("containerd config: %w", err)
	}
	env := append(os.Environ(), "PATH="+tools+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	p, err := StartServing(ctx, "containerd", filepath.Join(dir, "containerd.log"), env, "unix", socket,
		filepath.Join(tools, "containerd"), "--config", path, "--log-level", logLevel)
	if err != nil {
		return nil, nil, err
	}
	return p, env, nil
}

// Ctr runs `ctr --address SOCKET --namespace flyio-e2e ARGS...` and returns
// its combined output.
func (c *Containerd) Ctr(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{filepath.Join(c.Tools, "ctr"), "--address", c.Socket, "--namespace", Namespace}, args...)
	return Run(ctx, c.env, argv...)
}

// Stop ends containerd with SIGTERM.
func (c *Containerd) Stop() error { return c.Proc.Stop(30 * time.Second) }
