package pipeline

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
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
	if res.Snapshot.Registered {
		t.Errorf("pull while containerd is down reports the image registered")
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
	if res := e.mustPull("app/", "app:v1"); !res.Snapshot.Registered {
		t.Errorf("pull once the name is registered reports it not registered")
	}
}
