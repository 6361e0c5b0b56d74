package pipeline

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// TestActivateRegistersWhereThePullDid, on containerd's metadata store:
// `activate` of an image pulled with --namespace k8s.io registers its
// name again in k8s.io, where containerd has it, and not in the daemon's
// default namespace, which the pull was not asked for.
func TestActivateRegistersWhereThePullDid(t *testing.T) {
	e, reg := newContainerdPullEnv(t)
	const name = "ns/app:1"
	e.srv.Put(t, "ns/1.tar", layerTar(t, "ns", 300))
	if _, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "ns/", Ref: name, Namespaces: []string{"k8s.io"}}); err != nil {
		t.Fatalf("pull into k8s.io: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := e.p.Activate(ctx, name)
	if err != nil {
		t.Fatalf("activate: %v", err)
	}
	if !res.Registered || !slices.Equal(res.Namespaces, []string{"k8s.io"}) {
		t.Errorf("activate: registered %v in namespaces %q, want true in [k8s.io]", res.Registered, res.Namespaces)
	}
	if _, err := reg.st.images.Get(namespaces.WithNamespace(ctx, "default"), name); !errdefs.IsNotFound(err) {
		t.Errorf("containerd image %s in namespace default after activate: %v, want not found", name, err)
	}
	if _, err := reg.st.images.Get(namespaces.WithNamespace(ctx, "k8s.io"), name); err != nil {
		t.Errorf("containerd image %s in namespace k8s.io after activate: %v", name, err)
	}
}
