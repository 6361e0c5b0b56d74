package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
