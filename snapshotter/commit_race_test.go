package snapshotter

import (
	"context"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

// TestCommitOntoKeyBeingPrepared: a Commit whose name is the key of a
// Prepare under way (its intent reserves the key) is refused with
// AlreadyExists, as a Prepare of a reserved key is; it must not take the
// name from under the Prepare, which would then fail on the database's
// unique constraint with an error of no containerd kind.
func TestCommitOntoKeyBeingPrepared(t *testing.T) {
	ctx := context.Background()
	s, pool := newFakeSnapshotter(t, Config{})
	if _, err := s.Prepare(ctx, "work", ""); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var cerr error
	s.hook = func(step string) error {
		if step == "create:intent" {
			once.Do(func() { cerr = s.Commit(ctx, "x", "work") })
		}
		return nil
	}
	_, perr := s.Prepare(ctx, "x", "")
	s.hook = nil
	if perr != nil {
		t.Errorf("Prepare of x, whose key a Commit took while it was being made: %v, want success", perr)
	}
	if !errdefs.IsAlreadyExists(cerr) {
		t.Errorf("Commit as x while x is being prepared: %v, want AlreadyExists", cerr)
	}
	assertSettled(t, s, pool)
}
