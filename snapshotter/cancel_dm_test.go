//go:build dm

package snapshotter

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

// TestCancelAtEveryStepDM is TestCancelAtEveryStep on a real pool: a
// caller's cancellation at each step of the base's creation, Prepare,
// Commit and Remove leaves no intent, pool and records agreeing, and the
// parent removable.
func TestCancelAtEveryStepDM(t *testing.T) {
	e := newTestEnv(t, "cx")
	bg := nsCtx("default")
	s := e.newSnapshotter(t, Config{})
	cancelled := func(step string, call func(ctx context.Context) error) error {
		t.Helper()
		err := callCancelledAt(t, bg, s, step, call)
		checkPoolMatchesDB(t, s)
		return err
	}
	for _, step := range []string{"base:intent", "base:formatted"} {
		if err := cancelled(step, func(ctx context.Context) error { _, err := s.Prepare(ctx, "first", ""); return err }); !errors.Is(err, context.Canceled) {
			t.Fatalf("Prepare cancelled at %s: got %v, want context.Canceled", step, err)
		}
	}
	m, err := s.Prepare(bg, "parent-work", "")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, m, "f", "parent")
	if err := s.Commit(bg, "parent", "parent-work"); err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"create:intent", "create:device", "create:activated"} {
		if err := cancelled(step, func(ctx context.Context) error { _, err := s.Prepare(ctx, "child", "parent"); return err }); !errors.Is(err, context.Canceled) {
			t.Fatalf("Prepare cancelled at %s: got %v, want context.Canceled", step, err)
		}
		if _, err := s.Stat(bg, "child"); !errdefs.IsNotFound(err) {
			t.Fatalf("after a Prepare cancelled at %s, Stat: got %v, want NotFound", step, err)
		}
	}
	if _, err := s.Prepare(bg, "work", "parent"); err != nil {
		t.Fatal(err)
	}
	if err := cancelled("commit:deactivated", func(ctx context.Context) error { return s.Commit(ctx, "done", "work") }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Commit cancelled: got %v, want context.Canceled", err)
	}
	name, _, _, err := s.DeviceOf(bg, "work")
	if err != nil {
		t.Fatal(err)
	}
	if active, err := e.pool.IsActive(context.Background(), name); err != nil || !active {
		t.Fatalf("device %s of the active snapshot left unmapped after a cancelled commit: %v %v", name, active, err)
	}
	if err := s.Commit(bg, "done", "work"); err != nil {
		t.Fatal(err)
	}
	if err := cancelled("remove:marked", func(ctx context.Context) error { return s.Remove(ctx, "done") }); err != nil {
		t.Fatalf("Remove cancelled after its record: %v", err)
	}
	if _, err := s.Prepare(bg, "last", "parent"); err != nil {
		t.Fatal(err)
	}
	if err := cancelled("reclaim:deleted", func(ctx context.Context) error { return s.Remove(ctx, "last") }); err != nil {
		t.Fatalf("Remove cancelled after the deletion: %v", err)
	}
	if err := s.Remove(bg, "parent"); err != nil {
		t.Fatalf("parent not removable after the cancelled calls on it: %v", err)
	}
	checkPoolMatchesDB(t, s)
}
