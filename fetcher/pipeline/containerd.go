package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// How containerd comes to own our unpacked chains: a Prepare through its
// snapshot service carrying the label containerd.io/snapshot.ref = a chain
// ID reaches our snapshotter, which answers AlreadyExists because a
// committed snapshot carries that label on the same parent (updateDB puts
// it there); containerd's metadata store then records that committed
// snapshot under the chain ID in its namespace (the "remote snapshot" path
// of core/metadata) instead of making a new one. Register does this for
// every chain ID of the image, under a lease, after labelling the image's
// config blob containerd.io/gc.ref.snapshot.flyio = the top chain ID, and
// names the image only then: from then on the image keeps its chain alive,
// and `ctr image rm` followed by containerd's garbage collection removes it
// through our proxy plugin.
//
// The parent of that Prepare is what the namespace knows the parent chain
// as, which may be a snapshot containerd's unpacker committed for a
// registry image ("<ns>/<n>/<chainID>" on our side): the pipeline builds
// on such a snapshot rather than extracting the chain again (chainKey), so
// that the committed snapshot is found on that very parent. Conversely a
// chain the pipeline committed carries snapshot.ref = its chain ID, so
// containerd's unpacker, in any namespace that does not know the chain yet,
// gets AlreadyExists from us and records our snapshot instead of unpacking
// the layer: with this snapshotter containerd unpacks a chain once per
// pool, not once per namespace.

// ContainerdRegistrar writes an image's OCI config and manifest into
// containerd's content store, creates or updates the image record and
// makes containerd adopt the unpacked chain, so that
// `ctr run --snapshotter flyio REF` finds the image unpacked, and removing
// the image lets containerd's garbage collector remove its snapshots.
type ContainerdRegistrar struct {
	Address string // containerd's socket
	// Namespace is where images are registered when the context names no
	// containerd namespace (namespaces.WithNamespace names one: a pull
	// registers its image in each namespace it was asked for that way).
	Namespace string
	// Snapshotter is the name containerd's config gives our proxy plugin
	// ([proxy_plugins.NAME]); "" means DefaultSnapshotter. Images are
	// labelled with it, so it must be the name containerd uses.
	Snapshotter string
}

// namespace is the containerd namespace of a call: the context's, or
// c.Namespace.
func (c *ContainerdRegistrar) namespace(ctx context.Context) string {
	if ns, ok := namespaces.Namespace(ctx); ok && ns != "" {
		return ns
	}
	return c.Namespace
}

func (c *ContainerdRegistrar) snapshotter() string {
	if c.Snapshotter == "" {
		return DefaultSnapshotter
	}
	return c.Snapshotter
}

// Register implements Registrar, in the context's containerd namespace (or
// c.Namespace). A containerd socket that does not exist, or that no
// containerd answers on (notAnswering), is ErrContainerdAbsent: the name
// is registered later, from the start, so what was written is redone. An image of that
// name this daemon did not create is refused before anything is written
// (ErrForeignImage) unless replace; an image is repointed with every label
// it has kept. The name is created or repointed only once containerd has
// adopted every chain of the image: a registration that fails leaves no
// name, and leaves a name that was there as it was.
func (c *ContainerdRegistrar) Register(ctx context.Context, ref string, diffIDs []string, replace bool) (err error) {
	defer func() {
		if notAnswering(err) {
			err = fmt.Errorf("register %s: containerd at %s does not answer (%v): %w", ref, c.Address, err, ErrContainerdAbsent)
		}
	}()
	if len(diffIDs) == 0 {
		return fmt.Errorf("register %s: an image needs at least one layer: %w", ref, errdefs.ErrInvalidArgument)
	}
	cl, err := c.client(ctx, ref)
	if err != nil {
		return err
	}
	if cl == nil {
		return fmt.Errorf("register %s: %s: %w", ref, c.Address, ErrContainerdAbsent)
	}
	defer cl.Close()
	ns := c.namespace(ctx)
	ctx = namespaces.WithNamespace(ctx, ns)
	is := cl.ImageService()
	if err := checkOwner(ctx, is, ns, ref, replace); err != nil {
		return err
	}
	// The lease keeps what is written here from containerd's garbage
	// collector until the image refers to all of it.
	ctx, done, err := cl.WithLease(ctx, leases.WithExpiration(time.Hour))
	if err != nil {
		return fmt.Errorf("register %s: lease: %w", ref, err)
	}
	defer func() {
		if err := done(context.WithoutCancel(ctx)); err != nil {
			log.G(ctx).WithError(err).WithField("ref", ref).Warn("register: releasing the lease")
		}
	}()

	st := containerdStores{images: is, content: cl.ContentStore(), snapshots: cl.SnapshotService(c.snapshotter())}
	return register(ctx, st, c.snapshotter(), ns, ref, diffIDs, replace)
}

// containerdStores is what a registration writes to in one containerd
// namespace: its image store, content store and the snapshot service of our
// snapshotter (containerd's metadata store over our proxy plugin).
type containerdStores struct {
	images    images.Store
	content   content.Store
	snapshots snapshots.Snapshotter
}

// registeredImage is what register writes for an image: its OCI config
// and manifest (bytes and descriptors) and its chain IDs, bottom first.
type registeredImage struct {
	cfgRaw, manRaw   []byte
	cfgDesc, manDesc ocispec.Descriptor
	chain            []digest.Digest
}

// imageFor builds the config and manifest register writes for the layers
// diffIDs: the same diff IDs give the same bytes, so the manifest digest
// says whether an image in containerd is the one register would make.
func imageFor(ref string, diffIDs []string) (registeredImage, error) {
	if len(diffIDs) == 0 {
		return registeredImage{}, fmt.Errorf("register %s: an image needs at least one layer: %w", ref, errdefs.ErrInvalidArgument)
	}
	diffs := make([]digest.Digest, len(diffIDs))
	layers := make([]ocispec.Descriptor, len(diffIDs))
	for i, d := range diffIDs {
		dg, err := digest.Parse(d)
		if err != nil {
			return registeredImage{}, fmt.Errorf("register %s: layer %d diff id %q: %w", ref, i+1, d, err)
		}
		diffs[i] = dg
		layers[i] = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: dg}
	}
	cfg := ocispec.Image{
		// A layer tarball says nothing of its architecture: the image is
		// taken to be this host's, which is what `ctr run` picks.
		Platform: platforms.DefaultSpec(),
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffs},
		Config:   ocispec.ImageConfig{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
	}
	cfgRaw, err := json.Marshal(cfg)
	if err != nil {
		return registeredImage{}, fmt.Errorf("register %s: config: %w", ref, err)
	}
	cfgDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfgRaw), Size: int64(len(cfgRaw))}
	man := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cfgDesc, Layers: layers}
	manRaw, err := json.Marshal(man)
	if err != nil {
		return registeredImage{}, fmt.Errorf("register %s: manifest: %w", ref, err)
	}
	manDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(manRaw), Size: int64(len(manRaw))}
	return registeredImage{cfgRaw: cfgRaw, manRaw: manRaw, cfgDesc: cfgDesc, manDesc: manDesc, chain: identity.ChainIDs(diffs)}, nil
}

// register writes ref's config and manifest, makes containerd adopt every
// chain under it, and only then names it: the name is created or repointed
// last, so a registration that fails anywhere leaves no name behind (and
// an image of that name that was there stays as it was). What was written
// before the failure is held only by the caller's lease, and containerd's
// garbage collector removes it once the lease ends.
func register(ctx context.Context, st containerdStores, snapshotter, ns, ref string, diffIDs []string, replace bool) error {
	im, err := imageFor(ref, diffIDs)
	if err != nil {
		return err
	}
	top := im.chain[len(im.chain)-1].String()
	cs := st.content
	gcRef := gcRefSnapshot(snapshotter)
	cfgLabels := map[string]string{gcRef: top}
	if err := content.WriteBlob(ctx, cs, "flyio-config-"+im.cfgDesc.Digest.Encoded(), bytes.NewReader(im.cfgRaw), im.cfgDesc, content.WithLabels(cfgLabels)); err != nil {
		return fmt.Errorf("register %s: write config: %w", ref, err)
	}
	// WriteBlob keeps the labels of a blob that exists already.
	if _, err := cs.Update(ctx, content.Info{Digest: im.cfgDesc.Digest, Labels: cfgLabels}, "labels."+gcRef); err != nil {
		return fmt.Errorf("register %s: label config: %w", ref, err)
	}
	gcLabels := map[string]string{"containerd.io/gc.ref.content.config": im.cfgDesc.Digest.String()}
	if err := content.WriteBlob(ctx, cs, "flyio-manifest-"+im.manDesc.Digest.Encoded(), bytes.NewReader(im.manRaw), im.manDesc, content.WithLabels(gcLabels)); err != nil {
		return fmt.Errorf("register %s: write manifest: %w", ref, err)
	}
	if err := adopt(ctx, st.snapshots, im.chain); err != nil {
		return fmt.Errorf("register %s in containerd namespace %s: %w (no image of that name was made or changed)", ref, ns, err)
	}
	if err := putImage(ctx, st.images, ns, ref, im.manDesc, replace); err != nil {
		return err
	}
	log.G(ctx).WithField("ref", ref).WithField("namespace", ns).WithField("snapshotter", snapshotter).WithField("manifest", im.manDesc.Digest).WithField("top_chain", top).Info("image registered in containerd")
	return nil
}

// Check implements Registrar: nil when ref can be registered in the
// context's namespace (or c.Namespace): containerd has no image of that
// name, or one this daemon created, or replace. No containerd socket: nil.
func (c *ContainerdRegistrar) Check(ctx context.Context, ref string, replace bool) error {
	cl, err := c.client(ctx, ref)
	if err != nil || cl == nil {
		return err
	}
	defer cl.Close()
	ns := c.namespace(ctx)
	err = checkOwner(namespaces.WithNamespace(ctx, ns), cl.ImageService(), ns, ref, replace)
	if notAnswering(err) {
		return nil // as with no socket: Register checks again when it answers
	}
	return err
}

// notAnswering reports whether err says that no containerd answers on its
// socket: a socket file left by a containerd that died (connection
// refused), or one not serving yet (gRPC Unavailable). Registration then
// waits for it, as when the socket does not exist.
func notAnswering(err error) bool {
	return err != nil && (errdefs.IsUnavailable(err) || errors.Is(err, syscall.ECONNREFUSED))
}

// Registered implements Registrar: ref exists in containerd (in the
// context's namespace, or c.Namespace), is an image this daemon created,
// targets the manifest Register writes for diffIDs, and containerd knows
// its top chain in our snapshotter. A containerd socket that does not
// exist counts as registered (nothing to register in).
func (c *ContainerdRegistrar) Registered(ctx context.Context, ref string, diffIDs []string) (bool, error) {
	cl, err := c.client(ctx, ref)
	if err != nil {
		return false, err
	}
	if cl == nil {
		return true, nil // no containerd: nothing to register in
	}
	defer cl.Close()
	ns := c.namespace(ctx)
	st := containerdStores{images: cl.ImageService(), snapshots: cl.SnapshotService(c.snapshotter())}
	ok, err := registered(namespaces.WithNamespace(ctx, ns), st, ns, ref, diffIDs)
	if notAnswering(err) {
		return true, nil // as with no socket: nothing answers to register in
	}
	return ok, err
}

// registered says whether namespace ns of st has ref as register would
// leave it for diffIDs: an image of ours whose target is that very
// manifest (an image of ours repointed at another image's manifest, or
// left on an older one, is not), with the top chain known to the snapshot
// service. The manifest digest is computed, not read, so this costs one
// image lookup and one snapshot stat.
func registered(ctx context.Context, st containerdStores, ns, ref string, diffIDs []string) (bool, error) {
	im, err := imageFor(ref, diffIDs)
	if err != nil {
		return false, err
	}
	img, err := st.images.Get(ctx, ref)
	switch {
	case errdefs.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("image %s in containerd namespace %s: %w", ref, ns, err)
	case !ownImage(img) || img.Target.Digest != im.manDesc.Digest:
		return false, nil
	}
	top := im.chain[len(im.chain)-1].String()
	if _, err := st.snapshots.Stat(ctx, top); errdefs.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("chain %s of %s in containerd namespace %s: %w", top, ref, ns, err)
	}
	return true, nil
}

// DefaultSnapshotter is the name containerd knows our proxy plugin by
// ([proxy_plugins.flyio] in its config) unless the config says otherwise.
const DefaultSnapshotter = "flyio"

// gcRefSnapshot is containerd's label by which a content blob keeps a
// snapshot of the snapshotter containerd calls name from the garbage
// collector.
func gcRefSnapshot(name string) string { return "containerd.io/gc.ref.snapshot." + name }

// adopt makes containerd's metadata store record each committed chain
// snapshot (see the comment at the top of this file). A Prepare that
// succeeds means the chain is not committed on our side: the stray
// snapshot is removed again and that is an error.
func adopt(ctx context.Context, sn snapshots.Snapshotter, chain []digest.Digest) error {
	parent := ""
	for i, c := range chain {
		key := fmt.Sprintf("flyio-adopt-%d-%s", i+1, c.Encoded())
		_, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: c.String()}))
		switch {
		case errdefs.IsAlreadyExists(err):
		case err == nil:
			if rerr := sn.Remove(ctx, key); rerr != nil {
				log.G(ctx).WithError(rerr).WithField("key", key).Warn("adopt: removing a stray snapshot")
			}
			return fmt.Errorf("adopt layer %d: chain %s is not a committed snapshot of ours: %w", i+1, c, errdefs.ErrFailedPrecondition)
		default:
			return fmt.Errorf("adopt layer %d (chain %s): %w", i+1, c, err)
		}
		parent = c.String()
	}
	return nil
}
