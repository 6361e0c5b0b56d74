package metrics

import (
	"context"
	"time"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// timed is the latency decorator Wrap returns; each method forwards to next
// and records its duration and outcome under the method's name.
type timed struct {
	next snapshots.Snapshotter
	m    *Metrics
}

var _ snapshots.Snapshotter = (*timed)(nil)

func (t *timed) Stat(ctx context.Context, key string) (_ snapshots.Info, err error) {
	defer func(start time.Time) { t.m.observe("Stat", start, err) }(time.Now())
	return t.next.Stat(ctx, key)
}

func (t *timed) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (_ snapshots.Info, err error) {
	defer func(start time.Time) { t.m.observe("Update", start, err) }(time.Now())
	return t.next.Update(ctx, info, fieldpaths...)
}

func (t *timed) Usage(ctx context.Context, key string) (_ snapshots.Usage, err error) {
	defer func(start time.Time) { t.m.observe("Usage", start, err) }(time.Now())
	return t.next.Usage(ctx, key)
}

func (t *timed) Mounts(ctx context.Context, key string) (_ []mount.Mount, err error) {
	defer func(start time.Time) { t.m.observe("Mounts", start, err) }(time.Now())
	return t.next.Mounts(ctx, key)
}

func (t *timed) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) (_ []mount.Mount, err error) {
	defer func(start time.Time) { t.m.observe("Prepare", start, err) }(time.Now())
	return t.next.Prepare(ctx, key, parent, opts...)
}

func (t *timed) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) (_ []mount.Mount, err error) {
	defer func(start time.Time) { t.m.observe("View", start, err) }(time.Now())
	return t.next.View(ctx, key, parent, opts...)
}

func (t *timed) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) (err error) {
	defer func(start time.Time) { t.m.observe("Commit", start, err) }(time.Now())
	return t.next.Commit(ctx, name, key, opts...)
}

func (t *timed) Remove(ctx context.Context, key string) (err error) {
	defer func(start time.Time) { t.m.observe("Remove", start, err) }(time.Now())
	return t.next.Remove(ctx, key)
}

func (t *timed) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) (err error) {
	defer func(start time.Time) { t.m.observe("Walk", start, err) }(time.Now())
	return t.next.Walk(ctx, fn, filters...)
}

// Close closes the wrapped snapshotter; it is not timed.
func (t *timed) Close() error { return t.next.Close() }

// timedCleaner adds a timed Cleanup for snapshotters that have one.
type timedCleaner struct {
	*timed
	cleaner snapshots.Cleaner
}

var _ snapshots.Cleaner = (*timedCleaner)(nil)

func (t *timedCleaner) Cleanup(ctx context.Context) (err error) {
	defer func(start time.Time) { t.m.observe("Cleanup", start, err) }(time.Now())
	return t.cleaner.Cleanup(ctx)
}

// WrapApplier returns a with every Apply timed into the operation
// histogram as method "Apply": the layers the daemon's diff service
// applies for containerd.
func (m *Metrics) WrapApplier(a diff.Applier) diff.Applier { return &timedApplier{next: a, m: m} }

// timedApplier is the latency decorator WrapApplier returns.
type timedApplier struct {
	next diff.Applier
	m    *Metrics
}

func (t *timedApplier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (_ ocispec.Descriptor, err error) {
	defer func(start time.Time) { t.m.observe("Apply", start, err) }(time.Now())
	return t.next.Apply(ctx, desc, mounts, opts...)
}
