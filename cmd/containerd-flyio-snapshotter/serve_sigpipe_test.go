package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// TestServeOutlivesItsStderrReader: a daemon whose stderr has lost its
// reader (a log pipe whose reader died, a journal stream cut) goes on
// without the lines it cannot write, as containerd does, instead of being
// killed by SIGPIPE at its next log line. Here serve logs that it starts,
// then fails to open its database and exits with status 1 on its own.
func TestServeOutlivesItsStderrReader(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _ := tempConfig(t, "[metadata]\npath = \""+filepath.Join(notDir, "metadata.db")+"\"\n")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestValidateCommandHelperProcess$", "--", "serve", "--config", cfg)
	cmd.Env = append(os.Environ(), "FLYIO_VALIDATE_HELPER=1")
	cmd.Stderr = w
	err = cmd.Run()
	w.Close()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("serve on a database it cannot open: %v; want exit status 1", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("serve with its stderr's reader gone was killed by %v; want it to go on and exit on its own", ws.Signal())
	}
	if code := ee.ExitCode(); code != 1 {
		t.Fatalf("serve on a database it cannot open, its stderr's reader gone: exit status %d, want 1", code)
	}
}
