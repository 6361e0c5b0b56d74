package pipeline

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	cdmeta "github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/image-spec/identity"
	bolt "go.etcd.io/bbolt"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// containerdOver is containerd's metadata store (its bolt file and content
// store, as the daemon keeps them) with sn as the proxy snapshotter called
// DefaultSnapshotter (none when sn is nil): what containerd's clients and
// unpacker go through, on the host, where no containerd runs.
func containerdOver(t *testing.T, sn snapshots.Snapshotter) containerdStores {
	t.Helper()
	return storesOf(containerdDB(t, sn), sn != nil)
}

// storesOf is what a registration writes to in containerd's metadata
// store db (its snapshot service of DefaultSnapshotter when withSnapshots).
func storesOf(db *cdmeta.DB, withSnapshots bool) containerdStores {
	st := containerdStores{images: cdmeta.NewImageStore(db), content: db.ContentStore()}
	if withSnapshots {
		st.snapshots = db.Snapshotter(DefaultSnapshotter)
	}
	return st
}

// containerdDB is containerd's metadata store of containerdOver itself,
// for what containerd does beside its clients' calls (its garbage
// collection).
func containerdDB(t *testing.T, sn snapshots.Snapshotter) *cdmeta.DB {
	t.Helper()
	dir := t.TempDir()
	bdb, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bdb.Close() })
	cs, err := local.NewStore(filepath.Join(dir, "content"))
	if err != nil {
		t.Fatal(err)
	}
	var sns map[string]snapshots.Snapshotter
	if sn != nil {
		sns = map[string]snapshots.Snapshotter{DefaultSnapshotter: sn}
	}
	db := cdmeta.NewDB(bdb, cs, sns)
	if err := db.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db
}

// storesRegistrar is ContainerdRegistrar on containerd's metadata store
// (containerdOver) instead of a socket: the same checkOwner, register and
// registered, in the context's namespace or "default". beforeRegister,
// when set, runs once at the start of the next Register (a test point for
// what another pull does meanwhile).
type storesRegistrar struct {
	st             containerdStores
	mu             sync.Mutex
	beforeRegister func()
	// down makes Register answer as ContainerdRegistrar does while
	// containerd's socket is absent (ErrContainerdAbsent).
	down atomic.Bool
	// nss are the namespaces Register was asked to write in, where
	// Unregister looks.
	nss map[string]bool
}

// newContainerdPullEnv is newPullEnv registering, through a
// storesRegistrar, in containerd's metadata store over the pipelines'
// ContainerdView.
func newContainerdPullEnv(t *testing.T) (*env, *storesRegistrar) {
	t.Helper()
	e := newPullEnv(t, nil)
	reg := &storesRegistrar{st: containerdOver(t, e.p.ContainerdView(e.sn))}
	e.p.opts.Registrar = reg
	return e, reg
}

func (r *storesRegistrar) ns(ctx context.Context) (context.Context, string) {
	ns, ok := namespaces.Namespace(ctx)
	if !ok || ns == "" {
		ns = "default"
	}
	return namespaces.WithNamespace(ctx, ns), ns
}

func (r *storesRegistrar) Check(ctx context.Context, ref string, replace bool) error {
	ctx, ns := r.ns(ctx)
	return checkOwner(ctx, r.st.images, ns, ref, replace)
}

func (r *storesRegistrar) Register(ctx context.Context, ref string, diffIDs []string, replace bool) error {
	r.mu.Lock()
	hook := r.beforeRegister
	r.beforeRegister = nil
	r.mu.Unlock()
	if hook != nil {
		hook()
	}
	if r.down.Load() {
		return fmt.Errorf("register %s: %w", ref, ErrContainerdAbsent)
	}
	ctx, ns := r.ns(ctx)
	r.mu.Lock()
	if r.nss == nil {
		r.nss = map[string]bool{}
	}
	r.nss[ns] = true
	r.mu.Unlock()
	if err := checkOwner(ctx, r.st.images, ns, ref, replace); err != nil {
		return err
	}
	return register(ctx, r.st, DefaultSnapshotter, ns, ref, diffIDs, replace)
}

func (r *storesRegistrar) Unregister(ctx context.Context, ref string) error {
	r.mu.Lock()
	nss := slices.Sorted(maps.Keys(r.nss))
	r.mu.Unlock()
	return unregister(ctx, r.st.images, nss, ref)
}

func (r *storesRegistrar) Namespaces(ctx context.Context, ref string) ([]string, error) {
	if r.down.Load() {
		return nil, nil // as ContainerdRegistrar without containerd's socket
	}
	r.mu.Lock()
	nss := slices.Sorted(maps.Keys(r.nss))
	r.mu.Unlock()
	return ourNamespaces(ctx, r.st.images, nss, ref)
}

func (r *storesRegistrar) Registered(ctx context.Context, ref string, diffIDs []string) (bool, error) {
	if r.down.Load() {
		return true, nil // as ContainerdRegistrar: nothing to register in
	}
	ctx, ns := r.ns(ctx)
	return registered(ctx, r.st, ns, ref, diffIDs)
}

// topOf is the top chain of the image containerd has as ref in namespace
// "default", read from its config's rootfs as `ctr run` unpacks it.
func (r *storesRegistrar) topOf(t *testing.T, ref string) string {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "default")
	img, err := r.st.images.Get(ctx, ref)
	if err != nil {
		t.Fatalf("containerd image %s: %v", ref, err)
	}
	diffs, err := img.RootFS(ctx, r.st.content, platforms.Default())
	if err != nil {
		t.Fatalf("rootfs of containerd image %s: %v", ref, err)
	}
	chain := identity.ChainIDs(slices.Clone(diffs))
	return chain[len(chain)-1].String()
}

// containerdUnpack does, through st's snapshot service in ns, what
// containerd's unpacker does for a layer: Prepare an extraction key with the
// chain's snapshot.ref label (AlreadyExists: the chain is there, nothing is
// made), write the layer's files (files: path → content), Commit it as the
// chain ID with the same labels. It returns whether it unpacked.
func containerdUnpack(t *testing.T, sn *faultSnapshots, st containerdStores, ns, parent, diffID string, files map[string]string) bool {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), ns)
	chain := ChainID(parent, diffID)
	lbls := map[string]string{snapshots.LabelSnapshotRef: chain, snapshots.LabelSnapshotDiffID: diffID}
	key := "extract-1 " + chain
	_, err := st.snapshots.Prepare(ctx, key, parent, snapshots.WithLabels(lbls))
	if errdefs.IsAlreadyExists(err) {
		if _, err := st.snapshots.Stat(ctx, chain); err != nil {
			t.Fatalf("containerd in %s: prepare of %s said AlreadyExists, then stat: %v", ns, chain, err)
		}
		return false
	}
	if err != nil {
		t.Fatalf("containerd in %s: prepare %s: %v", ns, chain, err)
	}
	backend := ""
	for k := range sn.list(t) {
		if strings.HasSuffix(k, "/"+key) {
			backend = k
		}
	}
	for p, data := range files {
		sn.writeFile(t, backend, p, data)
	}
	if err := st.snapshots.Commit(ctx, chain, key, snapshots.WithLabels(lbls)); err != nil {
		t.Fatalf("containerd in %s: commit %s: %v", ns, chain, err)
	}
	return true
}

// backendKeyOf is the key our snapshotter has for chain, which containerd
// knows in ns.
func backendKeyOf(t *testing.T, sn *faultSnapshots, ns, chain string) string {
	t.Helper()
	for k, r := range sn.list(t) {
		if r.Kind == snapshotter.SnapKindCommitted && (k == chain || strings.HasPrefix(k, ns+"/") && strings.HasSuffix(k, "/"+chain)) {
			return k
		}
	}
	t.Fatalf("no committed snapshot of chain %s", chain)
	return ""
}

// TestRegisterAllOrNothing, on containerd's metadata store over the
// snapshotter: an image one of whose chains is not committed in the pool is
// refused naming the chain, and leaves no image record (nor an active
// snapshot in containerd);
// an image of that name already there keeps its target. With every chain
// committed the image is named and containerd knows its top chain.
func TestRegisterAllOrNothing(t *testing.T) {
	e := newPullEnv(t, newFakeRegistrar())
	base, top := layerTar(t, "base", 1000), layerTar(t, "top", 1000)
	e.srv.Put(t, "a/1.tar", base)
	e.srv.Put(t, "a/2.tar", top)
	e.mustPull("a/", "whole")
	st := containerdOver(t, e.p.ContainerdView(e.sn))
	ctx := namespaces.WithNamespace(context.Background(), "default")

	missing := sha([]byte("a layer never unpacked"))
	err := register(ctx, st, DefaultSnapshotter, "default", "s3.local/b/bad:1", []string{sha(base), missing}, false)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), ChainID(sha(base), missing)) {
		t.Fatalf("register with an uncommitted chain: %v; want FailedPrecondition naming the chain", err)
	}
	if img, err := st.images.Get(ctx, "s3.local/b/bad:1"); !errdefs.IsNotFound(err) {
		t.Errorf("after a failed registration containerd has image %+v (%v); want no image", img, err)
	}
	// A Prepare the adoption made is removed from containerd's records (its
	// garbage collector then removes it from the pool).
	if err := st.snapshots.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Kind != snapshots.KindCommitted {
			t.Errorf("a failed registration left snapshot %s (%v) in containerd", i.Name, i.Kind)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	if err := register(ctx, st, DefaultSnapshotter, "default", "s3.local/b/app:1", []string{sha(base), sha(top)}, false); err != nil {
		t.Fatalf("register with every chain committed: %v", err)
	}
	good, err := st.images.Get(ctx, "s3.local/b/app:1")
	if err != nil {
		t.Fatalf("registered image: %v", err)
	}
	if _, err := st.snapshots.Stat(ctx, ChainID(sha(base), sha(top))); err != nil {
		t.Errorf("containerd does not know the registered image's top chain: %v", err)
	}
	// Repointing the name at an image that cannot be adopted leaves it be.
	err = register(ctx, st, DefaultSnapshotter, "default", "s3.local/b/app:1", []string{missing}, true)
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("repoint at an uncommitted chain: %v; want FailedPrecondition", err)
	}
	if img, err := st.images.Get(ctx, "s3.local/b/app:1"); err != nil || img.Target.Digest != good.Target.Digest {
		t.Errorf("after a failed repoint the image is %+v (%v); want it on %s still", img.Target, err, good.Target.Digest)
	}
}

// TestPullUsesChainContainerdUnpacked: a base layer containerd's unpacker
// committed in the pool (a registry image, namespace "default": our
// snapshotter sees it as "default/<n>/<chain>") is not extracted again by
// an S3 pull of an image on that base; the pull's own layer is built on
// containerd's snapshot and shows its files, and the image registers in
// that namespace and in another. Then containerd's unpacker, in a third
// namespace, finds both chains in the pool and unpacks nothing.
func TestPullUsesChainContainerdUnpacked(t *testing.T) {
	e := newPullEnv(t, newFakeRegistrar())
	base, top := layerTar(t, "base", 1000), layerTar(t, "top", 1000)
	e.srv.Put(t, "a/1.tar", base)
	e.srv.Put(t, "a/2.tar", top)
	st := containerdOver(t, e.p.ContainerdView(e.sn))
	if !containerdUnpack(t, e.sn, st, "default", "", sha(base), map[string]string{"registry.txt": "from the registry"}) {
		t.Fatal("containerd did not unpack the base")
	}
	cdBase := backendKeyOf(t, e.sn, "default", sha(base))

	res := e.mustPull("a/", "whole")
	if res.Unpacked != 1 {
		t.Errorf("pull unpacked %d layers; want 1 (the base is in the pool as %s)", res.Unpacked, cdBase)
	}
	topChain := ChainID(sha(base), sha(top))
	if chains := e.committedChains(); len(chains) != 1 || chains[0] != topChain {
		t.Errorf("chains the pull committed: %v; want only %s", chains, topChain)
	}
	if p := e.sn.list(t)[topChain].ParentKey; p != cdBase {
		t.Errorf("the pull's top chain is on %q; want containerd's %q", p, cdBase)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "registry.txt"); got != "from the registry" {
		t.Errorf("the image shows etc/registry %q", got)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "top" {
		t.Errorf("the image shows etc/marker %q", got)
	}

	// The records of the chain and of the image stay: containerd's
	// snapshot is the chain's.
	if _, err := e.p.Prune(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c, err := RecordsOf(e.db).GetChain(context.Background(), sha(base)); err != nil || c == nil {
		t.Errorf("after a prune the base chain's record is %v (%v); want it kept", c, err)
	}
	if again := e.mustPull("a/", "whole"); again.Unpacked != 0 || again.Downloaded != 0 {
		t.Errorf("re-pull after a prune: downloaded %d, unpacked %d; want nothing", again.Downloaded, again.Unpacked)
	}

	for _, ns := range []string{"default", "other"} {
		ctx := namespaces.WithNamespace(context.Background(), ns)
		if err := register(ctx, st, DefaultSnapshotter, ns, "s3.local/b/whole", []string{sha(base), sha(top)}, false); err != nil {
			t.Fatalf("register in %s: %v", ns, err)
		}
		if _, err := st.images.Get(ctx, "s3.local/b/whole"); err != nil {
			t.Errorf("image in %s: %v", ns, err)
		}
	}

	n := len(e.sn.list(t))
	if containerdUnpack(t, e.sn, st, "k8s.io", "", sha(base), nil) ||
		containerdUnpack(t, e.sn, st, "k8s.io", sha(base), sha(top), nil) {
		t.Error("containerd's unpacker in another namespace unpacked a chain that is in the pool")
	}
	if m := len(e.sn.list(t)); m != n {
		t.Errorf("containerd's unpack of chains in the pool made %d snapshots", m-n)
	}
}

// TestPullKeepsTheRegistryChainItBuildsOn, on containerd's metadata store:
// an S3 pull whose base layer containerd's unpacker made for a registry
// image builds on containerd's snapshot of that chain. containerd's
// collector, run once the registry image is gone while the pull's top
// layer waits to be extracted on that snapshot, is refused its removal,
// as it is for a chain the pipelines committed: the pull holds the chain
// until it ends. The pull then succeeds on containerd's snapshot.
func TestPullKeepsTheRegistryChainItBuildsOn(t *testing.T) {
	e := newPullEnv(t, newFakeRegistrar())
	base, top := layerTar(t, "base", 1000), layerTar(t, "top", 1000)
	e.srv.Put(t, "r/1.tar", base)
	e.srv.Put(t, "r/2.tar", top)
	cdb := containerdDB(t, e.p.ContainerdView(e.sn))
	st := storesOf(cdb, true)
	if !containerdUnpack(t, e.sn, st, "default", "", sha(base), nil) {
		t.Fatal("containerd did not unpack the base")
	}
	cdBase := backendKeyOf(t, e.sn, "default", sha(base))
	ctx := namespaces.WithNamespace(context.Background(), "default")
	var once sync.Once
	e.p.hooks = map[string]func(){"create-device:started": func() {
		once.Do(func() {
			// The registry image is removed: containerd forgets its
			// chain, and its collector removes what it no longer knows.
			if err := st.snapshots.Remove(ctx, sha(base)); err != nil {
				t.Errorf("containerd's removal of the registry chain: %v", err)
			}
			if _, err := cdb.GarbageCollect(ctx); err != nil {
				t.Errorf("containerd's collection: %v", err)
			}
		})
	}}
	res, err := e.pull("r/", "r")
	if err != nil {
		t.Fatalf("pull built on containerd's snapshot of its base, collected meanwhile: %v", err)
	}
	if _, err := e.sn.Stat(context.Background(), cdBase); err != nil {
		t.Errorf("containerd's snapshot %s of the base chain the pull built on: %v", cdBase, err)
	}
	if p := e.sn.list(t)[res.TopChainID].ParentKey; p != cdBase {
		t.Errorf("the pull's top chain is on %q; want containerd's %q", p, cdBase)
	}
}

// TestRepullWithoutTarballsOnARegistryChain: an image whose base chain is
// containerd's snapshot (a registry image's layer), pulled, then pulled
// with --refresh once its tarballs left the download cache, downloads
// nothing: its layers are unpacked as recorded, whether the pipelines or
// containerd's unpacker committed their chains.
func TestRepullWithoutTarballsOnARegistryChain(t *testing.T) {
	e := newPullEnv(t, newFakeRegistrar())
	base, top := layerTar(t, "base", 1000), layerTar(t, "top", 1000)
	e.srv.Put(t, "w/1.tar", base)
	e.srv.Put(t, "w/2.tar", top)
	st := containerdOver(t, e.p.ContainerdView(e.sn))
	if !containerdUnpack(t, e.sn, st, "default", "", sha(base), nil) {
		t.Fatal("containerd did not unpack the base")
	}
	first := e.mustPull("w/", "w")
	files, err := RecordsOf(e.db).ListLayerFiles(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.Remove(f.Path); err != nil {
			t.Fatal(err)
		}
	}
	res, err := e.p.Pull(context.Background(), api.PullRequest{Bucket: e.srv.Bucket, Key: "w/", Ref: "w", Refresh: true}, nil)
	if err != nil {
		t.Fatalf("refresh pull without the tarballs: %v", err)
	}
	if res.Downloaded != 0 || res.TopChainID != first.TopChainID {
		t.Errorf("refresh pull: %d layers downloaded, top chain %s; want 0 and %s", res.Downloaded, res.TopChainID, first.TopChainID)
	}
	if get := e.srv.Requests("GET", "w/1.tar") + e.srv.Requests("GET", "w/2.tar"); get != 2 {
		t.Errorf("the pulls fetched the layers %d times, want 2 (the first pull's)", get)
	}
}

// TestRepullAnsweredFromTheRecordsOnRegistryChains: an image whose chains
// are containerd's snapshots (a registry image's layers: here its base,
// and, for an image of that one layer, its top, on which its activation
// sits) is answered from the records when pulled again unchanged, as any
// image: no run, no snapshotter call.
func TestRepullAnsweredFromTheRecordsOnRegistryChains(t *testing.T) {
	e := newPullEnv(t, newFakeRegistrar())
	base, top := layerTar(t, "base", 1000), layerTar(t, "top", 1000)
	e.srv.Put(t, "v/1.tar", base)
	e.srv.Put(t, "v/2.tar", top)
	e.srv.Put(t, "b/1.tar", base)
	st := containerdOver(t, e.p.ContainerdView(e.sn))
	layout := map[string]string{"etc/marker": "base", "usr/pad.bin": "", "var/.keep": ""}
	if !containerdUnpack(t, e.sn, st, "default", "", sha(base), layout) {
		t.Fatal("containerd did not unpack the base")
	}
	for _, prefix := range []string{"v/", "b/"} {
		first := e.mustPull(prefix, "")
		checkNoWork := e.checkNoWorkSince("re-pull of " + prefix)
		res := e.mustPull(prefix, "")
		if res.TopChainID != first.TopChainID || res.Snapshot.DevicePath != first.Snapshot.DevicePath {
			t.Errorf("re-pull of %s: %+v; first pull %+v", prefix, res, first)
		}
		checkNoWork()
	}
}
