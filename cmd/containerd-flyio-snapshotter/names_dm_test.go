//go:build dm

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

// TestForeignContainerdImageKept, with a real containerd: an image this
// daemon did not create (a registry image the CRI pinned, made with
// containerd's client: its manifest in the content store, CRI labels)
// keeps its target and labels through a `pull --name` of its name, which
// is refused naming it and its labels, and through `rm` of that name. A
// name the daemon registered that a registry pull then took over in
// containerd (its target and labels replaced, as containerd's pull does)
// survives `rm` of the S3 image and a garbage collection that removes the
// S3 image; containerd's own collection keeps all of them.
func TestForeignContainerdImageKept(t *testing.T) {
	var ctrd *stack.Containerd
	e := newPullEnvTB(t, func(c *plugin.Config) {
		// A small pool and low thresholds: the pool's base device alone
		// (about 49 MiB) is past the high threshold, so every pull first
		// collects every unused image. The pool's metadata, about 10% used
		// from the start, stays under it (a pull is refused past it).
		c.Pool.DataSize = 128 << 20
		c.GC.HighThreshold, c.GC.LowThreshold = 20, 10
		ctrd = startContainerd(t, c)
	})
	ctx := context.Background()
	lease, err := ctrd.Leased(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.End(ctx) })
	lctx, is, cs := lease.Ctx, lease.Client.ImageService(), lease.Client.ContentStore()
	man := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:` +
		strings.Repeat("0", 64) + `","size":2},"layers":[]}`)
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(man), Size: int64(len(man))}
	if err := content.WriteBlob(lctx, cs, "registry-manifest", bytes.NewReader(man), desc); err != nil {
		t.Fatalf("write the registry manifest: %v", err)
	}
	labels := map[string]string{pipeline.LabelPinned: "pinned", "io.cri-containerd.image": "managed"}
	registry := func(name string) images.Image {
		return images.Image{Name: name, Target: desc, Labels: maps.Clone(labels)}
	}
	kept := func(when, name string) {
		t.Helper()
		img, err := is.Get(lctx, name)
		if err != nil || img.Target.Digest != desc.Digest || !maps.Equal(img.Labels, labels) {
			t.Fatalf("%s: containerd's %s is %+v, %v; want target %s with labels %v", when, name, img, err, desc.Digest, labels)
		}
		if b, err := content.ReadBlob(lctx, cs, img.Target); err != nil || !bytes.Equal(b, man) {
			t.Fatalf("%s: the manifest of %s: %v", when, name, err)
		}
	}
	sock := e.cfg.Daemon.ControlSocket
	run := func(args ...string) (int, string, string) {
		t.Helper()
		return runCommand(t, nil, append(args[:1:1], append([]string{"--control-socket", sock}, args[1:]...)...)...)
	}
	url := func(prefix string) string { return "s3://" + e.srv.Bucket + "/" + prefix }
	named := func(name string) string {
		t.Helper()
		id, err := pipeline.RecordsOf(e.db()).ImageIDByName(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}

	// A pull under the registry image's name is refused, naming it.
	const reg = "registry.example/team/app:1.0"
	if _, err := is.Create(lctx, registry(reg)); err != nil {
		t.Fatal(err)
	}
	e.srv.Put(t, "x/1.tar", genLayer(t, 1, "x", 1, 4096, true))
	code, _, errOut := run("pull", url("x/"), "--name", reg)
	for _, want := range []string{reg, "not created by this daemon", `"io.cri-containerd.pinned"="pinned"`, desc.Digest.String(), "--replace"} {
		if code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("pull --name %s = %d, %q; want 1 and %q", reg, code, errOut, want)
		}
	}
	kept("after the refused pull", reg)
	if id := named(reg); id != "" {
		t.Errorf("the refused name is recorded for image %s", id)
	}
	// rm of that name finds no image of ours and leaves it.
	if code, _, errOut := run("rm", reg); code != 1 || !strings.Contains(errOut, "no image pulled under that name") {
		t.Errorf("rm %s = %d, %q; want 1, no image pulled under that name", reg, code, errOut)
	}
	kept("after rm", reg)
	// The same as one JSON object: nothing removed, and why.
	code, out, errOut := run("rm", reg, "--format", "json")
	var rmOut cli.RmOutput
	if err := json.Unmarshal([]byte(out), &rmOut); code != 1 || err != nil || errOut != "" || len(rmOut.Removed) != 0 ||
		!strings.Contains(rmOut.Error, "no image pulled under that name") {
		t.Errorf("rm %s --format json = %d, %q, %q (%v); want 1 and the reason in the JSON only", reg, code, out, errOut, err)
	}

	// takenOver pulls dir/ under its default name and as name, then a
	// registry pull takes name over in containerd (replacing its target
	// and labels). The default name keeps the image's chain in
	// containerd: without it, containerd's collector would remove the
	// chain, and with it the image, through the snapshotter.
	takenOver := func(dir, name string, seed uint64) (defaultName string) {
		t.Helper()
		e.srv.Put(t, dir+"/1.tar", genLayer(t, seed, dir, 1, 4096, true))
		res, err := e.pull(dir+"/", "")
		if err != nil {
			t.Fatalf("pull %s/: %v", dir, err)
		}
		if _, err := e.pull(dir+"/", name); err != nil {
			t.Fatalf("pull %s/ as %s: %v", dir, name, err)
		}
		if _, err := is.Update(lctx, registry(name)); err != nil {
			t.Fatal(err)
		}
		return res.Ref
	}
	// A name of ours that a registry pull took over in containerd: rm of
	// the S3 image removes our records, not the registry's image.
	const taken = "flyio.test/taken:1"
	yName := takenOver("y", taken, 2)
	// activate --format json: the daemon's answer, naming the image's
	// activation (through its default name: the one taken over is the
	// registry's now, which activate would not register over).
	code, out, errOut = run("activate", yName, "--format", "json")
	var act api.ActivateResponse
	if err := json.Unmarshal([]byte(out), &act); code != 0 || err != nil || act.ImageID != named(yName) ||
		act.SnapshotName != pipeline.ActivationKey(act.ImageID) || !act.Active || !strings.HasPrefix(act.DevicePath, "/dev/") {
		t.Errorf("activate %s --format json = %d, %q, %q (%v)", yName, code, out, errOut, err)
	}
	if code, out, errOut := run("rm", taken); code != 0 || !strings.Contains(out, "removed ") {
		t.Fatalf("rm %s = %d, %q, %q", taken, code, out, errOut)
	}
	kept("after rm of the S3 image", taken)
	if id := named(taken); id != "" {
		t.Errorf("rm left %s recorded for image %s", taken, id)
	}

	// The same, removed by a collection: the next pull collects every
	// unused image, which unregisters its default name (ours) and not the
	// registry's.
	const collected = "flyio.test/collected:1"
	zName := takenOver("z", collected, 3)
	e.srv.Put(t, "w/1.tar", genLayer(t, 4, "w", 1, 4096, true))
	if _, err := e.pull("w/", ""); err != nil {
		t.Fatalf("pull w/: %v", err)
	}
	if id := named(collected); id != "" {
		t.Fatalf("the collection kept image %s (named %s): it was to be removed", id, collected)
	}
	if _, err := is.Get(lctx, zName); !errdefs.IsNotFound(err) {
		t.Errorf("containerd's %s (ours) after the collection removed its image: %v; want it gone", zName, err)
	}
	kept("after the collection", collected)
	kept("after the collection", reg)

	// containerd's own collection (ending the lease runs it) keeps them.
	if err := lease.End(ctx); err != nil {
		t.Fatal(err)
	}
	if lease, err = ctrd.Leased(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, is, cs = lease.Ctx, lease.Client.ImageService(), lease.Client.ContentStore()
	for _, name := range []string{reg, taken, collected} {
		kept("after containerd's collection", name)
	}
}
