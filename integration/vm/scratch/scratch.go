// Package scratch gives the device-mapper tests their working folder: the
// tmpfs that integration/vm/run.sh mounts in the guest and names in
// $VM_SCRATCH, so that loop files and mounts never sit on the 9p share of
// the repository. Outside the harness a test asking for it fails: tests
// that need device-mapper are never skipped.
package scratch

import (
	"errors"
	"os"
	"testing"
)

// Env is the environment variable the harness sets to the scratch folder.
const Env = "VM_SCRATCH"

// Root returns the harness's scratch folder, or an error saying how to run
// the tests when it is not set.
func Root() (string, error) {
	root := os.Getenv(Env)
	if root == "" {
		return "", errors.New(Env + " is not set: run the dm tests through integration/vm/run.sh or suite.sh")
	}
	return root, nil
}

// Dir returns a fresh folder under the scratch folder, its name starting
// with prefix, removed with its contents when t ends (after the cleanups t
// registers later, such as a pool's teardown). It fails t outside the
// harness.
func Dir(t testing.TB, prefix string) string {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, prefix)
	if err != nil {
		t.Fatalf("scratch folder under %s: %v", root, err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
