package pipeline

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// fakeRegistrar is a fake of the containerd side of Registrar: it records
// the names registered and can forget one (`ctr image rm`). A name
// registered in a namespace the context names is keyed "NS|ref"; in the
// registrar's own namespace, "ref". foreign holds images someone else made
// (key → labels): Check and Register refuse their names unless replace,
// which makes them ours with their labels kept (labels).
type fakeRegistrar struct {
	mu        sync.Mutex
	names     map[string][]string          // ref → diff IDs
	registers map[string]int               // ref → Register calls
	foreign   map[string]map[string]string // ref → labels of an image not ours
	labels    map[string]map[string]string // ref → labels of an image taken over
}

func fakeKey(ctx context.Context, ref string) string {
	if ns, ok := namespaces.Namespace(ctx); ok {
		return ns + "|" + ref
	}
	return ref
}

func newFakeRegistrar() *fakeRegistrar {
	return &fakeRegistrar{names: map[string][]string{}, registers: map[string]int{},
		foreign: map[string]map[string]string{}, labels: map[string]map[string]string{}}
}

func (r *fakeRegistrar) Check(ctx context.Context, ref string, replace bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.check(fakeKey(ctx, ref), replace)
}

func (r *fakeRegistrar) check(key string, replace bool) error {
	if l, ok := r.foreign[key]; ok && !replace {
		return fmt.Errorf("register %s: image with labels %v: %w", key, l, ErrForeignImage)
	}
	return nil
}

func (r *fakeRegistrar) Register(ctx context.Context, ref string, diffIDs []string, replace bool) error {
	if len(diffIDs) == 0 {
		return errors.New("register " + ref + ": no layers")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ref = fakeKey(ctx, ref)
	if err := r.check(ref, replace); err != nil {
		return err
	}
	if l, ok := r.foreign[ref]; ok {
		l = maps.Clone(l)
		l[LabelSource] = "pipeline"
		r.labels[ref] = l
		delete(r.foreign, ref)
	}
	r.names[ref] = slices.Clone(diffIDs)
	r.registers[ref]++
	return nil
}

func (r *fakeRegistrar) Registered(ctx context.Context, ref string, diffIDs []string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref = fakeKey(ctx, ref)
	diffs, ok := r.names[ref]
	if _, foreign := r.foreign[ref]; !ok || foreign {
		return false, nil
	}
	return slices.Equal(diffs, diffIDs), nil
}

func (r *fakeRegistrar) unregister(ref string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.names, ref)
}

// Unregister removes ref in every namespace (the foreign images stay).
func (r *fakeRegistrar) Unregister(_ context.Context, ref string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key := range r.names {
		if key == ref || strings.HasSuffix(key, "|"+ref) {
			delete(r.names, key)
		}
	}
	return nil
}

// Namespaces lists the namespaces that have ref ("" for the fake's own).
func (r *fakeRegistrar) Namespaces(_ context.Context, ref string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var nss []string
	for key := range r.names {
		if key == ref {
			nss = append(nss, "")
		} else if ns, ok := strings.CutSuffix(key, "|"+ref); ok {
			nss = append(nss, ns)
		}
	}
	slices.Sort(nss)
	return nss, nil
}

// registeredTop is the top chain ref is registered with ("" if none).
func (r *fakeRegistrar) registeredTop(ref string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	chain := ""
	for _, d := range r.names[ref] {
		chain = ChainID(chain, d)
	}
	return chain
}

func (r *fakeRegistrar) calls(ref string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registers[ref]
}

// newPullEnv is an environment whose pipelines unpack and activate on a
// faultSnapshots (the real snapshotter on a fake pool), registering with
// reg when it is not nil.
func newPullEnv(t *testing.T, reg *fakeRegistrar) *env {
	t.Helper()
	return newPullEnvWith(t, reg, nil)
}

// newPullEnvWith is newPullEnv with the options changed by configure too.
func newPullEnvWith(t *testing.T, reg *fakeRegistrar, configure func(*Options)) *env {
	t.Helper()
	var sn *faultSnapshots
	e := newEnvWith(t, func(_ *env, o *Options) {
		sn = newFaultSnapshots(t, o.DB)
		o.Snapshots, o.ThinExists = sn, sn.ThinExists
		if reg != nil {
			o.Registrar = reg
		}
		if configure != nil {
			configure(o)
		}
	})
	e.sn = sn
	sn.attach(e.p)
	return e
}

// newRegisteringPullEnv is newPullEnv registering with a new fake
// registrar, returned for the test to look at what was registered.
func newRegisteringPullEnv(t *testing.T) (*env, *fakeRegistrar) {
	t.Helper()
	reg := newFakeRegistrar()
	return newPullEnv(t, reg), reg
}

// reopen starts other pipelines on the environment's database, directory
// and snapshotter (a restarted daemon), with hooks, and resumes them.
func (e *env) reopen(hooks map[string]func()) *Pipelines {
	e.t.Helper()
	ctx := context.Background()
	opts := e.options()
	opts.Snapshots, opts.ThinExists, opts.Registrar = e.p.opts.Snapshots, e.p.opts.ThinExists, e.p.opts.Registrar
	p, err := New(ctx, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Close(ctx)
	})
	e.sn.attach(p)
	p.hooks = hooks
	if err := p.Resume(ctx); err != nil {
		e.t.Fatalf("resume: %v", err)
	}
	return p
}

func (e *env) pull(key, ref string) (*api.PullResult, error) {
	return e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: key, Ref: ref})
}

func (e *env) pullReq(req api.PullRequest) (*api.PullResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return e.p.Pull(ctx, req, nil)
}

func (e *env) mustPull(key, ref string) *api.PullResult {
	e.t.Helper()
	res, err := e.pull(key, ref)
	if err != nil {
		e.t.Fatalf("pull %s as %q: %v", key, ref, err)
	}
	return res
}

// checkNoWorkSince notes the runs started and the snapshotter calls made
// so far; the function it returns fails the test if a run was started or a
// snapshotter call made since, naming the step in what.
func (e *env) checkNoWorkSince(what string) func() {
	runs, calls := e.runCount(), e.sn.totalCalls()
	return func() {
		e.t.Helper()
		if n := e.runCount() - runs; n != 0 {
			e.t.Errorf("%s started %d runs, want none", what, n)
		}
		if n := e.sn.totalCalls() - calls; n != 0 {
			e.t.Errorf("%s made %d snapshotter calls, want none", what, n)
		}
	}
}

// layerTar is a layer with the canonical layout whose etc/marker says
// marker, padded with pad bytes (same marker length and pad: same size),
// and extra entries.
func layerTar(t testing.TB, marker string, pad int, extra ...tarFile) []byte {
	body := bytes.Repeat([]byte(marker[:1]), pad)
	files := []tarFile{
		{name: "etc/", typ: tar.TypeDir}, {name: "usr/", typ: tar.TypeDir}, {name: "var/", typ: tar.TypeDir},
		{name: "etc/marker", body: []byte(marker)}, {name: "usr/pad.bin", body: body},
	}
	return buildTar(t, append(files, extra...))
}

// committedChains lists the chain snapshots the pipelines committed.
func (e *env) committedChains() []string {
	e.t.Helper()
	var out []string
	for k, r := range e.sn.list(e.t) {
		if r.Kind == snapshotter.SnapKindCommitted && r.Labels[LabelSource] != "" {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func (e *env) runCount() int {
	e.t.Helper()
	runs, err := fsm.NewSQLiteStore(e.db).ListRuns(context.Background(), fsm.RunFilter{})
	if err != nil {
		e.t.Fatal(err)
	}
	return len(runs)
}

// TestPullOverwrittenObject: an object overwritten in S3 (same size, then
// another size) is downloaded again by the next pull and makes a new chain,
// which the image's activation shows; an unchanged re-pull asks S3 once
// (one LIST) and reads nothing more, and --cached asks S3 nothing.
func TestPullOverwrittenObject(t *testing.T) {
	e := newPullEnv(t, nil)
	v1 := layerTar(t, "v1", 4000)
	e.srv.Put(t, "app/1.tar", v1)
	r1 := e.mustPull("app/", "app")
	if r1.Downloaded != 1 || r1.Unpacked != 1 || r1.Layers[0].DiffID != sha(v1) || r1.TopChainID != sha(v1) {
		t.Fatalf("first pull: %+v", r1)
	}
	if got := e.sn.readFile(t, r1.Snapshot.SnapshotName, "etc/marker"); got != "v1" {
		t.Fatalf("activation shows marker %q, want v1", got)
	}

	e.srv.Faults.Reset()
	checkNoWork := e.checkNoWorkSince("unchanged re-pull")
	again := e.mustPull("app/", "app")
	if again.TopChainID != r1.TopChainID || again.Downloaded != 0 || again.Unpacked != 0 {
		t.Errorf("unchanged re-pull: %+v", again)
	}
	if n, list := e.srv.TotalRequests(), e.srv.Requests("GET", ""); n != 1 || list != 1 {
		t.Errorf("unchanged re-pull made %d S3 requests (%d LISTs), want exactly one LIST", n, list)
	}
	checkNoWork()

	e.srv.Faults.Reset()
	cached, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "app/", Ref: "app", Cached: true})
	if err != nil || cached.TopChainID != r1.TopChainID {
		t.Fatalf("cached pull: %+v, %v", cached, err)
	}
	if _, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "never/", Cached: true}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("cached pull of an image never pulled: %v, want not found", err)
	}
	if n := e.srv.TotalRequests(); n != 0 {
		t.Errorf("cached pulls made %d S3 requests, want none", n)
	}

	// Overwritten with the same size: only the ETag tells.
	v2 := layerTar(t, "v2", 4000)
	if len(v2) != len(v1) || bytes.Equal(v1, v2) {
		t.Fatal("test data: v2 must differ from v1 with the same size")
	}
	e.srv.Put(t, "app/1.tar", v2)
	r2 := e.mustPull("app/", "app")
	if r2.Downloaded != 1 || r2.TopChainID != sha(v2) || r2.TopChainID == r1.TopChainID {
		t.Fatalf("pull after an overwrite of the same size: %+v; want a download and the chain %s", r2, sha(v2))
	}
	if got := e.sn.readFile(t, r2.Snapshot.SnapshotName, "etc/marker"); got != "v2" {
		t.Errorf("after an overwrite of the same size the activation shows %q, want v2", got)
	}
	// Overwritten with another size.
	v3 := layerTar(t, "v3", 9000)
	e.srv.Put(t, "app/1.tar", v3)
	r3 := e.mustPull("app/", "app")
	if r3.Downloaded != 1 || r3.TopChainID != sha(v3) {
		t.Fatalf("pull after an overwrite of another size: %+v", r3)
	}
	if got := e.sn.readFile(t, r3.Snapshot.SnapshotName, "etc/marker"); got != "v3" {
		t.Errorf("after an overwrite of another size the activation shows %q, want v3", got)
	}
	if c, err := RecordsOf(e.db).GetChain(context.Background(), r3.TopChainID); err != nil || c == nil || c.DiffID != sha(v3) {
		t.Errorf("chain record of the new layer: %+v, %v", c, err)
	}
	if n, err := RecordsOf(e.db).LiveRuns(context.Background()); err != nil || n != 0 || len(e.sn.extractions(t)) != 0 {
		t.Errorf("after the pulls: %d live runs (%v), extraction snapshots %v", n, err, e.sn.extractions(t))
	}
}

// etagLiar is an S3-compatible server that claims ETag for the objects
// under paths: it answers every request for them with that ETag and
// ignores If-Match (it believes its own claim).
type etagLiar struct {
	etag  string
	paths []string // "/bucket/key"
	next  http.RoundTripper
}

func (l etagLiar) RoundTrip(r *http.Request) (*http.Response, error) {
	lie := slices.Contains(l.paths, r.URL.Path)
	if lie {
		r = r.Clone(r.Context())
		r.Header.Del("If-Match")
	}
	resp, err := l.next.RoundTrip(r)
	if err == nil && lie && resp.Header.Get("ETag") != "" {
		resp.Header.Set("ETag", l.etag)
	}
	return resp, err
}

// putObject uploads data as bucket/key through the S3 API.
func (e *env) putObject(bucket, key string, data []byte) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPut, e.srv.URL+"/"+bucket+"/"+key, bytes.NewReader(data))
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("put s3://%s/%s: %s", bucket, key, resp.Status)
	}
}

// TestPullObjectDeletedBetweenListAndGet: an image republished between
// the pull's LIST and its GET of a layer (`aws s3 sync --delete`: 2.tar
// removed, 3.tar added) is listed again and pulled as S3 lists it now,
// like an overwrite there, with no failure recorded on the image. An
// object S3 keeps listing while its GET says it does not exist fails the
// pull after one more GET, naming the object and the rule.
func TestPullObjectDeletedBetweenListAndGet(t *testing.T) {
	ctx := context.Background()
	t.Run("republished", func(t *testing.T) {
		e := newPullEnv(t, nil)
		e.srv.Put(t, "pub/1.tar", layerTar(t, "one", 300))
		e.srv.Put(t, "pub/2.tar", layerTar(t, "two", 300, tarFile{name: "usr/two", body: []byte("2")}))
		e.srv.Faults.BeforeGet("pub/2.tar", "", func() {
			e.srv.Delete(t, "pub/2.tar")
			e.srv.Put(t, "pub/3.tar", layerTar(t, "three", 300, tarFile{name: "usr/three", body: []byte("3")}))
		})
		res, err := e.pull("pub/", "pub")
		if err != nil {
			t.Fatalf("pull of an image republished between LIST and GET: %v", err)
		}
		if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "three" {
			t.Errorf("image shows %q, want three", got)
		}
		layers, err := RecordsOf(e.db).imageLayers(ctx, res.ImageID)
		if err != nil || len(layers) != 2 || layers[0].Key != "pub/1.tar" || layers[1].Key != "pub/3.tar" {
			t.Errorf("image layers %+v, %v; want pub/1.tar and pub/3.tar", layers, err)
		}
		if img, err := RecordsOf(e.db).GetImage(ctx, res.ImageID); err != nil || img == nil || img.FailureReason != "" {
			t.Errorf("image record %+v, %v; want no failure", img, err)
		}
	})
	t.Run("listed but not found", func(t *testing.T) {
		e := newPullEnv(t, nil)
		e.srv.Put(t, "nf/1.tar", layerTar(t, "one", 300))
		e.srv.Put(t, "nf/2.tar", layerTar(t, "two", 300))
		e.srv.Faults.FailNext(100, "nf/2.tar", http.StatusNotFound, "NoSuchKey")
		_, err := e.pull("nf/", "nf")
		if err == nil || !strings.Contains(err.Error(), S3URL(e.srv.Bucket, "nf/2.tar")+" is listed in S3 but its GET says it does not exist") {
			t.Fatalf("pull of an image whose listed object GET never finds: %v; want the object and the rule named", err)
		}
		if n := e.srv.Requests(http.MethodGet, "nf/2.tar"); n != 2 {
			t.Errorf("GETs of the object: %d, want 2 (one more after listing again)", n)
		}
		e.assertNoExtraction()
	})
}

// TestPullPoisonedETag: an object listed (by another bucket, or under
// another key of the same bucket) with the ETag and size of an object
// already downloaded gets its own bytes: its chain is the SHA-256 of what
// it serves, and the first image still shows its own.
func TestPullPoisonedETag(t *testing.T) {
	// The SDK refuses a custom HTTP client when a CA bundle is configured
	// from the environment; this server is plain HTTP.
	t.Setenv("AWS_CA_BUNDLE", "")
	liar := &etagLiar{next: http.DefaultTransport}
	var sn *faultSnapshots
	e := newEnvWith(t, func(e *env, o *Options) {
		sn = newFaultSnapshots(t, o.DB)
		o.Snapshots, o.ThinExists = sn, sn.ThinExists
		o.Sources = func(ctx context.Context, bucket string) (*s3source.Source, error) {
			return s3source.New(ctx, s3source.Config{Bucket: bucket, Region: "us-east-1", Endpoint: e.srv.URL, PathStyle: true,
				Anonymous: true, HTTPClient: &http.Client{Transport: liar}})
		}
	})
	e.sn = sn
	sn.attach(e.p)
	good := layerTar(t, "good", 3000)
	evil := layerTar(t, "evil", 3000)
	evil2 := layerTar(t, "EVIL", 3000)
	if len(good) != len(evil) || len(good) != len(evil2) {
		t.Fatal("test data: the layers must have one size")
	}
	e.srv.Put(t, "a/1.tar", good)
	first := e.mustPull("a/1.tar", "good")
	obj, err := RecordsOf(e.db).ObjectRecord(context.Background(), e.srv.Bucket, "a/1.tar")
	if err != nil || obj == nil || obj.ETag == "" {
		t.Fatalf("object record: %+v, %v", obj, err)
	}

	e.srv.CreateBucket(t, "other")
	e.putObject("other", "a/1.tar", evil)
	e.srv.Put(t, "b/1.tar", evil2)
	liar.etag, liar.paths = obj.ETag, []string{"/other/a/1.tar", "/" + e.srv.Bucket + "/b/1.tar"}

	for _, c := range []struct {
		bucket, key string
		data        []byte
	}{{"other", "a/1.tar", evil}, {e.srv.Bucket, "b/1.tar", evil2}} {
		res, err := e.pullReq(api.PullRequest{Bucket: c.bucket, Key: c.key, Ref: c.bucket + "-" + c.key})
		if err != nil {
			t.Fatalf("pull s3://%s/%s: %v", c.bucket, c.key, err)
		}
		// The lie was told: the object is recorded as listed with the
		// stored object's ETag and size.
		if o, err := RecordsOf(e.db).ObjectRecord(context.Background(), c.bucket, c.key); err != nil || o == nil || o.ETag != obj.ETag || o.SizeBytes != obj.SizeBytes {
			t.Errorf("s3://%s/%s recorded as %+v (%v), want listed with ETag %s and size %d", c.bucket, c.key, o, err, obj.ETag, obj.SizeBytes)
		}
		if res.Downloaded != 1 || res.Layers[0].DiffID != sha(c.data) || res.TopChainID != sha(c.data) {
			t.Errorf("s3://%s/%s claiming a stored ETag and size: downloaded %d, diff %s; want its own bytes (%s)",
				c.bucket, c.key, res.Downloaded, res.Layers[0].DiffID, sha(c.data))
		}
		if got, want := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"), markerOf(c.data); got != want {
			t.Errorf("s3://%s/%s: its image shows marker %q, want %q", c.bucket, c.key, got, want)
		}
	}
	if got := e.sn.readFile(t, first.Snapshot.SnapshotName, "etc/marker"); got != "good" {
		t.Errorf("the first image shows %q after the poisoned pulls, want good", got)
	}
}

// markerOf is the etc/marker of a layerTar.
func markerOf(data []byte) string {
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err != nil {
			return ""
		}
		if h.Name == "etc/marker" {
			var b bytes.Buffer
			b.ReadFrom(tr)
			return b.String()
		}
	}
}

// TestPullSameContentUnpackedOnce: identical content under another key is
// downloaded (its listing proves nothing of its bytes) but recognised once
// hashed: one layer file, one chain.
func TestPullSameContentUnpackedOnce(t *testing.T) {
	e := newPullEnv(t, nil)
	data := layerTar(t, "same", 2000)
	e.srv.Put(t, "x/1.tar", data)
	e.srv.Put(t, "y/1.tar", data)
	a := e.mustPull("x/1.tar", "x")
	b := e.mustPull("y/1.tar", "y")
	if b.TopChainID != a.TopChainID || b.Unpacked != 0 || a.Unpacked != 1 {
		t.Errorf("same content under two keys: chains %s and %s, unpacked %d then %d; want one chain unpacked once",
			a.TopChainID, b.TopChainID, a.Unpacked, b.Unpacked)
	}
	if chains := e.committedChains(); len(chains) != 1 {
		t.Errorf("committed chains %v, want one", chains)
	}
	if files, err := os.ReadDir(e.p.opts.blobDir()); err != nil || len(files) != 1 {
		t.Errorf("layer files %v (%v), want one", files, err)
	}
}

// TestPullOneKeyInTwoChains: a key pulled on its own and as the second
// layer of its prefix is two chains (its chain depends on what is under
// it); both pulls succeed, in either order, and each image shows its own
// tree.
func TestPullOneKeyInTwoChains(t *testing.T) {
	e := newPullEnv(t, nil)
	base := layerTar(t, "base", 1000, tarFile{name: "etc/base-only", body: []byte("from layer 1")})
	top := layerTar(t, "top", 1000)
	e.srv.Put(t, "a/1.tar", base)
	e.srv.Put(t, "a/2.tar", top)
	alone := e.mustPull("a/2.tar", "alone")
	whole := e.mustPull("a/", "whole")
	e.srv.Faults.Reset()
	again := e.mustPull("a/2.tar", "alone")
	if n, head := e.srv.TotalRequests(), e.srv.Requests("HEAD", "a/2.tar"); n != 1 || head != 1 || again.Downloaded != 0 {
		t.Errorf("unchanged re-pull of a key: %d S3 requests (%d HEADs), downloaded %d; want exactly one HEAD", n, head, again.Downloaded)
	}
	if alone.TopChainID != sha(top) || again.TopChainID != sha(top) {
		t.Errorf("a/2.tar alone: chain %s then %s, want %s", alone.TopChainID, again.TopChainID, sha(top))
	}
	if want := ChainID(sha(base), sha(top)); whole.TopChainID != want || len(whole.Layers) != 2 {
		t.Errorf("a/: top chain %s with %d layers, want %s with 2", whole.TopChainID, len(whole.Layers), want)
	}
	if got := e.sn.readFile(t, whole.Snapshot.SnapshotName, "etc/base-only"); got != "from layer 1" {
		t.Errorf("a/ shows etc/base-only %q", got)
	}
	if got := e.sn.readFile(t, alone.Snapshot.SnapshotName, "etc/marker"); got != "top" {
		t.Errorf("a/2.tar shows marker %q", got)
	}
	if chains := e.committedChains(); len(chains) != 3 {
		t.Errorf("committed chains %v, want 3 (base, top alone, top on base)", chains)
	}
}

// TestPullNames: every name a pull is asked for is recorded and registered:
// a second name of an image already pulled, a name unregistered behind our
// back (`ctr image rm`) pulled again, and two names pulled at once.
func TestPullNames(t *testing.T) {
	e, reg := newRegisteringPullEnv(t)
	ctx := context.Background()
	e.srv.Put(t, "n/1.tar", layerTar(t, "names", 1000))
	a := e.mustPull("n/", "a")
	if reg.registeredTop("a") != a.TopChainID || !a.Snapshot.Registered {
		t.Fatalf("A: registered with %q, result %+v", reg.registeredTop("a"), a.Snapshot)
	}
	runs := e.runCount()
	b := e.mustPull("n/", "b")
	if reg.registeredTop("b") != a.TopChainID || b.TopChainID != a.TopChainID {
		t.Errorf("a second name: B registered with %q, want %s", reg.registeredTop("b"), a.TopChainID)
	}
	if n := e.runCount() - runs; n != 0 {
		t.Errorf("a second name of an unchanged image started %d runs", n)
	}
	names, err := RecordsOf(e.db).imageNames(ctx, a.ImageID)
	if err != nil || !slices.Contains(names, "a") || !slices.Contains(names, "b") {
		t.Errorf("names of the image: %v, %v; want A and B", names, err)
	}

	reg.unregister("b")
	e.mustPull("n/", "b")
	if reg.registeredTop("b") != a.TopChainID || reg.calls("b") != 2 {
		t.Errorf("B pulled again after it was removed from containerd: registered %q, %d Register calls; want it registered again",
			reg.registeredTop("b"), reg.calls("b"))
	}
	if reg.calls("a") != 1 {
		t.Errorf("A registered %d times, want once", reg.calls("a"))
	}

	e.srv.Put(t, "c/1.tar", layerTar(t, "concurrent", 1000))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	res := make([]*api.PullResult, 2)
	for i, ref := range []string{"c1", "c2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = e.pull("c/", ref)
		}()
	}
	wg.Wait()
	for i, ref := range []string{"c1", "c2"} {
		if errs[i] != nil {
			t.Fatalf("concurrent pull as %s: %v", ref, errs[i])
		}
		if reg.registeredTop(ref) != res[i].TopChainID {
			t.Errorf("concurrent pull as %s: registered with %q, want %s", ref, reg.registeredTop(ref), res[i].TopChainID)
		}
	}
	names, err = RecordsOf(e.db).imageNames(ctx, res[0].ImageID)
	if err != nil || !slices.Contains(names, "c1") || !slices.Contains(names, "c2") {
		t.Errorf("names after concurrent pulls: %v, %v; want C1 and C2", names, err)
	}
}

// TestPullAbortLeavesNothing: an unpack that ends without its chain leaves
// no extraction snapshot nor mount point, on an abort (a layout the policy
// rejects) and when its attempts are used up (the snapshotter cannot mount
// the extraction); the image records why.
func TestPullAbortLeavesNothing(t *testing.T) {
	ctx := context.Background()
	t.Run("layout rejected", func(t *testing.T) {
		e := newPullEnv(t, nil)
		e.srv.Put(t, "bad/1.tar", buildTar(t, []tarFile{{name: "etc/", typ: tar.TypeDir}, {name: "usr/", typ: tar.TypeDir}, {name: "etc/x", body: []byte("x")}}))
		_, err := e.pull("bad/", "bad")
		if err == nil || !strings.Contains(err.Error(), "var") {
			t.Fatalf("pull of an image without var/: %v, want a layout error naming var", err)
		}
		e.assertNoExtraction()
		_, imageID := imageSource(e.srv.Bucket, "bad/")
		if img, err := RecordsOf(e.db).GetImage(ctx, imageID); err != nil || img == nil || !strings.Contains(img.FailureReason, "var") {
			t.Errorf("image record: %+v, %v; want the layout failure", img, err)
		}
	})
	t.Run("attempts used up", func(t *testing.T) {
		e := newPullEnv(t, nil)
		// The unpack run mounts its extraction in each of its 2 attempts.
		e.checkExtractionFaultLeavesNothing("m/", "injected: cannot activate the device", 2, func(fault func(key string) error) {
			e.sn.mountsErr = fault
		})
	})
}

// TestPullPrepareFailsLeavesNothing: an extraction device the snapshotter
// cannot make fails the pull with the reason after its attempts, and
// leaves nothing behind.
func TestPullPrepareFailsLeavesNothing(t *testing.T) {
	e := newPullEnv(t, nil)
	// create-device prepares the extraction in each of its 3 attempts.
	e.checkExtractionFaultLeavesNothing("p/", "injected: pool busy", 3, func(fault func(key string) error) {
		e.sn.prepareErr = func(key, _ string) error { return fault(key) }
	})
	if chains := e.committedChains(); len(chains) != 0 {
		t.Errorf("chains committed: %v", chains)
	}
}

// checkExtractionFaultLeavesNothing pulls a one-layer image stored under
// prefix while one snapshotter call fails on every extraction with the
// error msg: install puts fault in place of that call. The pull must fail
// with msg once the run retrying the call has made its wantAttempts
// attempts, and leave nothing behind.
func (e *env) checkExtractionFaultLeavesNothing(prefix, msg string, wantAttempts int, install func(fault func(key string) error)) {
	e.t.Helper()
	attempts := 0
	install(func(key string) error {
		if !strings.HasPrefix(key, extractPrefix) {
			return nil
		}
		// The extraction while downloading fails alike, and is not an
		// attempt of the run that retries the call.
		if !strings.HasPrefix(key, streamPrefix) {
			attempts++
		}
		return errors.New(msg)
	})
	name := strings.TrimSuffix(prefix, "/")
	e.srv.Put(e.t, prefix+"1.tar", layerTar(e.t, name, 100))
	if _, err := e.pull(prefix, name); err == nil || !strings.Contains(err.Error(), msg) {
		e.t.Fatalf("pull whose extractions fail with %q: %v", msg, err)
	}
	if attempts != wantAttempts {
		e.t.Errorf("the failing call was made on the extraction %d times, want the run's %d attempts", attempts, wantAttempts)
	}
	e.assertNoExtraction()
}

// assertNoExtraction: no extraction snapshot, no live run, no mount point.
func (e *env) assertNoExtraction() {
	e.t.Helper()
	if x := e.sn.extractions(e.t); len(x) != 0 {
		e.t.Errorf("extraction snapshots left: %v", x)
	}
	if n, err := RecordsOf(e.db).LiveRuns(context.Background()); err != nil || n != 0 {
		e.t.Errorf("live runs left: %d, %v", n, err)
	}
	if m, _ := filepath.Glob(filepath.Join(e.p.opts.MountDir, "*")); len(m) != 0 {
		e.t.Errorf("mount points left: %v", m)
	}
}

// TestPullNamesFollowAnOverwrite: two names of one image pulled at once
// after its object was overwritten both end registered with the new
// layers. The second pull joins the first one's runs (one activation run,
// which registers the first name): it must still register its own name
// with what was pulled.
func TestPullNamesFollowAnOverwrite(t *testing.T) {
	e, reg := newRegisteringPullEnv(t)
	ctx := context.Background()
	e.srv.Put(t, "o/1.tar", layerTar(t, "o1", 1000))
	first := e.mustPull("o/", "a")
	e.mustPull("o/", "b")
	v2 := layerTar(t, "o2", 1000)
	e.srv.Put(t, "o/1.tar", v2)

	// A's extraction waits until B has joined A's runs.
	reached, release := make(chan struct{}, 1), make(chan struct{})
	e.p.hooks = map[string]func(){"extract:started": func() { reached <- struct{}{}; <-release }}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	pull := func(i int, ref string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.pull("o/", ref)
		}()
	}
	pull(0, "a")
	<-reached
	downloads := func() int {
		runs, err := fsm.NewSQLiteStore(e.db).ListRuns(ctx, fsm.RunFilter{FSM: api.FSMDownload, States: []fsm.State{fsm.StateComplete}})
		if err != nil {
			t.Fatal(err)
		}
		return len(runs)
	}
	before := downloads()
	pull(1, "b")
	for deadline := time.Now().Add(30 * time.Second); downloads() == before; {
		if time.Now().After(deadline) {
			t.Fatal("B's download run never completed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// B's download is done: it joins the live unpack and activation runs
	// with two database reads.
	time.Sleep(200 * time.Millisecond)
	close(release)
	wg.Wait()
	for i, ref := range []string{"a", "b"} {
		if errs[i] != nil {
			t.Fatalf("pull as %s after the overwrite: %v", ref, errs[i])
		}
		if got := reg.registeredTop(ref); got != sha(v2) {
			t.Errorf("after the overwrite %s is registered with %s (the first pull's chain: %s), want the new chain %s", ref, got, first.TopChainID, sha(v2))
		}
	}
}

// TestPullJoiningAnotherVersionsActivationActivatesItsOwn: two pulls of
// one source straddle an overwrite in S3. The second lists the new
// version, downloads and unpacks it while the first pull's activate run
// (of the old version; one live activate run per image) is still
// registering. The second pull waits for that run to end and activates
// its own version: it reports the new top chain, and the image's
// activation, its records and its name in containerd are that version.
func TestPullJoiningAnotherVersionsActivationActivatesItsOwn(t *testing.T) {
	ctx := context.Background()
	e, reg := newRegisteringPullEnv(t)
	v1 := layerTar(t, "v1", 4000)
	v2 := layerTar(t, "v2", 4000)
	e.srv.Put(t, "app/1.tar", v1)

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.p.hooks = map[string]func(){"register:started": func() {
		first := false
		once.Do(func() { first = true })
		if first {
			close(entered)
			<-release
		}
	}}
	var (
		r1, r2     *api.PullResult
		err1, err2 error
		wg         sync.WaitGroup
	)
	wg.Add(1)
	go func() { defer wg.Done(); r1, err1 = e.pull("app/", "app") }()
	<-entered // the first pull's activate run (v1) is registering

	e.srv.Put(t, "app/1.tar", v2)
	wg.Add(1)
	go func() { defer wg.Done(); r2, err2 = e.pull("app/", "app2") }()
	// The second pull unpacks v2, then starts its activate run while the
	// first one is live.
	unpackedV2 := func() int {
		runs, err := fsm.NewSQLiteStore(e.db).ListRuns(ctx, fsm.RunFilter{FSM: api.FSMUnpack, States: []fsm.State{fsm.StateComplete}})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range runs {
			if r.IdempotencyID == sha(v2) {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(20 * time.Second); unpackedV2() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			close(release)
			wg.Wait()
			t.Fatalf("the second pull never unpacked v2 (its error: %v)", err2)
		}
	}
	time.Sleep(300 * time.Millisecond) // it starts (joins) the activate run
	close(release)
	wg.Wait()
	if err1 != nil || r1.TopChainID != sha(v1) {
		t.Fatalf("first pull: %+v, %v; want v1 (%s)", r1, err1, sha(v1))
	}
	if err2 != nil {
		t.Fatalf("second pull: %v", err2)
	}
	if r2.TopChainID != sha(v2) {
		t.Errorf("second pull reports top %s, want v2 %s", r2.TopChainID, sha(v2))
	}
	if got := e.sn.readFile(t, r2.Snapshot.SnapshotName, "etc/marker"); got != "v2" {
		t.Errorf("after the second pull the activation %s shows %q, want v2", r2.Snapshot.SnapshotName, got)
	}
	layers, err := RecordsOf(e.db).imageLayers(ctx, r2.ImageID)
	if err != nil || len(layers) != 1 || layers[0].ChainID != sha(v2) {
		t.Errorf("image layers after the second pull: %+v, %v; want v2 %s", layers, err, sha(v2))
	}
	if got := reg.registeredTop("app2"); got != sha(v2) {
		t.Errorf("containerd's app2 is on %s, want v2 %s", got, sha(v2))
	}
}

// TestPullCachedAfterS3Outage: a pull that fails because S3 cannot be
// reached leaves the image it had pulled before usable: `pull --cached`
// (what one runs while S3 is down) still answers from the records.
func TestPullCachedAfterS3Outage(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "s/1.tar", layerTar(t, "s", 500))
	first := e.mustPull("s/", "s")
	e.srv.Faults.FailNext(100, "", http.StatusServiceUnavailable, "ServiceUnavailable")
	if _, err := e.pull("s/", "s"); err == nil {
		t.Fatal("pull with S3 down succeeded")
	}
	res, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "s/", Ref: "s", Cached: true})
	if err != nil {
		t.Fatalf("pull --cached of an image in place after a failed pull: %v", err)
	}
	if res.TopChainID != first.TopChainID {
		t.Errorf("cached pull: %+v", res)
	}
}

// TestPullRefusedVersionKeepsImageInPlace: an image pulled and in place
// whose object is overwritten in S3 by a version that cannot be activated
// (its layout refused, or the pool too full for one more device) fails
// the pull of that version, and the image as pulled before stays usable:
// its activation, device and content, its records and its name in
// containerd, `pull --cached`. No verification view is left. A good
// version pulled next replaces the activation, labelled verified.
func TestPullRefusedVersionKeepsImageInPlace(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		next    func(t *testing.T) []byte
		install func(e *env)
		want    string
	}{
		{name: "layout refused", next: noVarTar, want: "var"},
		{name: "pool full", next: func(t *testing.T) []byte { return layerTar(t, "next", 500) },
			install: func(e *env) {
				full := func(key, _ string) error {
					if strings.HasPrefix(key, metadata.ActivationPrefix) || strings.HasPrefix(key, verifyPrefix) {
						return fmt.Errorf("injected: %w", thinpool.ErrPoolFull)
					}
					return nil
				}
				e.sn.prepareErr, e.sn.viewErr = full, full
			}, want: "injected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, reg := newRegisteringPullEnv(t)
			e.srv.Put(t, "w/1.tar", layerTar(t, "good", 500))
			first := e.mustPull("w/", "w")
			e.srv.Put(t, "w/1.tar", tc.next(t))
			if tc.install != nil {
				tc.install(e)
			}
			if _, err := e.pull("w/", "w"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("pull of a version that cannot be activated: %v, want an error naming %q", err, tc.want)
			}
			e.sn.prepareErr, e.sn.viewErr = nil, nil
			act := first.Snapshot.SnapshotName
			if ok, err := e.sn.Exists(ctx, act); err != nil || !ok {
				t.Fatalf("after the failed pull the activation %s of the image in place exists=%v (%v)", act, ok, err)
			}
			if _, path, _, err := e.sn.DeviceOf(ctx, act); err != nil || path != first.Snapshot.DevicePath {
				t.Errorf("activation device %s (%v), was %s", path, err, first.Snapshot.DevicePath)
			}
			if got := e.sn.readFile(t, act, "etc/marker"); got != "good" {
				t.Errorf("activation shows %q, want good", got)
			}
			res, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "w/", Ref: "w", Cached: true})
			if err != nil || res.TopChainID != first.TopChainID {
				t.Errorf("pull --cached after the failed pull: %+v, %v; want the image in place (%s)", res, err, first.TopChainID)
			}
			layers, err := RecordsOf(e.db).imageLayers(ctx, first.ImageID)
			if err != nil || len(layers) != 1 || layers[0].ChainID != first.TopChainID {
				t.Errorf("image layers after the failed pull: %+v, %v; want the chain pulled before", layers, err)
			}
			if got := reg.registeredTop("w"); got != first.TopChainID {
				t.Errorf("containerd's w is on %s, want %s", got, first.TopChainID)
			}
			if ok, err := e.sn.Exists(ctx, verifyKey(first.ImageID)); err != nil || ok {
				t.Errorf("verification view left: %v, %v", ok, err)
			}
			e.assertNoExtraction()

			next := layerTar(t, "next2", 500)
			e.srv.Put(t, "w/1.tar", next)
			res = e.mustPull("w/", "w")
			if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "next2" || res.TopChainID != sha(next) {
				t.Errorf("pull of a good version after: top %s, activation shows %q", res.TopChainID, got)
			}
			if info, err := e.sn.Stat(ctx, res.Snapshot.SnapshotName); err != nil || info.Labels[LabelLayoutVerified] != sha(next) {
				t.Errorf("replaced activation's labels %v (%v), want %s verified", info.Labels, err, sha(next))
			}
			if ok, err := e.sn.Exists(ctx, verifyKey(first.ImageID)); err != nil || ok {
				t.Errorf("verification view left after the replacement: %v, %v", ok, err)
			}
		})
	}
}

// TestPullTopLayoutCheckedForEveryImage: a layer unpacked first as a lower
// layer (where the canonical layout is not required) is still checked
// when another image has it on top: pulled alone, a layer without var/ is
// rejected as it would have been had it been pulled first.
func TestPullTopLayoutCheckedForEveryImage(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "p/1.tar", buildTar(t, []tarFile{{name: "etc/", typ: tar.TypeDir}, {name: "usr/", typ: tar.TypeDir}, {name: "etc/low", body: []byte("x")}}))
	e.srv.Put(t, "p/2.tar", layerTar(t, "p2", 100))
	e.mustPull("p/", "whole")
	if res, err := e.pull("p/1.tar", "lower-alone"); err == nil {
		t.Errorf("a layer without var/ pulled as an image of its own was accepted (chain %s, already unpacked as a lower layer)", res.TopChainID)
	}
}

// noVarTar is a one-layer image the layout policy refuses: no var/.
func noVarTar(t *testing.T) []byte {
	return buildTar(t, []tarFile{{name: "etc/", typ: tar.TypeDir}, {name: "usr/", typ: tar.TypeDir}, {name: "etc/x", body: []byte("x")}})
}

// TestPullFailedActivationCheckedAgain: an activate run that made the
// image's activation and failed before its layout check ended (the
// activation cannot be mounted) removes that activation, and the next pull
// checks the layout again: an image without var/ is refused, never
// registered. An activation some failed run left unlabelled (its removal
// failed too) is not adopted either.
func TestPullFailedActivationCheckedAgain(t *testing.T) {
	ctx := context.Background()
	for _, removeFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("cleanup removal fails %v", removeFails), func(t *testing.T) {
			e, reg := newRegisteringPullEnv(t)
			e.srv.Put(t, "bad/1.tar", noVarTar(t))
			_, imageID := imageSource(e.srv.Bucket, "bad/")
			act := ActivationKey(imageID)
			isAct := func(key string) bool { return strings.HasPrefix(key, metadata.ActivationPrefix) }
			e.sn.mountsErr = func(key string) error {
				if isAct(key) {
					return errors.New("injected: mount busy")
				}
				return nil
			}
			if removeFails {
				e.sn.removeErr = func(key string) error {
					if isAct(key) {
						return errors.New("injected: device busy")
					}
					return nil
				}
			}
			if _, err := e.pull("bad/", "bad"); err == nil || !strings.Contains(err.Error(), "mount busy") {
				t.Fatalf("pull whose activation cannot be mounted: %v; want the mount failure", err)
			}
			e.sn.mountsErr, e.sn.removeErr = nil, nil
			if ok, err := e.sn.Exists(ctx, act); err != nil || ok != removeFails {
				t.Errorf("activation %s exists after the failed pull: %v, %v; want %v", act, ok, err, removeFails)
			}
			if m, _ := filepath.Glob(filepath.Join(e.p.opts.MountDir, "*")); len(m) != 0 {
				t.Errorf("mount points left: %v", m)
			}
			res, err := e.pull("bad/", "bad")
			if err == nil {
				t.Fatalf("second pull of an image without var/ succeeded (snapshot %s, registered top %q): its layout was never checked",
					res.Snapshot.SnapshotName, reg.registeredTop("bad"))
			}
			if !strings.Contains(err.Error(), "var") {
				t.Errorf("second pull: %v; want the layout error naming var", err)
			}
			if top := reg.registeredTop("bad"); top != "" {
				t.Errorf("image without var/ registered with top %s", top)
			}
			if ok, err := e.sn.Exists(ctx, act); err != nil || ok {
				t.Errorf("rejected activation %s left: %v, %v", act, ok, err)
			}
		})
	}
}

// TestPullRejectedActivationRemovalRetried: when removing the activation
// of a rejected layout fails, the step is tried again rather than the run
// aborting with the activation in place: the pull is refused naming var,
// and no activation is left.
func TestPullRejectedActivationRemovalRetried(t *testing.T) {
	ctx := context.Background()
	e, reg := newRegisteringPullEnv(t)
	e.srv.Put(t, "bad/1.tar", noVarTar(t))
	_, imageID := imageSource(e.srv.Bucket, "bad/")
	act := ActivationKey(imageID)
	removes := 0
	e.sn.removeErr = func(key string) error {
		if key != act {
			return nil
		}
		removes++
		if removes == 1 {
			return errors.New("injected: device busy")
		}
		return nil
	}
	_, err := e.pull("bad/", "bad")
	if err == nil || !strings.Contains(err.Error(), "var") {
		t.Fatalf("pull of an image without var/: %v; want the layout error naming var", err)
	}
	if ok, err := e.sn.Exists(ctx, act); err != nil || ok {
		t.Errorf("rejected activation %s left after its first removal failed: %v, %v", act, ok, err)
	}
	if removes < 2 {
		t.Errorf("the rejected activation's removal was tried %d times, want it tried again", removes)
	}
	if top := reg.registeredTop("bad"); top != "" {
		t.Errorf("image without var/ registered with top %s", top)
	}
}

// TestPullActivationLabelledVerified: a pulled image's activation carries
// LabelLayoutVerified naming its top chain, and a pull of it again keeps
// that activation (same device).
func TestPullActivationLabelledVerified(t *testing.T) {
	ctx := context.Background()
	e := newPullEnv(t, nil)
	e.srv.Put(t, "ok/1.tar", layerTar(t, "ok", 100))
	res := e.mustPull("ok/", "ok")
	info, err := e.sn.Stat(ctx, res.Snapshot.SnapshotName)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Labels[LabelLayoutVerified]; got != res.TopChainID {
		t.Errorf("activation label %s = %q, want the top chain %s", LabelLayoutVerified, got, res.TopChainID)
	}
	again, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "ok/", Ref: "ok", Refresh: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.Snapshot.DeviceName != res.Snapshot.DeviceName {
		t.Errorf("pull again made the activation again: device %s, was %s", again.Snapshot.DeviceName, res.Snapshot.DeviceName)
	}
	// An activation without the label, as an older release left one, on
	// the top chain the image is recorded with was checked before it was
	// recorded: kept too, not made again.
	if _, err := e.sn.Update(ctx, snapshots.Info{Name: res.Snapshot.SnapshotName}, "labels."+LabelLayoutVerified); err != nil {
		t.Fatal(err)
	}
	before, err := e.sn.Stat(ctx, res.Snapshot.SnapshotName)
	if err != nil || before.Labels[LabelLayoutVerified] != "" {
		t.Fatalf("label not removed: %+v, %v", before.Labels, err)
	}
	if _, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "ok/", Ref: "ok", Refresh: true}); err != nil {
		t.Fatal(err)
	}
	after, err := e.sn.Stat(ctx, res.Snapshot.SnapshotName)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Created.Equal(before.Created) {
		t.Errorf("pull of a recorded image with an unlabelled activation made it again (created %s, was %s)", after.Created, before.Created)
	}
}

// TestPullNamespaces: a pull registers its name in each namespace it is
// asked for (the registrar's own when none), a re-pull in a new namespace
// registers it there without running anything, and a namespace containerd
// would refuse is refused before anything starts, naming it.
func TestPullNamespaces(t *testing.T) {
	e, reg := newRegisteringPullEnv(t)
	e.srv.Put(t, "ns/1.tar", layerTar(t, "ns", 1000))
	res, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "ns/", Namespaces: []string{"k8s.io", "team-a", "k8s.io"}})
	if err != nil {
		t.Fatal(err)
	}
	ref := res.Ref
	for _, k := range []string{"k8s.io|" + ref, "team-a|" + ref} {
		if reg.registeredTop(k) != res.TopChainID || reg.calls(k) != 1 {
			t.Errorf("%s: registered with top %q (%d calls), want %s once", k, reg.registeredTop(k), reg.calls(k), res.TopChainID)
		}
	}
	if reg.calls(ref) != 0 {
		t.Errorf("registered in the registrar's own namespace too (%d calls), though the pull named others", reg.calls(ref))
	}
	runs := e.runCount()
	again, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "ns/", Namespaces: []string{"k8s.io", "default"}})
	if err != nil || again.TopChainID != res.TopChainID {
		t.Fatalf("re-pull in a new namespace: %+v, %v", again, err)
	}
	if reg.registeredTop("default|"+ref) != res.TopChainID || reg.calls("k8s.io|"+ref) != 1 || e.runCount() != runs {
		t.Errorf("re-pull: default has %q, k8s.io registered %d times, %d runs then %d; want default registered, k8s.io left alone, no run",
			reg.registeredTop("default|"+ref), reg.calls("k8s.io|"+ref), runs, e.runCount())
	}
	if _, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "ns/", Namespaces: []string{"bad/ns"}}); err == nil || !strings.Contains(err.Error(), `namespace "bad/ns"`) {
		t.Errorf("pull into namespace bad/ns: %v; want an error naming it", err)
	}
	if e.runCount() != runs {
		t.Errorf("a refused namespace started runs")
	}
}

// TestCanceledPullNotRecordedFailed: a pull whose client goes away (Ctrl-C)
// once its runs are started did not fail: `ls images` shows no failure for it, and
// the runs it started go on and record the image pulled.
func TestCanceledPullNotRecordedFailed(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "c/1.tar", layerTar(t, "c", 3000))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Canceled once all its runs are started: the activate run's first step.
	e.p.hooks = map[string]func(){"check-snapshot:started": cancel}
	if _, err := e.p.Pull(ctx, api.PullRequest{Bucket: e.srv.Bucket, Key: "c/", Ref: "c"}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("pull canceled during its activation: %v; want context.Canceled", err)
	}
	_, imageID := imageSource(e.srv.Bucket, "c/")
	if img, err := RecordsOf(e.db).GetImage(context.Background(), imageID); err != nil || (img != nil && img.FailureReason != "") {
		t.Fatalf("image record right after the canceled pull: %+v, %v; want no failure recorded", img, err)
	}
	e.waitNoLiveRun("the canceled pull")
	img, err := RecordsOf(e.db).GetImage(context.Background(), imageID)
	if err != nil || img == nil || img.FailureReason != "" {
		t.Fatalf("image record once the runs ended: %+v, %v; want it pulled, no failure", img, err)
	}
}

// TestRefusedNewActivationKeepsPrevious: a new version whose layout passed
// but whose activation the snapshotter then refuses (after the previous
// activation was removed to make way for it) leaves the image as it was:
// its activation on the previous top chain, labelled verified for it, and
// no verification view.
func TestRefusedNewActivationKeepsPrevious(t *testing.T) {
	bg := context.Background()
	e := newPullEnv(t, nil)
	e.srv.Put(t, "pf/1.tar", layerTar(t, "old", 500))
	first := e.mustPull("pf/", "pf")
	e.srv.Put(t, "pf/1.tar", layerTar(t, "new", 500))
	act := first.Snapshot.SnapshotName
	e.sn.mu.Lock()
	e.sn.prepareErr = func(key, parent string) error {
		if key == act && parent != first.TopChainID {
			return fmt.Errorf("prepare %s: injected: device-mapper busy", key)
		}
		return nil
	}
	e.sn.mu.Unlock()
	if _, err := e.pull("pf/", "pf"); err == nil || !strings.Contains(err.Error(), "keeps its previous version") {
		t.Fatalf("pull of a new version whose activation is refused: %v; want a failure saying the image keeps its previous version", err)
	}
	e.waitNoLiveRun("the refused pull")
	info, err := e.sn.Stat(bg, act)
	if err != nil || info.Parent != first.TopChainID || info.Labels[LabelLayoutVerified] != first.TopChainID {
		t.Errorf("activation after the refused new version: %+v, %v; want it on the previous top %s, labelled verified for it", info, err, first.TopChainID)
	}
	if _, err := e.sn.Stat(bg, verifyKey(first.ImageID)); err == nil {
		t.Errorf("verification view %s left behind", verifyKey(first.ImageID))
	}
}
