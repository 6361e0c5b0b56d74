package snapshotter

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool/thinpooltest"
)

// recordsOnly is a Snapshotter on a real database and an empty
// thinpooltest.FakePool, removing asynchronously: enough for every call
// that only reads or writes records (Stat, Update, Walk, Remove, Exists,
// DeviceOf, DeviceCounts, and the checks that precede device work).
// Records are seeded directly.
type recordsOnly struct {
	*Snapshotter
	t    *testing.T
	next uint32
}

func newRecordsOnly(t *testing.T) *recordsOnly {
	t.Helper()
	ctx := context.Background()
	db := metadatatest.Open(t)
	r := &recordsOnly{Snapshotter: &Snapshotter{db: db, pool: thinpooltest.NewFakePool(), cfg: Config{FSType: "ext4", BaseImageSize: DefaultBaseImageSize, AsyncRemove: true}}, t: t, next: 100}
	r.tx(func(q Records) error {
		return q.InsertThinDevice(ctx, ThinDevice{ID: 1, Name: "p-base-1", Role: ThinRoleBase,
			State: ThinStateInactive, SizeBytes: DefaultBaseImageSize, FSType: "ext4", CreatedNs: 1, UpdatedNs: 1})
	})
	return r
}

func (r *recordsOnly) tx(fn func(q Records) error) {
	r.t.Helper()
	if err := r.db.WithTx(context.Background(), func(tx *sql.Tx) error { return fn(RecordsTx(tx)) }); err != nil {
		r.t.Fatal(err)
	}
}

// seed records snapshot key of kind on parent with labels.
func (r *recordsOnly) seed(key, kind, parent string, labels map[string]string) {
	r.t.Helper()
	ctx := context.Background()
	r.next++
	id := r.next
	r.tx(func(q Records) error {
		var pid int64
		if parent != "" {
			p, ok, err := q.Snapshot(ctx, parent)
			if err != nil || !ok {
				r.t.Fatalf("seed %s: parent %s missing (%v)", key, parent, err)
			}
			pid = p.ID
		}
		state := ThinStateActive
		if kind == SnapKindCommitted {
			state = ThinStateInactive
		}
		if err := q.InsertThinDevice(ctx, ThinDevice{ID: id, Name: deviceName("p", id), OriginID: 1, Role: ThinRoleSnapshot,
			State: state, SizeBytes: DefaultBaseImageSize, FSType: "ext4", CreatedNs: 5, UpdatedNs: 5}); err != nil {
			return err
		}
		now := nowNs()
		_, err := q.InsertSnapshot(ctx, CDSnapshot{Key: key, Kind: kind, ParentID: pid, DeviceID: id,
			Labels: labels, CreatedNs: now, UpdatedNs: now})
		return err
	})
}

func TestUpdateFollowsContainerdFieldpaths(t *testing.T) {
	r := newRecordsOnly(t)
	ctx := namespaces.WithNamespace(context.Background(), "default")
	r.seed("a", SnapKindActive, "", map[string]string{"keep": "1", "l1": "v1", "l2": "v2"})
	before, err := r.Stat(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if !before.Created.Equal(before.Updated) {
		t.Fatalf("fresh snapshot: created %v != updated %v", before.Created, before.Updated)
	}

	in := before
	in.Parent = "ignored"
	in.Labels = map[string]string{"l1": "new", "l3": "v3"}
	got, err := r.Update(ctx, in, "labels.l1", "labels.l2")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"keep": "1", "l1": "new"} // l2 absent from info: deleted; l3 not named: ignored
	if !mapsEqual(got.Labels, want) {
		t.Fatalf("labels after Update(labels.l1, labels.l2) = %v, want %v", got.Labels, want)
	}
	if got.Parent != "" || !got.Created.Equal(before.Created) || got.Updated.Before(before.Updated) {
		t.Fatalf("Update changed parent or created, or moved updated back: %+v (before %+v)", got, before)
	}
	if st, _ := r.Stat(ctx, "a"); !mapsEqual(st.Labels, want) || !st.Updated.Equal(got.Updated) {
		t.Fatalf("Stat after Update = %+v, want what Update returned %+v", st, got)
	}

	in.Labels = map[string]string{"only": "this"}
	if got, err = r.Update(ctx, in); err != nil || !mapsEqual(got.Labels, in.Labels) {
		t.Fatalf("Update without fieldpaths = %v, %v; want labels replaced", got.Labels, err)
	}
	if got, err = r.Update(ctx, in, "labels"); err != nil || !mapsEqual(got.Labels, in.Labels) {
		t.Fatalf("Update(labels) = %v, %v", got.Labels, err)
	}
	if _, err := r.Update(ctx, in, "parent"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Update(parent): %v, want InvalidArgument", err)
	}
	in.Labels = map[string]string{strings.Repeat("k", 5000): "v"}
	if _, err := r.Update(ctx, in); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Update with an oversized label: %v, want InvalidArgument", err)
	}
	in.Name = "missing"
	if _, err := r.Update(ctx, in); !errdefs.IsNotFound(err) {
		t.Fatalf("Update of a missing snapshot: %v, want NotFound", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func TestWalkStatAndNamespaces(t *testing.T) {
	r := newRecordsOnly(t)
	def := namespaces.WithNamespace(context.Background(), "default")
	other := namespaces.WithNamespace(context.Background(), "other")
	r.seed("p", SnapKindCommitted, "", map[string]string{"l": "1"})
	r.seed("a", SnapKindActive, "p", nil)
	r.seed("v", SnapKindView, "p", map[string]string{"l": "2"})

	walk := func(ctx context.Context, fs ...string) []string {
		t.Helper()
		var names []string
		err := r.Walk(ctx, func(ctx context.Context, i snapshots.Info) error {
			// Walk's callback may call back into the snapshotter.
			st, err := r.Stat(ctx, i.Name)
			if err != nil {
				return err
			}
			if st.Kind != i.Kind || st.Parent != i.Parent || !st.Created.Equal(i.Created) || !mapsEqual(st.Labels, i.Labels) {
				t.Errorf("Walk gave %+v, Stat gives %+v", i, st)
			}
			names = append(names, i.Name)
			return nil
		}, fs...)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		return names
	}
	for _, tc := range []struct {
		ctx     context.Context
		filters []string
		want    []string
	}{
		{def, nil, []string{"a", "p", "v"}},
		// containerd's garbage collector walks with no namespace, and
		// another namespace's client sees the same records: containerd
		// scopes the keys it sends itself.
		{context.Background(), nil, []string{"a", "p", "v"}},
		{other, nil, []string{"a", "p", "v"}},
		{def, []string{"parent==p"}, []string{"a", "v"}},
		{def, []string{"kind==committed"}, []string{"p"}},
		{def, []string{"labels.l==2", "name==a"}, []string{"a", "v"}},
		{def, []string{"labels.l"}, []string{"p", "v"}},
	} {
		if got := walk(tc.ctx, tc.filters...); !slices.Equal(got, tc.want) {
			t.Errorf("Walk(%q) = %v, want %v", tc.filters, got, tc.want)
		}
	}
	if err := r.Walk(def, func(context.Context, snapshots.Info) error { return nil }, "kind=="); err == nil {
		t.Fatal("Walk with a malformed filter succeeded")
	}
	if info, err := r.Stat(context.Background(), "a"); err != nil || info.Parent != "p" {
		t.Fatalf("Stat without a namespace (containerd's GC) = %+v, %v", info, err)
	}
	if _, err := r.Stat(other, "missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat of a missing key: %v, want NotFound", err)
	}
	if ok, err := r.Exists(other, "p"); err != nil || !ok {
		t.Fatalf("Exists(other, p) = %v, %v", ok, err)
	}
	name, path, id, err := r.DeviceOf(def, "v")
	if err != nil || name != deviceName("p", id) || path != "/dev/mapper/"+name {
		t.Fatalf("DeviceOf(v) = %q %q %d %v", name, path, id, err)
	}
}

func TestRemoveRulesAndCounts(t *testing.T) {
	r := newRecordsOnly(t)
	ctx := namespaces.WithNamespace(context.Background(), "default")
	r.seed("p", SnapKindCommitted, "", nil)
	r.seed("a", SnapKindActive, "p", nil)
	err := r.Remove(ctx, "p")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "remove") {
		t.Fatalf("Remove of a parent: %v, want FailedPrecondition mentioning remove", err)
	}
	if err := r.Remove(ctx, "missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("Remove of a missing key: %v, want NotFound", err)
	}
	if err := r.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(ctx, "p"); err != nil {
		t.Fatalf("Remove of the parent once its child is gone: %v", err)
	}
	counts, err := r.DeviceCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if counts["removed-pending"] != 2 || counts["active"] != 0 || counts["committed"] != 0 || counts["base"] != 1 {
		t.Fatalf("DeviceCounts = %v, want 2 removed-pending and the base", counts)
	}
	// The key is free again at once, even before Cleanup.
	if ok, _ := r.Exists(ctx, "a"); ok {
		t.Fatal("removed key still exists")
	}
}

// The checks before any device work answer with containerd's error kinds.
func TestCreateAndCommitPreconditions(t *testing.T) {
	r := newRecordsOnly(t)
	ctx := namespaces.WithNamespace(context.Background(), "default")
	ref := map[string]string{snapshots.LabelSnapshotRef: "sha256:layer"}
	r.seed("sha256:layer", SnapKindCommitted, "", ref)
	r.seed("act", SnapKindActive, "", nil)
	r.seed("view", SnapKindView, "sha256:layer", nil)

	if _, err := r.Prepare(ctx, "extract-1 sha256:layer", "", snapshots.WithLabels(ref)); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Prepare of an existing ref target: %v, want AlreadyExists", err)
	}
	if _, err := r.Prepare(ctx, "act", ""); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Prepare of an existing key: %v, want AlreadyExists", err)
	}
	if _, err := r.Prepare(ctx, "x", "missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("Prepare on a missing parent: %v, want NotFound", err)
	}
	if _, err := r.Prepare(ctx, "x", "act"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Prepare on an active parent: %v, want InvalidArgument", err)
	}
	if err := r.Commit(ctx, "c", "view"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Commit of a view: %v, want FailedPrecondition", err)
	}
	if err := r.Commit(ctx, "c", "missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("Commit of a missing key: %v, want NotFound", err)
	}
	if err := r.Commit(ctx, "sha256:layer", "act"); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Commit onto an existing name: %v, want AlreadyExists", err)
	}
	if err := r.Commit(ctx, "c", "act", snapshots.WithParent("sha256:layer")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Commit rebasing onto another parent: %v, want InvalidArgument", err)
	}
	if _, err := r.Mounts(ctx, "sha256:layer"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Mounts of a committed snapshot: %v, want FailedPrecondition", err)
	}
	if ins, _ := r.reads().Intents(context.Background()); len(ins) != 0 {
		t.Fatalf("refused calls left intents: %+v", ins)
	}
}
