package metrics

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/snapshots/native"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	dto "github.com/prometheus/client_model/go"
)

// The decorator is exercised over containerd's own native and overlay
// snapshotters (real implementations on plain directories); the pool and
// device collectors need a thin pool and are checked by the dm tests.

// counts gathers the operation histogram as "method/outcome" -> count.
func counts(t *testing.T, m *Metrics) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, mf := range gatherFamilies(t, m) {
		if mf.GetName() != Namespace+"_operation_duration_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			out[label(mt, "method")+"/"+label(mt, "outcome")] = mt.GetHistogram().GetSampleCount()
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// newWrapped makes a snapshotter with newInner in a fresh directory and
// wraps it in the decorator of a new Metrics, returning both; the wrapped
// snapshotter is closed when the test ends.
func newWrapped(t *testing.T, newInner func(root string) (snapshots.Snapshotter, error)) (*Metrics, snapshots.Snapshotter) {
	t.Helper()
	inner, err := newInner(filepath.Join(t.TempDir(), "inner"))
	if err != nil {
		t.Fatal(err)
	}
	m := New()
	sn := m.Wrap(inner)
	t.Cleanup(func() { sn.Close() })
	return m, sn
}

func TestWrapTimesEveryMethodByOutcome(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	m, sn := newWrapped(t, native.NewSnapshotter)
	if _, ok := sn.(snapshots.Cleaner); ok {
		t.Error("wrapping a snapshotter without Cleanup produced a Cleaner")
	}

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := sn.Prepare(ctx, "a", "")
	must(err)
	_, err = sn.Mounts(ctx, "a")
	must(err)
	_, err = sn.Usage(ctx, "a")
	must(err)
	must(sn.Commit(ctx, "c", "a"))
	_, err = sn.View(ctx, "v", "c")
	must(err)
	_, err = sn.Update(ctx, snapshots.Info{Name: "c", Labels: map[string]string{"x": "y"}}, "labels.x")
	must(err)
	must(sn.Walk(ctx, func(context.Context, snapshots.Info) error { return nil }))
	must(sn.Remove(ctx, "v"))
	_, err = sn.Stat(ctx, "c")
	must(err)
	_, err = sn.Stat(ctx, "missing")
	if !errdefs.IsNotFound(err) {
		t.Fatalf("Stat missing: %v", err)
	}
	if _, err := sn.Prepare(ctx, "c", ""); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Prepare over a committed name: %v, want AlreadyExists", err)
	}

	got := counts(t, m)
	want := map[string]uint64{
		"Prepare/ok": 1, "Prepare/already_exists": 1, "Mounts/ok": 1, "Usage/ok": 1, "Commit/ok": 1,
		"View/ok": 1, "Update/ok": 1, "Walk/ok": 1, "Remove/ok": 1, "Stat/ok": 1, "Stat/not_found": 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("histogram counts\n got %v\nwant %v", got, want)
	}
}

func TestWrapKeepsCleaner(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	m, sn := newWrapped(t, func(root string) (snapshots.Snapshotter, error) { return overlay.NewSnapshotter(root) })
	c, ok := sn.(snapshots.Cleaner)
	if !ok {
		t.Fatal("wrapping a Cleaner lost Cleanup")
	}
	if _, err := sn.Prepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if n := counts(t, m)["Cleanup/ok"]; n != 1 {
		t.Errorf("Cleanup/ok count = %d, want 1", n)
	}
}

func TestOutcome(t *testing.T) {
	cases := map[string]error{
		"ok":                  nil,
		"not_found":           fmt.Errorf("stat x: %w", errdefs.ErrNotFound),
		"already_exists":      errdefs.ErrAlreadyExists,
		"failed_precondition": errdefs.ErrFailedPrecondition,
		"invalid_argument":    errdefs.ErrInvalidArgument,
		"canceled":            fmt.Errorf("op: %w", context.Canceled),
		"deadline_exceeded":   fmt.Errorf("op: %w", context.DeadlineExceeded),
		"resource_exhausted":  fmt.Errorf("prepare: pool below its reserve: %w", errdefs.ErrResourceExhausted),
		"error":               errors.New("disk on fire"),
	}
	for want, err := range cases {
		if got := outcome(err); got != want {
			t.Errorf("outcome(%v) = %s, want %s", err, got, want)
		}
	}
}

// applyFunc is a fake diff.Applier answering with its function: what
// WrapApplier times is the decorator's own logic.
type applyFunc func() error

func (f applyFunc) Apply(context.Context, ocispec.Descriptor, []mount.Mount, ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	return ocispec.Descriptor{}, f()
}

func TestWrapApplierTimesApplyByOutcome(t *testing.T) {
	m := New()
	ctx := context.Background()
	for _, err := range []error{nil, nil, fmt.Errorf("layer refused: %w", errdefs.ErrInvalidArgument), errors.New("read failed")} {
		if _, got := m.WrapApplier(applyFunc(func() error { return err })).Apply(ctx, ocispec.Descriptor{}, nil); got != err {
			t.Fatalf("Apply returned %v, want the wrapped applier's %v", got, err)
		}
	}
	got := counts(t, m)
	want := map[string]uint64{"Apply/ok": 2, "Apply/invalid_argument": 1, "Apply/error": 1}
	if !maps.Equal(got, want) {
		t.Errorf("operation counts = %v, want %v", got, want)
	}
}
