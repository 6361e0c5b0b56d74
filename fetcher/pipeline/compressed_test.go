package pipeline

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestPullCompressedLayers: one two-layer image stored as .tar.gz, as
// .tar.zst, as plain .tar, and its bottom layer gzip-compressed under a
// ".tar" name: each object is downloaded and kept by the digest of its
// bytes, but a layer's identity is its uncompressed tar's, so the four
// images share two chains, unpacked once, registered with the plain tars'
// digests as diff IDs; a re-pull with --refresh (every download handed off
// from the records) finds the same chains.
func TestPullCompressedLayers(t *testing.T) {
	e, reg := newRegisteringPullEnv(t)
	base := layerTar(t, "base", 30000)
	top := layerTar(t, "top", 30000)
	e.srv.Put(t, "gz/1.tar.gz", s3test.Gzip(t, base))
	e.srv.Put(t, "gz/2.tar.gz", s3test.Gzip(t, top))
	e.srv.Put(t, "zst/1.tar.zst", s3test.Zstd(t, base))
	e.srv.Put(t, "zst/2.tar.zst", s3test.Zstd(t, top))
	e.srv.Put(t, "plain/1.tar", base)
	e.srv.Put(t, "plain/2.tar", top)
	e.srv.Put(t, "named-tar.tar", s3test.Gzip(t, base))

	want := ChainID(sha(base), sha(top))
	gz := e.mustPull("gz/", "")
	if gz.TopChainID != want || gz.Unpacked != 2 || gz.Downloaded != 2 || gz.Layers[0].DiffID != sha(base) || gz.Layers[1].DiffID != sha(top) {
		t.Fatalf("gz/: top chain %s, layers %+v, unpacked %d, downloaded %d; want %s from the uncompressed diff IDs, 2 unpacked",
			gz.TopChainID, gz.Layers, gz.Unpacked, gz.Downloaded, want)
	}
	if got := e.sn.readFile(t, gz.Snapshot.SnapshotName, "etc/marker"); got != "top" {
		t.Errorf("gz/ shows etc/marker %q, want top", got)
	}
	if gz.Ref != "s3.local/"+e.srv.Bucket+"/gz:latest" {
		t.Errorf("gz/ named %q", gz.Ref)
	}
	for _, key := range []string{"zst/", "plain/"} {
		r := e.mustPull(key, "")
		if r.TopChainID != want || r.Unpacked != 0 || r.Downloaded != 2 {
			t.Errorf("%s: top chain %s, unpacked %d, downloaded %d; want %s, nothing unpacked, both downloaded", key, r.TopChainID, r.Unpacked, r.Downloaded, want)
		}
		if got := e.sn.readFile(t, r.Snapshot.SnapshotName, "etc/marker"); got != "top" {
			t.Errorf("%s shows etc/marker %q, want top", key, got)
		}
	}
	one := e.mustPull("named-tar.tar", "one")
	if one.TopChainID != sha(base) || one.Unpacked != 0 {
		t.Errorf("gzip data under a .tar name: chain %s, unpacked %d; want %s (recognised by its bytes), nothing unpacked", one.TopChainID, one.Unpacked, sha(base))
	}
	if chains := e.committedChains(); len(chains) != 2 {
		t.Errorf("committed chains %v, want 2 (base, top on base)", chains)
	}
	if files, err := os.ReadDir(e.p.opts.blobDir()); err != nil || len(files) != 6 {
		t.Errorf("layer files %d (%v), want 6 (base and top as gzip, zstd and plain; named-tar.tar is gz/1.tar.gz's bytes)", len(files), err)
	}
	if diffs := reg.names["s3.local/"+e.srv.Bucket+"/zst:latest"]; len(diffs) != 2 || diffs[0] != sha(base) || diffs[1] != sha(top) {
		t.Errorf("zst/ registered with diff IDs %v, want the plain tars' digests", diffs)
	}
	o, err := RecordsOf(e.db).ObjectRecord(context.Background(), e.srv.Bucket, "zst/2.tar.zst")
	if err != nil || o == nil || o.DiffID != sha(top) || o.Digest == sha(top) {
		t.Errorf("zst/2.tar.zst recorded as %+v, %v; want its own digest and the top tar's diff ID", o, err)
	}

	again, err := e.pullReq(api.PullRequest{Bucket: e.srv.Bucket, Key: "gz/", Refresh: true})
	if err != nil || again.TopChainID != want || again.Downloaded != 0 || again.Unpacked != 0 {
		t.Errorf("gz/ --refresh: %+v, %v; want %s, nothing downloaded or unpacked", again, err, want)
	}
}

// TestPullCorruptCompressedLayer: a gzip layer cut short is refused as a
// malformed archive while it downloads; nothing of it is kept.
func TestPullCorruptCompressedLayer(t *testing.T) {
	e := newPullEnv(t, nil)
	gz := s3test.Gzip(t, layerTar(t, "cut", 30000))
	e.srv.Put(t, "cut/1.tar.gz", gz[:len(gz)-40])
	_, err := e.pull("cut/", "")
	if err == nil || !strings.Contains(err.Error(), "validate s3://"+e.srv.Bucket+"/cut/1.tar.gz") || !strings.Contains(err.Error(), "malformed tar archive") {
		t.Fatalf("pull of a truncated gzip layer: %v; want a malformed archive naming the object", err)
	}
	if files, _ := os.ReadDir(e.p.opts.blobDir()); len(files) != 0 {
		t.Errorf("layer files left: %v", files)
	}
	if chains := e.committedChains(); len(chains) != 0 {
		t.Errorf("chains left: %v", chains)
	}
}

// forgetInStreamChecks makes the validate step read the layer file again,
// as after a crash: it forgets the check made while downloading, and what
// an extraction while downloading found.
func (e *env) forgetInStreamChecks() {
	e.p.validated.Range(func(k, _ any) bool { e.p.validated.Delete(k); return true })
	e.p.streamsMu.Lock()
	var ss []*streamExtraction
	for _, s := range e.p.streams {
		ss = append(ss, s)
	}
	e.p.streamsMu.Unlock()
	for _, s := range ss {
		e.p.dropStream(context.Background(), s)
	}
}

// TestCompressedLayerValidatedAgain: when the validate step cannot trust
// the in-stream check (the file was written by another process, as after a
// crash), it reads the compressed file again and finds the same diff ID.
func TestCompressedLayerValidatedAgain(t *testing.T) {
	e := newPullEnv(t, nil)
	base := layerTar(t, "again", 30000)
	e.srv.Put(t, "again/1.tar.zst", s3test.Zstd(t, base))
	reads := 0
	e.p.hooks = map[string]func(){
		"validate:started": e.forgetInStreamChecks,
		"validate:reading": func() { reads++ },
	}
	r := e.mustPull("again/", "")
	if reads != 1 || r.TopChainID != sha(base) || r.Layers[0].DiffID != sha(base) {
		t.Errorf("re-read %d times, top chain %s, diff ID %s; want one re-read and %s", reads, r.TopChainID, r.Layers[0].DiffID, sha(base))
	}
	if got := e.sn.readFile(t, r.Snapshot.SnapshotName, "etc/marker"); got != "again" {
		t.Errorf("etc/marker %q", got)
	}
}

// TestPullThroughGzipCommand: with igzip inflating (Options.GzipCommand),
// a two-layer gzip image pulls to the chains of its plain tars, also when
// the validate step reads the layer files again; a layer with bytes after
// its gzip stream, which igzip itself ignores, is refused as the built-in
// inflater refuses it, and nothing of it is kept.
func TestPullThroughGzipCommand(t *testing.T) {
	igzip, err := exec.LookPath("igzip")
	if err != nil {
		t.Fatalf("igzip is not installed (Debian package isal; scripts/install-deps.sh installs it): %v", err)
	}
	e := newPullEnvWith(t, nil, func(o *Options) { o.GzipCommand = igzip })
	base, top := layerTar(t, "base", 30000), layerTar(t, "top", 30000)
	e.srv.Put(t, "gz/1.tar.gz", s3test.Gzip(t, base))
	e.srv.Put(t, "gz/2.tar.gz", s3test.Gzip(t, top))
	r := e.mustPull("gz/", "")
	if r.TopChainID != ChainID(sha(base), sha(top)) || r.Layers[0].DiffID != sha(base) || r.Layers[1].DiffID != sha(top) {
		t.Fatalf("top chain %s, layers %+v; want the plain tars' diff IDs", r.TopChainID, r.Layers)
	}
	if got := e.sn.readFile(t, r.Snapshot.SnapshotName, "etc/marker"); got != "top" {
		t.Errorf("etc/marker %q, want top", got)
	}

	again := layerTar(t, "again", 30000)
	e.srv.Put(t, "again/1.tar.gz", s3test.Gzip(t, again))
	reads := 0
	e.p.hooks = map[string]func(){
		"validate:started": e.forgetInStreamChecks,
		"validate:reading": func() { reads++ },
	}
	if r := e.mustPull("again/", ""); r.TopChainID != sha(again) || reads != 1 {
		t.Errorf("again/: top chain %s after %d reads of the file; want %s after one", r.TopChainID, reads, sha(again))
	}
	e.p.hooks = nil

	blobs, _ := os.ReadDir(e.p.opts.blobDir())
	chains := e.committedChains()
	e.srv.Put(t, "junk/1.tar.gz", append(s3test.Gzip(t, layerTar(t, "junk", 30000)), "junk"...))
	_, err = e.pull("junk/", "")
	if err == nil || !strings.Contains(err.Error(), "validate s3://"+e.srv.Bucket+"/junk/1.tar.gz") || !strings.Contains(err.Error(), "malformed tar archive") {
		t.Fatalf("pull of a gzip layer with bytes after its stream: %v; want a malformed archive naming the object", err)
	}
	if files, _ := os.ReadDir(e.p.opts.blobDir()); len(files) != len(blobs) {
		t.Errorf("layer files %d after the refusal, want the %d before it", len(files), len(blobs))
	}
	if after := e.committedChains(); len(after) != len(chains) {
		t.Errorf("chains %v after the refusal, want %v", after, chains)
	}
}
