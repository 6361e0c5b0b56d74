package main

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
)

// TestServeStopAskedDuringStartIsKept: a SIGTERM that reaches serve
// while it reads its configuration (systemctl stop right after start; a
// config file on a slow filesystem) stops it. The configuration here is a
// FIFO, so the test holds serve inside that read while it signals. A serve
// that forgot the signal would execute itself again (to turn transparent
// huge pages off) and start over: it opens the FIFO a second time and
// waits there, or, with a readable config, runs as a daemon that systemd
// has asked to stop.
func TestServeStopAskedDuringStartIsKept(t *testing.T) {
	status, _ := os.ReadFile("/proc/self/status")
	if m := regexp.MustCompile(`(?m)^THP_enabled:\s*(\d+)$`).FindSubmatch(status); m != nil && string(m[1]) == "0" {
		t.Skip("transparent huge pages are already off for this process: serve would not execute itself again")
	}
	cfg, _ := tempConfig(t, "")
	body, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "config.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	serve := startCommand(t, nil, "serve", "--config", fifo)
	cmd, exited, errOut := serve.cmd, serve.exited, serve.stderr
	// Wait until serve is blocked opening the FIFO.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if strings.Contains(procState(cmd.Process.Pid), "partner") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(body)
	w.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("serve stopped before starting exited with %v, want status 0\n%s", err, errOut.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("serve still runs 5s after the SIGTERM it got while reading its configuration: it started over (%s; stderr so far:\n%s)", procState(cmd.Process.Pid), errOut.String())
	}
}

// procState is what /proc says of pid: where it waits, and whether
// transparent huge pages are off (the image serve executed).
func procState(pid int) string {
	var waits []string
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/wchan")
	for _, task := range tasks {
		if w, _ := os.ReadFile(task); len(w) > 0 && string(w) != "0" {
			waits = append(waits, string(w))
		}
	}
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	thp := "?"
	if m := regexp.MustCompile(`(?m)^THP_enabled:\s*(\d+)$`).FindSubmatch(status); m != nil {
		thp = string(m[1])
	}
	return "threads wait in " + strings.Join(waits, " ") + ", THP_enabled " + thp
}

// TestServeStoppedWhileOpeningExitsZero: a SIGTERM that reaches serve
// while it opens its service (here its database, held locked by another
// connection so that opening waits) stops it with status 0, as systemd
// expects of a stop it asked for, and says so; nothing is left listening.
func TestServeStoppedWhileOpeningExitsZero(t *testing.T) {
	cfg, root := tempConfig(t, "")
	if code, _, errOut := runCommand(t, nil, "db", "migrate", "--create", "--config", cfg); code != 0 {
		t.Fatalf("db migrate = %d, %s", code, errOut)
	}
	holder, err := sql.Open("sqlite3", filepath.Join(root, "metadata.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	ctx := context.Background()
	conn, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	serve := startCommand(t, nil, "serve", "--config", cfg)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(serve.stderr.String(), "starting") {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not log its start in 30s:\n%s", serve.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // inside the database's open, waiting on the lock
	if err := serve.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-serve.exited:
		if err != nil {
			t.Errorf("serve stopped while opening exited with %v, want status 0\n%s", err, serve.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve still runs 30s after a SIGTERM it got while opening:\n%s", serve.stderr)
	}
	if !strings.Contains(serve.stderr.String(), "stopped while starting") {
		t.Errorf("serve did not say it stopped while starting:\n%s", serve.stderr)
	}
	if _, err := os.Lstat(filepath.Join(root, "s.sock")); !os.IsNotExist(err) {
		t.Errorf("the snapshots socket exists after serve stopped while opening: %v", err)
	}
}
