package tarball

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestVerifyLayoutOf: the caller's list of required directories replaces
// the default one; an empty list admits a tree built FROM scratch, and a
// world-writable etc/ or usr/ is refused whether required or not.
func TestVerifyLayoutOf(t *testing.T) {
	scratch := t.TempDir()
	if err := os.MkdirAll(filepath.Join(scratch, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(scratch, "app", "server"), []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := VerifyLayoutDirOf(scratch, []string{}); err != nil {
		t.Errorf("no required directory: %v, want the scratch tree accepted", err)
	}
	var le *LayoutError
	if err := VerifyLayoutDir(scratch); !errors.As(err, &le) || le.Path != "etc" || !errors.Is(err, ErrLayoutMissing) {
		t.Errorf("default list on a scratch tree: %v, want etc missing", err)
	}
	if err := VerifyLayoutDirOf(scratch, []string{"app"}); err != nil {
		t.Errorf("required [app]: %v", err)
	}
	if err := VerifyLayoutDirOf(scratch, []string{"app", "data"}); !errors.As(err, &le) || le.Path != "data" {
		t.Errorf("required [app data]: %v, want data missing", err)
	}
	etc := filepath.Join(scratch, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(etc, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := VerifyLayoutDirOf(scratch, []string{}); !errors.As(err, &le) || le.Path != "etc" || !errors.Is(err, ErrLayoutWorldWritable) {
		t.Errorf("world-writable etc/ not required: %v, want it refused", err)
	}
}
