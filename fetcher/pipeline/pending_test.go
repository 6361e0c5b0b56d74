package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// TestPullWhileContainerdDownRegistersLater: a pull while containerd's
// socket is absent (the daemon starts before containerd at boot;
// containerd restarts) gives a usable image whose result says it is not
// registered. containerd's garbage collector, which removes every backend
// snapshot it does not know, then leaves the image's chain and activation
// alone; once containerd answers, RegisterPending registers the name, and
// the next pull reports it registered.
func TestPullWhileContainerdDownRegistersLater(t *testing.T) {
	bg := context.Background()
	e := newPullEnv(t, nil)
	cdb := containerdDB(t, e.p.ContainerdView(e.sn))
	reg := &storesRegistrar{st: storesOf(cdb, true)}
	e.p.opts.Registrar = reg
	reg.down.Store(true)
	e.srv.Put(t, "app/1.tar", layerTar(t, "app", 100))
	res := e.mustPull("app/", "app:v1")
	if res.Snapshot.Registered || !res.Snapshot.RegisterPending {
		t.Errorf("pull while containerd is down: registered %v, register pending %v; want not registered, pending", res.Snapshot.Registered, res.Snapshot.RegisterPending)
	}
	top := res.TopChainID
	_, imageID := imageSource(e.srv.Bucket, "app/")
	if n, err := e.p.RegisterPending(bg); err != nil || n != 1 {
		t.Errorf("RegisterPending while containerd is down: %d left, %v; want the name left pending", n, err)
	}

	// containerd deletes a container of another image, and its collector
	// runs over the snapshotter.
	collect := func(when string) {
		t.Helper()
		ctx := namespaces.WithNamespace(bg, "default")
		if _, err := reg.st.snapshots.Prepare(ctx, "some-container", ""); err != nil {
			t.Fatal(err)
		}
		if err := reg.st.snapshots.Remove(ctx, "some-container"); err != nil {
			t.Fatal(err)
		}
		if _, err := cdb.GarbageCollect(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := e.sn.Stat(bg, top); err != nil {
			t.Errorf("%s: containerd's collector removed the image's chain: %v", when, err)
		}
		if _, err := e.sn.Stat(bg, ActivationKey(imageID)); err != nil {
			t.Errorf("%s: containerd's collector removed the image's activation: %v", when, err)
		}
	}
	collect("containerd up, the name not yet registered")

	reg.down.Store(false)
	if n, err := e.p.RegisterPending(bg); err != nil || n != 0 {
		t.Fatalf("RegisterPending once containerd answers: %d left, %v", n, err)
	}
	if got := reg.topOf(t, "app:v1"); got != top {
		t.Errorf("containerd's app:v1 has top chain %s, want %s", got, top)
	}
	collect("the name registered")
	if res := e.mustPull("app/", "app:v1"); !res.Snapshot.Registered || res.Snapshot.RegisterPending {
		t.Errorf("pull once the name is registered: registered %v, register pending %v", res.Snapshot.Registered, res.Snapshot.RegisterPending)
	}
}

// downFakeRegistrar is fakeRegistrar behind a containerd socket that
// can be absent, as ContainerdRegistrar answers then: Check nil,
// Register ErrContainerdAbsent, Registered true.
type downFakeRegistrar struct {
	*fakeRegistrar
	down atomic.Bool
}

func (r *downFakeRegistrar) Check(ctx context.Context, ref string, replace bool) error {
	if r.down.Load() {
		return nil
	}
	return r.fakeRegistrar.Check(ctx, ref, replace)
}

func (r *downFakeRegistrar) Register(ctx context.Context, ref string, diffIDs []string, replace bool) error {
	if r.down.Load() {
		return fmt.Errorf("register %s: %w", ref, ErrContainerdAbsent)
	}
	return r.fakeRegistrar.Register(ctx, ref, diffIDs, replace)
}

func (r *downFakeRegistrar) Registered(ctx context.Context, ref string, diffIDs []string) (bool, error) {
	if r.down.Load() {
		return true, nil
	}
	return r.fakeRegistrar.Registered(ctx, ref, diffIDs)
}

// TestPullReplaceWhileContainerdDownRegistersLater: `pull --replace --name
// N` while containerd's socket is absent, N being an image containerd has
// that this daemon did not create, is recorded pending with its --replace:
// once containerd answers, RegisterPending repoints N at the pulled image,
// as the pull would have, and the records keep giving N to it.
func TestPullReplaceWhileContainerdDownRegistersLater(t *testing.T) {
	bg := context.Background()
	reg := &downFakeRegistrar{fakeRegistrar: newFakeRegistrar()}
	e := newPullEnv(t, nil)
	e.p.opts.Registrar = reg
	const name = "registry.example/app:1"
	reg.foreign[name] = map[string]string{"owner": "someone"}
	reg.down.Store(true)
	e.srv.Put(t, "rp/1.tar", layerTar(t, "rp", 100))
	res, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "rp/", Ref: name, Replace: true})
	if err != nil {
		t.Fatalf("pull --replace while containerd is down: %v", err)
	}
	reg.down.Store(false)
	_, _ = e.p.RegisterPending(bg)
	id, _ := RecordsOf(e.db).ImageIDByName(bg, name)
	if id != res.ImageID {
		t.Errorf("after RegisterPending the records give %q to %q; want the image pulled with --replace (%s)", name, id, res.ImageID)
	}
	if top := reg.registeredTop(name); top != res.TopChainID {
		t.Errorf("containerd's %s has top %q; want the --replace pull's %s (still foreign: %v)", name, top, res.TopChainID, reg.foreign[name] != nil)
	}
}

// TestContainerdDeadSocketIsAbsent: the socket file a containerd that died
// left behind (connection refused) counts as no containerd: the name's
// check passes, Register says ErrContainerdAbsent (so the name goes
// pending), and Registered has nothing to register in.
func TestContainerdDeadSocketIsAbsent(t *testing.T) {
	ctx := context.Background()
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	r := &ContainerdRegistrar{Address: sock, Namespace: "default"}
	const chain = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	if err := r.Check(ctx, "app:1", false); err != nil {
		t.Errorf("Check with containerd's socket dead: %v; want nil, as with no socket", err)
	}
	if err := r.Register(ctx, "app:1", []string{chain}, false); !errors.Is(err, ErrContainerdAbsent) {
		t.Errorf("Register with containerd's socket dead: %v; want ErrContainerdAbsent", err)
	}
	if ok, err := r.Registered(ctx, "app:1", []string{chain}); !ok || err != nil {
		t.Errorf("Registered with containerd's socket dead: %v, %v; want true, nil, as with no socket", ok, err)
	}
}

// holdingGuard is a fake PoolGuard that counts the holds Begin gives on
// each image (gc.Collector's, in the daemon, also waits for a removal of
// the image under way and keeps one from starting while held).
type holdingGuard struct {
	mu   sync.Mutex
	held map[string]int
}

func (g *holdingGuard) Begin(imageID string) func() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[imageID]++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.held[imageID]--
	}
}

func (g *holdingGuard) holds(imageID string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held[imageID]
}

func (*holdingGuard) MakeRoom(context.Context, string, []LayerNeed) (func(), error) {
	return func() {}, nil
}
func (*holdingGuard) Pulled(context.Context, string)            {}
func (*holdingGuard) Preparing(context.Context, string)         {}
func (*holdingGuard) Committed(context.Context, string, string) {}
func (*holdingGuard) Dropped(context.Context, string)           {}

// heldRegistrar is downFakeRegistrar noting whether the image was held
// by the pool guard at each registration.
type heldRegistrar struct {
	*downFakeRegistrar
	guard    *holdingGuard
	imageID  string
	unheld   atomic.Int32
	register atomic.Int32
}

func (r *heldRegistrar) Register(ctx context.Context, ref string, diffIDs []string, replace bool) error {
	if !r.down.Load() {
		r.register.Add(1)
		if r.guard.holds(r.imageID) == 0 {
			r.unheld.Add(1)
		}
	}
	return r.downFakeRegistrar.Register(ctx, ref, diffIDs, replace)
}

// TestRegisterPendingHoldsTheImage: a name pulled while containerd was
// down is registered with its image held by the pool guard, as a pull
// holds it, so that no removal deletes the chains containerd is being
// handed; the hold ends with the registration.
func TestRegisterPendingHoldsTheImage(t *testing.T) {
	bg := context.Background()
	e := newPullEnv(t, nil)
	g := &holdingGuard{held: map[string]int{}}
	e.p.SetPoolGuard(g)
	_, imageID := imageSource(e.srv.Bucket, "hp/")
	reg := &heldRegistrar{downFakeRegistrar: &downFakeRegistrar{fakeRegistrar: newFakeRegistrar()}, guard: g, imageID: imageID}
	e.p.opts.Registrar = reg
	reg.down.Store(true)
	e.srv.Put(t, "hp/1.tar", layerTar(t, "hp", 100))
	if res := e.mustPull("hp/", "hp:v1"); !res.Snapshot.RegisterPending {
		t.Fatalf("pull while containerd is down: %+v, want the name pending", res.Snapshot)
	}
	reg.down.Store(false)
	if n, err := e.p.RegisterPending(bg); err != nil || n != 0 {
		t.Fatalf("RegisterPending once containerd answers: %d left, %v", n, err)
	}
	if reg.register.Load() != 1 || reg.unheld.Load() != 0 {
		t.Errorf("registrations once containerd answered: %d, %d of them with the image not held; want 1 and 0", reg.register.Load(), reg.unheld.Load())
	}
	if n := g.holds(imageID); n != 0 {
		t.Errorf("%d holds on the image left after RegisterPending", n)
	}
}

// TestActivateHoldsTheImage: `activate` holds its image in the pool guard
// while it runs, as a pull does, so that it waits for a removal of the
// image under way and no removal starts under it (the activation and the
// registration build on the image's chains); the hold ends with it.
func TestActivateHoldsTheImage(t *testing.T) {
	e := newPullEnv(t, nil)
	g := &holdingGuard{held: map[string]int{}}
	e.p.SetPoolGuard(g)
	_, imageID := imageSource(e.srv.Bucket, "ah/")
	reg := &heldRegistrar{downFakeRegistrar: &downFakeRegistrar{fakeRegistrar: newFakeRegistrar()}, guard: g, imageID: imageID}
	e.p.opts.Registrar = reg
	e.srv.Put(t, "ah/1.tar", layerTar(t, "ah", 100))
	e.mustPull("ah/", "ah:v1")
	before := reg.register.Load()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.p.Activate(ctx, "ah:v1"); err != nil {
		t.Fatalf("activate: %v", err)
	}
	if n := reg.register.Load() - before; n != 1 || reg.unheld.Load() != 0 {
		t.Errorf("activate registered %d times, %d of all registrations with the image not held; want 1 and 0", n, reg.unheld.Load())
	}
	if n := g.holds(imageID); n != 0 {
		t.Errorf("%d holds on the image left after activate", n)
	}
}

// TestRegisterPendingRefusedTakesBackTheEarlierNamespaces, on containerd's
// metadata store: a name pulled into namespaces default and k8s.io while
// containerd was down, which k8s.io then gives to someone else's image, is
// registered in default and refused in k8s.io once containerd answers. The
// records give the name up, and default keeps no image of ours under it:
// no record would name it, so nothing would ever remove it. The other
// image stays as it was.
func TestRegisterPendingRefusedTakesBackTheEarlierNamespaces(t *testing.T) {
	bg := context.Background()
	e, reg := newContainerdPullEnv(t)
	reg.down.Store(true)
	const name = "pending/app"
	e.srv.Put(t, "pa/1.tar", layerTar(t, "pa", 300))
	if _, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "pa/", Ref: name, Namespaces: []string{"default", "k8s.io"}}); err != nil {
		t.Fatalf("pull while containerd is down: %v", err)
	}
	k8s := namespaces.WithNamespace(bg, "k8s.io")
	theirs := images.Image{Name: name, Target: manifestDesc("their manifest"), Labels: map[string]string{"owner": "someone"}}
	if _, err := reg.st.images.Create(k8s, theirs); err != nil {
		t.Fatal(err)
	}
	reg.down.Store(false)
	if _, err := e.p.RegisterPending(bg); err != nil {
		t.Fatalf("RegisterPending once containerd answers: %v", err)
	}
	if id, _ := RecordsOf(e.db).ImageIDByName(bg, name); id != "" {
		t.Errorf("the refused name stayed recorded for %s", id)
	}
	if img, err := reg.st.images.Get(namespaces.WithNamespace(bg, "default"), name); !errdefs.IsNotFound(err) {
		t.Errorf("containerd's namespace default after the refusal: %+v, %v; want no image %s", img, err, name)
	}
	if img, err := reg.st.images.Get(k8s, name); err != nil || img.Target.Digest != theirs.Target.Digest || !maps.Equal(img.Labels, theirs.Labels) {
		t.Errorf("the other image in k8s.io: %+v, %v; want it as it was", img, err)
	}
}
