package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
)

// TestPullDefaultNamesApart: a layer key, the prefix its name reads like,
// and the same prefix spelled with capitals are three images under three
// names, each registered with its own layers; none moved another's name.
func TestPullDefaultNamesApart(t *testing.T) {
	e, reg := newRegisteringPullEnv(t)
	ctx := context.Background()
	e.srv.Put(t, "app.tar", layerTar(t, "k", 500))
	e.srv.Put(t, "app/1.tar", layerTar(t, "p", 500))
	e.srv.Put(t, "App/1.tar", layerTar(t, "c", 500))
	seen := map[string]*api.PullResult{}
	for _, key := range []string{"app.tar", "app/", "App/"} {
		res := e.mustPull(key, "")
		if other, ok := seen[res.Ref]; ok {
			t.Errorf("%s and %s both named %s", other.Source, res.Source, res.Ref)
		}
		seen[res.Ref] = res
	}
	for name, res := range seen {
		if got := reg.registeredTop(name); got != res.TopChainID {
			t.Errorf("%s (%s) registered with %q, want %s", name, res.Source, got, res.TopChainID)
		}
		if id, _ := RecordsOf(e.db).ImageIDByName(ctx, name); id != res.ImageID {
			t.Errorf("%s names image %q in the records, want %s (%s)", name, id, res.ImageID, res.Source)
		}
	}
}

// TestPullNameOfAnotherImage: a name another pulled image has is refused,
// naming that image and its source, before any work (no S3 request, no
// run, no record); --replace moves it.
func TestPullNameOfAnotherImage(t *testing.T) {
	e, reg := newRegisteringPullEnv(t)
	ctx := context.Background()
	e.srv.Put(t, "a/1.tar", layerTar(t, "a", 500))
	e.srv.Put(t, "b/1.tar", layerTar(t, "b", 500))
	a := e.mustPull("a/", "app")
	runs, reqs := e.runCount(), e.srv.TotalRequests()
	_, err := e.pull("b/", "app")
	if !errors.Is(err, errNameTaken) || !strings.Contains(err.Error(), `"app" is the name of image `+a.ImageID+" ("+a.Source+")") {
		t.Fatalf("pull of b/ as a's name: %v; want errNameTaken naming %s and %s", err, a.ImageID, a.Source)
	}
	if n := e.runCount() - runs; n != 0 || e.srv.TotalRequests() != reqs {
		t.Errorf("the refused pull started %d runs and sent S3 %d requests", n, e.srv.TotalRequests()-reqs)
	}
	_, bID := imageSource(e.srv.Bucket, "b/")
	if img, _ := RecordsOf(e.db).GetImage(ctx, bID); img != nil {
		t.Errorf("the refused pull recorded its image: %+v", img)
	}
	if id, _ := RecordsOf(e.db).ImageIDByName(ctx, "app"); id != a.ImageID || reg.registeredTop("app") != a.TopChainID {
		t.Errorf("after the refusal app names %q (registered %q), want %s", id, reg.registeredTop("app"), a.ImageID)
	}
	b, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "b/", Ref: "app", Replace: true})
	if err != nil {
		t.Fatalf("pull of b/ as app with replace: %v", err)
	}
	if id, _ := RecordsOf(e.db).ImageIDByName(ctx, "app"); id != b.ImageID || reg.registeredTop("app") != b.TopChainID {
		t.Errorf("after replace app names %q (registered %q), want %s", id, reg.registeredTop("app"), b.ImageID)
	}
	// a, pulled again under its old name, is refused the same way.
	if _, err := e.pull("a/", "app"); !errors.Is(err, errNameTaken) {
		t.Errorf("a/ pulled again as app, now b's: %v; want errNameTaken", err)
	}
}

// TestPullForeignContainerdName: a name containerd has for an image this
// daemon did not create (in the namespace pulled into) is refused before
// any work, the image untouched; --replace takes it over, its labels
// kept.
func TestPullForeignContainerdName(t *testing.T) {
	e, reg := newRegisteringPullEnv(t)
	ctx := context.Background()
	const name = "registry.example/app:1"
	pinned := map[string]string{LabelPinned: "pinned"}
	reg.foreign["k8s.io|"+name] = maps.Clone(pinned)
	e.srv.Put(t, "x/1.tar", layerTar(t, "x", 500))
	_, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "x/", Ref: name, Namespaces: []string{"default", "k8s.io"}})
	if !errors.Is(err, ErrForeignImage) || !strings.Contains(err.Error(), name) {
		t.Fatalf("pull under a registry image's name: %v; want ErrForeignImage naming it", err)
	}
	if n := e.runCount(); n != 0 {
		t.Errorf("the refused pull started %d runs", n)
	}
	if reg.calls("default|"+name) != 0 || !maps.Equal(reg.foreign["k8s.io|"+name], pinned) {
		t.Errorf("the refused pull registered %d times; the registry image is %v", reg.calls("default|"+name), reg.foreign["k8s.io|"+name])
	}
	if id, _ := RecordsOf(e.db).ImageIDByName(ctx, name); id != "" {
		t.Errorf("the refused name is recorded for %s", id)
	}
	// Another namespace has no such image: the name is free there.
	e.mustPull("x/", "")
	res, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "x/", Ref: name, Namespaces: []string{"k8s.io"}, Replace: true})
	if err != nil {
		t.Fatalf("pull with replace: %v", err)
	}
	want := map[string]string{LabelPinned: "pinned", LabelSource: "pipeline"}
	if reg.registeredTop("k8s.io|"+name) != res.TopChainID || !maps.Equal(reg.labels["k8s.io|"+name], want) {
		t.Errorf("after replace: registered %q, labels %v; want %s and %v", reg.registeredTop("k8s.io|"+name), reg.labels["k8s.io|"+name], res.TopChainID, want)
	}
}

// TestRegisterStepRefusesForeignName: a name containerd gives to an image
// of someone else after the pull checked it is refused by the register
// step, which aborts (no retry) and takes back the name it recorded.
func TestRegisterStepRefusesForeignName(t *testing.T) {
	e, reg := newRegisteringPullEnv(t)
	ctx := context.Background()
	const name = "late/app"
	e.p.hooks = map[string]func(){"register:started": func() {
		reg.mu.Lock()
		reg.foreign[name] = map[string]string{"owner": "someone"}
		reg.mu.Unlock()
	}}
	e.srv.Put(t, "y/1.tar", layerTar(t, "y", 500))
	_, err := e.pull("y/", name)
	if !errors.Is(err, ErrForeignImage) && !strings.Contains(err.Error(), ErrForeignImage.Error()) {
		t.Fatalf("pull whose name was taken meanwhile: %v; want the foreign image refused", err)
	}
	if id, _ := RecordsOf(e.db).ImageIDByName(ctx, name); id != "" {
		t.Errorf("the refused name stayed recorded for %s", id)
	}
	runs, err := fsm.NewSQLiteStore(e.db).ListRuns(ctx, fsm.RunFilter{FSM: api.FSMActivate})
	if err != nil || len(runs) != 1 || runs[0].State != fsm.StateAborted {
		t.Fatalf("activate runs %+v, %v; want one, aborted", runs, err)
	}
	if reg.calls(name) != 0 {
		t.Errorf("Register reached containerd %d times", reg.calls(name))
	}
}

// nameIs fails the test unless name gives image want both in the records
// and in containerd's namespace "default" (its config's top chain).
func nameIs(t *testing.T, e *env, reg *storesRegistrar, when, name string, want *api.PullResult) {
	t.Helper()
	id, err := RecordsOf(e.db).ImageIDByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if top := reg.topOf(t, name); id != want.ImageID || top != want.TopChainID {
		t.Errorf("%s: the records give %s to image %q and containerd's %s runs top chain %s; want both %s (%s, top chain %s)",
			when, name, id, name, top, want.Source, want.ImageID, want.TopChainID)
	}
}

// TestPullNameMovedBackRepointsContainerd, on containerd's metadata
// store: a name moved to another image and back (--replace twice) runs
// the image the records give it, although the first image's chain stayed
// known to containerd under its default name. A name containerd has for
// another image than the records say (a registration that failed after
// its record moved) is repointed by the next pull of the recorded image,
// and the pull after that is answered from the records, containerd's
// image left untouched.
func TestPullNameMovedBackRepointsContainerd(t *testing.T) {
	e, reg := newContainerdPullEnv(t)
	e.srv.Put(t, "a/1.tar", layerTar(t, "a", 500))
	e.srv.Put(t, "b/1.tar", layerTar(t, "b", 500))
	a := e.mustPull("a/", "") // its default name keeps a's chain in containerd
	e.mustPull("a/", "app")
	b, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "b/", Ref: "app", Replace: true})
	if err != nil {
		t.Fatalf("pull b/ as app with replace: %v", err)
	}
	nameIs(t, e, reg, "app moved to b/", "app", b)
	if _, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "a/", Ref: "app", Replace: true}); err != nil {
		t.Fatalf("pull a/ as app with replace: %v", err)
	}
	nameIs(t, e, reg, "app moved back to a/", "app", a)

	ctx := namespaces.WithNamespace(context.Background(), "default")
	diffs := make([]string, len(b.Layers))
	for i, l := range b.Layers {
		diffs[i] = l.DiffID
	}
	if err := register(ctx, reg.st, DefaultSnapshotter, "default", "app", diffs, false); err != nil {
		t.Fatal(err)
	}
	e.mustPull("a/", "app")
	nameIs(t, e, reg, "a/ pulled as app while containerd's app ran b/", "app", a)
	runs := e.runCount()
	before, err := reg.st.images.Get(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	e.mustPull("a/", "app")
	if after, err := reg.st.images.Get(ctx, "app"); err != nil || !after.UpdatedAt.Equal(before.UpdatedAt) || e.runCount() != runs {
		t.Errorf("pull of a/ as app, in place, started %d runs and left containerd's app updated at %v (%v); want no run and %v",
			e.runCount()-runs, after.UpdatedAt, err, before.UpdatedAt)
	}
	nameIs(t, e, reg, "a/ pulled as app again", "app", a)
}

// namingWait is how long a test lets a concurrent naming of the same name
// run before the naming it interrupted goes on: ample for a naming that
// does not wait for the other, and what a naming that does wait costs.
const namingWait = 500 * time.Millisecond

// interleave makes reg run pull at the start of its next registration,
// giving it namingWait to end; the returned channel yields pull's error.
func interleave(reg *storesRegistrar, pull func() error) <-chan error {
	done := make(chan error, 1)
	reg.mu.Lock()
	defer reg.mu.Unlock()
	reg.beforeRegister = func() {
		finished := make(chan error, 1)
		go func() { finished <- pull() }()
		select {
		case err := <-finished:
			done <- err
		case <-time.After(namingWait):
			go func() { done <- <-finished }()
		}
	}
	return done
}

// TestPullsOfOneNewNameRace, on containerd's metadata store: two pulls of
// different images, both pulled, under one new name and without
// --replace, the second while the first registers the name: the first has
// the name in the records and in containerd, and the second is refused
// (errNameTaken) before writing to containerd.
func TestPullsOfOneNewNameRace(t *testing.T) {
	e, reg := newContainerdPullEnv(t)
	e.srv.Put(t, "a/1.tar", layerTar(t, "a", 500))
	e.srv.Put(t, "b/1.tar", layerTar(t, "b", 500))
	a := e.mustPull("a/", "")
	e.mustPull("b/", "")
	bDone := interleave(reg, func() error { _, err := e.pull("b/", "app"); return err })
	if _, err := e.pull("a/", "app"); err != nil {
		t.Errorf("pull a/ as app: %v", err)
	}
	if err := <-bDone; !errors.Is(err, errNameTaken) {
		t.Errorf("pull b/ as app while a/ was named app: %v; want errNameTaken", err)
	}
	nameIs(t, e, reg, "after both pulls", "app", a)
}

// TestPullsReplacingOneNameRace, on containerd's metadata store: two
// --replace pulls of different images under one name, the second while
// the first registers it, both succeed and leave the name to the second
// in the records and in containerd alike.
func TestPullsReplacingOneNameRace(t *testing.T) {
	e, reg := newContainerdPullEnv(t)
	e.srv.Put(t, "a/1.tar", layerTar(t, "a", 500))
	e.srv.Put(t, "b/1.tar", layerTar(t, "b", 500))
	e.mustPull("a/", "")
	b := e.mustPull("b/", "")
	bDone := interleave(reg, func() error {
		_, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "b/", Ref: "app", Replace: true})
		return err
	})
	if _, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "a/", Ref: "app", Replace: true}); err != nil {
		t.Errorf("pull a/ as app with replace: %v", err)
	}
	if err := <-bDone; err != nil {
		t.Errorf("pull b/ as app with replace, while a/ registered app: %v", err)
	}
	nameIs(t, e, reg, "after both pulls", "app", b)
}

// TestRegisterRefusedInALaterNamespaceTakesBackTheEarlier, on containerd's
// metadata store: a pull into namespaces default and k8s.io whose name
// k8s.io gives to someone else's image after the pull checked it (here,
// while the register step writes to default) is refused there, and leaves
// the name neither in the records nor, as an image of ours, in default,
// where it was registered first; the other image stays as it was.
func TestRegisterRefusedInALaterNamespaceTakesBackTheEarlier(t *testing.T) {
	e, reg := newContainerdPullEnv(t)
	const name = "late/app"
	k8s := namespaces.WithNamespace(context.Background(), "k8s.io")
	theirs := images.Image{Name: name, Target: manifestDesc("their manifest"), Labels: map[string]string{"owner": "someone"}}
	reg.beforeRegister = func() {
		if _, err := reg.st.images.Create(k8s, theirs); err != nil {
			t.Error(err)
		}
	}
	e.srv.Put(t, "y/1.tar", layerTar(t, "y", 500))
	_, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "y/", Ref: name, Namespaces: []string{"default", "k8s.io"}})
	if !errors.Is(err, ErrForeignImage) && !strings.Contains(err.Error(), ErrForeignImage.Error()) {
		t.Fatalf("pull whose name k8s.io gave away meanwhile: %v; want the foreign image refused", err)
	}
	if id, _ := RecordsOf(e.db).ImageIDByName(context.Background(), name); id != "" {
		t.Errorf("the refused name stayed recorded for %s", id)
	}
	if img, err := reg.st.images.Get(namespaces.WithNamespace(context.Background(), "default"), name); !errdefs.IsNotFound(err) {
		t.Errorf("containerd's namespace default after the refusal: %+v, %v; want no image %s", img, err, name)
	}
	if img, err := reg.st.images.Get(k8s, name); err != nil || img.Target.Digest != theirs.Target.Digest || !maps.Equal(img.Labels, theirs.Labels) {
		t.Errorf("the other image in k8s.io: %+v, %v; want it as it was", img, err)
	}
}

// unregisterFailsRegistrar is a fake at the containerd boundary: the
// storesRegistrar whose Unregister fails (containerd timing out) while
// fail is set, having removed nothing.
type unregisterFailsRegistrar struct {
	*storesRegistrar
	fail atomic.Bool
}

func (r *unregisterFailsRegistrar) Unregister(ctx context.Context, ref string) error {
	if r.fail.Load() {
		return fmt.Errorf("unregister %s: injected: containerd did not answer in time", ref)
	}
	return r.storesRegistrar.Unregister(ctx, ref)
}

// TestRegisterRefusedTakeBackFailedKeepsTheName, on containerd's metadata
// store: a pull into namespaces default and k8s.io whose name k8s.io gives
// to someone else's image meanwhile is refused there; when the name cannot
// then be taken back from default (containerd does not answer), the records
// keep it for the image, so that an image of ours containerd has under it
// is one a record names (an rm of the image removes it) rather than one
// nothing would ever remove.
func TestRegisterRefusedTakeBackFailedKeepsTheName(t *testing.T) {
	e, stores := newContainerdPullEnv(t)
	reg := &unregisterFailsRegistrar{storesRegistrar: stores}
	reg.fail.Store(true)
	e.p.opts.Registrar = reg
	const name = "late/kept"
	bg := context.Background()
	k8s := namespaces.WithNamespace(bg, "k8s.io")
	theirs := images.Image{Name: name, Target: manifestDesc("their manifest"), Labels: map[string]string{"owner": "someone"}}
	stores.beforeRegister = func() {
		if _, err := stores.st.images.Create(k8s, theirs); err != nil {
			t.Error(err)
		}
	}
	e.srv.Put(t, "k/1.tar", layerTar(t, "k", 500))
	_, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "k/", Ref: name, Namespaces: []string{"default", "k8s.io"}})
	if !errors.Is(err, ErrForeignImage) && !strings.Contains(err.Error(), ErrForeignImage.Error()) {
		t.Fatalf("pull whose name k8s.io gave away meanwhile: %v; want the foreign image refused", err)
	}
	_, imageID := imageSource(e.srv.Bucket, "k/")
	img, gerr := stores.st.images.Get(namespaces.WithNamespace(bg, "default"), name)
	id, _ := RecordsOf(e.db).ImageIDByName(bg, name)
	if gerr == nil && ownImage(img) && id != imageID {
		t.Errorf("containerd's namespace default keeps an image of ours named %s, which the records give to %q; want the records to name it for %s", name, id, imageID)
	}
}
