package main

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestResultNotWrittenFails: the commands that print a result in the table
// format do not exit 0 when that result could not be written (stdout on a
// full disk): a script redirecting stdout would take the missing answer
// for a success. ls already fails so; db check, db migrate, db backup and
// validate did not.
func TestResultNotWrittenFails(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer full.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "m.db")
	populate(t, path, time.Now())
	good := filepath.Join(dir, "good.tar")
	writeTar(t, good, &tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755})
	for _, args := range [][]string{
		{"ls", "images", "--db", path},
		{"db", "check", "--db", path},
		{"db", "migrate", "--db", path},
		{"db", "backup", "--db", path, filepath.Join(dir, "copy.db")},
		{"validate", good},
	} {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestValidateCommandHelperProcess$", "--"}, args...)...)
		cmd.Env = append(os.Environ(), "FLYIO_VALIDATE_HELPER=1")
		var errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = full, &errOut
		if err := cmd.Run(); err == nil {
			t.Errorf("%v with stdout full = exit 0, stderr %q; want a failure", args, errOut.String())
		}
	}
}
