//go:build dm

package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// notifySocket listens like systemd's $NOTIFY_SOCKET and delivers each
// datagram's text.
func notifySocket(t *testing.T) (path string, msgs <-chan string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := make(chan string, 16)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			ch <- string(buf[:n])
		}
	}()
	return path, ch
}

func waitMsg(t *testing.T, msgs <-chan string, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case m := <-msgs:
			if strings.Contains(m, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no %q from the daemon on $NOTIFY_SOCKET within %s", want, within)
		}
	}
}

// TestServeCommand runs `serve --config FILE` as a process (this test
// binary re-executed as the command), the way systemd does: it reports
// READY=1 on $NOTIFY_SOCKET once the socket answers containerd's proxy
// client, `pool status` and `pool ls --check` see its pool while it runs,
// and SIGTERM makes it report STOPPING=1, close the database and exit 0.
func TestServeCommand(t *testing.T) {
	cfg := dmtest.Config(t)
	cfgPath := dmtest.WriteConfig(t, cfg)
	notify, msgs := notifySocket(t)

	serve := startCommand(t, []string{"NOTIFY_SOCKET=" + notify}, "serve", "--config", cfgPath, "--log-level", "debug")
	cmd, exited, stderr := serve.cmd, serve.exited, serve.stderr
	defer func() {
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", stderr.String())
		}
	}()
	waitMsg(t, msgs, "READY=1", 3*time.Minute)

	client := dmtest.DialProxy(t, cfg.Daemon.Socket)
	ctx := namespaces.WithNamespace(context.Background(), "default")
	if _, err := client.Prepare(ctx, "k", ""); err != nil {
		t.Fatalf("Prepare over the daemon's socket: %v", err)
	}
	if err := client.Commit(ctx, "c", "k"); err != nil {
		t.Fatalf("Commit: %v", err)
	}

	code, out, errOut := runCommand(t, nil, "pool", "status", "--config", cfgPath, "--format", "json")
	var st poolStatusView
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("pool status = %d, %q, %q", code, out, errOut)
	}
	if st.Pool != cfg.Pool.Name || st.Mode != "rw" || st.DataTotalBytes != uint64(cfg.Pool.DataSize) || st.DataUsedBytes == 0 || st.BlockSizeBytes != uint64(cfg.Pool.BlockSize) {
		t.Errorf("pool status = %+v; want pool %s, rw, %d bytes of data, some used, block %d", st, cfg.Pool.Name, cfg.Pool.DataSize, cfg.Pool.BlockSize)
	}
	checkPoolLs(t, cfgPath, 2) // the base device and the committed snapshot

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitMsg(t, msgs, "STOPPING=1", time.Minute)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("daemon exit after SIGTERM: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("daemon still running 2 minutes after SIGTERM")
	}
	if !strings.Contains(stderr.String(), "database closed") {
		t.Errorf("daemon did not log closing its database:\n%s", stderr.String())
	}
	if _, err := os.Lstat(cfg.Daemon.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left after exit: %v", err)
	}
	// The pool outlives the daemon and still matches the database.
	checkPoolLs(t, cfgPath, 2)
}

// checkPoolLs runs `pool ls --check --format json` and wants exit 0 with
// devices rows, all in the pool and recorded in the database.
func checkPoolLs(t *testing.T, cfgPath string, devices int) {
	t.Helper()
	code, out, errOut := runCommand(t, nil, "pool", "ls", "--config", cfgPath, "--check", "--format", "json")
	var rows []thinRow
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil {
		t.Fatalf("pool ls --check = %d, %q, %q", code, out, errOut)
	}
	if len(rows) != devices {
		t.Fatalf("pool ls rows = %+v, want %d", rows, devices)
	}
	for _, r := range rows {
		if !r.InPool || r.State == "" || r.Problem != "" {
			t.Errorf("pool ls row %+v: want a device in the pool with a database record and no problem", r)
		}
	}
}

// TestPoolLsFindsUnknownDevice makes a thin device behind the database's
// back and wants `pool ls --check` to report it and exit 1.
func TestPoolLsFindsUnknownDevice(t *testing.T) {
	cfg := dmtest.Config(t)
	cfgPath := dmtest.WriteConfig(t, cfg)
	code, _, errOut := runCommand(t, nil, "db", "migrate", "--config", cfgPath)
	if code != 0 {
		t.Fatalf("db migrate = %d, %s", code, errOut)
	}
	// Create the pool (as the daemon would) and a stray thin device.
	ctx := context.Background()
	p, err := thinpool.Open(ctx, cfg.ThinpoolConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CreateThin(ctx, 4242); err != nil {
		t.Fatal(err)
	}
	p.Close()
	code, out, errOut := runCommand(t, nil, "pool", "ls", "--config", cfgPath, "--check")
	if code != 1 || !strings.Contains(errOut, "thin id 4242: in the pool but not in the database") {
		t.Fatalf("pool ls --check = %d, %q, %q; want 1 naming thin id 4242", code, out, errOut)
	}
	if !strings.Contains(out, "4242") {
		t.Errorf("table does not list thin id 4242:\n%s", out)
	}
}

// TestServeStoppedWhileStartingFetcherExitsZero: a SIGTERM that reaches
// serve once its service is open but before the S3 pipelines have resumed
// the runs a previous process left (systemctl stop, or a restart, right
// after a start) stops it with status 0, as systemd expects of a stop it
// asked for: the daemon says it stopped while starting, and leaves
// neither socket behind.
func TestServeStoppedWhileStartingFetcherExitsZero(t *testing.T) {
	if stderr := serveStoppedAt(t, "start-fetcher:begin"); !strings.Contains(stderr, "stopped while starting") {
		t.Errorf("serve did not say it stopped while starting:\n%s", stderr)
	}
}

// TestServeStoppedOnceRunsResumedExitsZero: the same stop, reaching serve
// once the pipelines have resumed the runs left (the pruning of removed
// snapshots and the rest of the start then meet a canceled context),
// stops it with status 0 too.
func TestServeStoppedOnceRunsResumedExitsZero(t *testing.T) {
	serveStoppedAt(t, "start-fetcher:resumed")
}

// serveStoppedAt runs serve held at point of its start-up (the test
// binary's plugin.FaultHoldStartEnv) until it is sent SIGTERM, and wants it
// to exit 0 leaving neither socket behind. It returns serve's stderr.
func serveStoppedAt(t *testing.T, point string) string {
	t.Helper()
	cfg := dmtest.Config(t)
	cfg.Daemon.ControlSocket = filepath.Join(cfg.Daemon.RootDir, "run", "control.sock")
	cfgPath := dmtest.WriteConfig(t, cfg)
	serve := startCommand(t, []string{plugin.FaultHoldStartEnv + "=" + point}, "serve", "--config", cfgPath)
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(serve.stderr.String(), "start-up held here") {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not reach %s in 3 minutes:\n%s", point, serve.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := serve.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-serve.exited:
		if err != nil {
			t.Errorf("serve stopped at %s exited with %v, want status 0\n%s", point, err, serve.stderr)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("serve still runs 2 minutes after a SIGTERM it got at %s:\n%s", point, serve.stderr)
	}
	for _, sock := range []string{cfg.Daemon.Socket, cfg.Daemon.ControlSocket} {
		if _, err := os.Lstat(sock); !os.IsNotExist(err) {
			t.Errorf("socket %s exists after serve stopped at %s: %v", sock, point, err)
		}
	}
	return serve.stderr.String()
}
