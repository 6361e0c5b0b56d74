//go:build dm

package plugin_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/inventory"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
)

// layerTar is a small layer tarball: the directories an image must have
// (tarball.RequiredDirs), dir, and one file per name in dir.
func layerTar(t *testing.T, dir string, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var hdrs []*tar.Header
	for _, d := range append(slices.Clone(tarball.RequiredDirs), dir) {
		hdrs = append(hdrs, &tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755})
	}
	for _, f := range files {
		hdrs = append(hdrs, &tar.Header{Name: dir + "/" + f, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f) + 1)})
	}
	for _, h := range hdrs {
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(strings.TrimPrefix(h.Name, dir+"/") + "\n")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// collectLikeContainerd does what containerd's metadata garbage collector
// does to a snapshotter when none of its snapshots are referenced: walk
// the backend, remove every snapshot children first (a FailedPrecondition
// is logged and skipped, as containerd does), then Cleanup. It returns the
// names it removed.
func collectLikeContainerd(t *testing.T, ctx context.Context, sn snapshots.Snapshotter) []string {
	t.Helper()
	children := map[string][]string{}
	var roots []string
	if err := sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Parent == "" {
			roots = append(roots, i.Name)
		} else {
			children[i.Parent] = append(children[i.Parent], i.Name)
		}
		return nil
	}); err != nil {
		t.Fatalf("walk: %v", err)
	}
	var removed []string
	var prune func(string)
	prune = func(name string) {
		for _, c := range children[name] {
			prune(c)
		}
		err := sn.Remove(ctx, name)
		switch {
		case err == nil:
			removed = append(removed, name)
		case errdefs.IsFailedPrecondition(err):
			t.Logf("collector: %s kept: %v", name, err)
		default:
			t.Fatalf("collector: remove %s: %v", name, err)
		}
	}
	for _, r := range roots {
		prune(r)
	}
	if err := sn.(snapshots.Cleaner).Cleanup(ctx); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	return removed
}

// TestContainerdViewOverSocket checks what containerd sees of the S3
// pipelines' snapshots over the proxy socket, and what its garbage
// collector may do to them: the activation and extraction snapshots are
// not listed (containerd would remove them as unknown); the chains of an
// image pulled while containerd's socket was absent are kept from its
// collector until the image is registered; during another image's pull,
// an image's own chain is removed (with its activation) while the chain
// the pull builds on is kept; Cleanup forgets the removed image's records
// and layer file, while the image sharing its lower layer keeps
// everything.
func TestContainerdViewOverSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg := dmtest.Config(t)
	// The VM harness boots with its network off: the fake S3 needs lo.
	exec.Command("ip", "link", "set", "lo", "up").Run()
	srv := s3test.NewServer(t)
	cfg.S3.Region, cfg.S3.Endpoint, cfg.S3.PathStyle, cfg.S3.Anonymous = "us-east-1", srv.URL, true, true
	cfg.Daemon.ControlSocket = filepath.Join(cfg.Daemon.RootDir, "run", "control.sock")
	// A registrar is configured (so the chains are shown to containerd for
	// adoption); its socket does not exist, so the names stay pending.
	cfg.Containerd.Address = filepath.Join(cfg.Daemon.RootDir, "no-containerd.sock")

	base := layerTar(t, "base", "a", "b")
	srv.Put(t, "a/1.tar", base)
	srv.Put(t, "a/2.tar", layerTar(t, "app-a", "x"))
	srv.Put(t, "b/1.tar", base)
	srv.Put(t, "b/2.tar", layerTar(t, "app-b", "y"))

	svc, err := plugin.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	stopFetcher, err := svc.StartFetcher(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stopFetcher()
	stopServe := dmtest.Serve(t, ctx, svc)
	defer stopServe()
	client := plugin.DialProxy(t, cfg.Daemon.Socket)
	ctl := control.NewClient(cfg.Daemon.ControlSocket)
	pull := func(prefix string) *api.PullResult {
		t.Helper()
		res, err := ctl.Pull(ctx, api.PullRequest{Bucket: srv.Bucket, Key: prefix, Ref: "test/" + strings.TrimSuffix(prefix, "/")}, nil)
		if err != nil {
			t.Fatalf("pull %s: %v", prefix, err)
		}
		return res
	}

	a := pull("a/")
	var listed []string
	if err := client.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		listed = append(listed, i.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{a.Layers[0].ChainID, a.TopChainID}; fmt.Sprint(slices.Sorted(slices.Values(listed))) != fmt.Sprint(slices.Sorted(slices.Values(want))) {
		t.Fatalf("containerd's walk lists %v, want only the committed chains %v (no activation, no extraction)", listed, want)
	}
	if _, err := client.Stat(ctx, a.Snapshot.SnapshotName); err != nil {
		t.Fatalf("activation %s: %v", a.Snapshot.SnapshotName, err)
	}
	if a.Snapshot.Registered || !a.Snapshot.RegisterPending {
		t.Fatalf("pull with containerd's socket absent: registered %v, pending %v; want pending", a.Snapshot.Registered, a.Snapshot.RegisterPending)
	}
	// containerd's collector, which removes every backend snapshot it does
	// not know, may not take the chains of an image it does not have yet.
	if removed := collectLikeContainerd(t, ctx, client); len(removed) != 0 {
		t.Fatalf("garbage collection removed %v of an image whose registration is pending", removed)
	}
	if _, err := client.Stat(ctx, a.Snapshot.SnapshotName); err != nil {
		t.Fatalf("activation %s after containerd's collection: %v", a.Snapshot.SnapshotName, err)
	}
	// From here on, as if containerd had registered a and then dropped it
	// (`ctr image rm`): its chains are containerd's to collect.
	if _, err := svc.DB.Statements().ExecContext(ctx, `DELETE FROM containerd_pending WHERE name = 'test/a'`); err != nil {
		t.Fatal(err)
	}

	// A pull under way: b's own layer, thousands of files, is being
	// extracted on the base chain it shares with a. containerd's collector
	// (nothing registered: it would remove everything) takes a's own chain
	// and, with it, a's activation; the base chain is kept, a live run of
	// b's pull building on it.
	many := make([]string, 4000)
	for i := range many {
		many[i] = fmt.Sprintf("f%04d", i)
	}
	srv.Put(t, "b/2.tar", layerTar(t, "app-b", many...))
	bDone := make(chan *api.PullResult, 1)
	go func() { bDone <- pull("b/") }()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		runs, err := fsm.NewSQLiteStore(svc.DB).ListRuns(ctx, fsm.RunFilter{FSM: api.FSMUnpack, States: []fsm.State{fsm.StateRunning}})
		if err != nil {
			t.Fatal(err)
		}
		// Extracting: in extract-layers, or in create-device while it waits
		// for the extraction that follows the layer's download.
		if len(runs) > 0 && (runs[0].Transition == "extract-layers" || runs[0].Transition == "create-device") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pull of b/ never reached the extraction of its layer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if removed := collectLikeContainerd(t, ctx, client); fmt.Sprint(removed) != fmt.Sprint([]string{a.TopChainID}) {
		t.Fatalf("garbage collection during b's pull removed %v; want only a's own chain %s (the base is b's too)", removed, a.TopChainID)
	}
	if err := client.Remove(ctx, a.Layers[0].ChainID); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "live run") {
		t.Fatalf("Remove of the base chain during b's pull: %v, want FailedPrecondition naming the live runs", err)
	}
	if _, err := client.Stat(ctx, a.Snapshot.SnapshotName); !errdefs.IsNotFound(err) {
		t.Fatalf("a's activation after its chain was removed: %v, want NotFound", err)
	}
	b := <-bDone
	if b.Layers[0].ChainID != a.Layers[0].ChainID || b.Unpacked != 1 {
		t.Fatalf("b shares a's base byte for byte: chains %s and %s, unpacked %d; want one chain, only b's layer unpacked", a.Layers[0].ChainID, b.Layers[0].ChainID, b.Unpacked)
	}
	if err := client.Remove(ctx, a.Layers[0].ChainID); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Remove of the layer b still builds on: %v, want FailedPrecondition", err)
	}
	if err := client.(snapshots.Cleaner).Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if id, err := pipeline.RecordsOf(svc.DB).ImageIDByName(ctx, "test/a"); err != nil || id != "" {
		t.Errorf("a's image record after GC: %q, %v; want none", id, err)
	}
	if id, err := pipeline.RecordsOf(svc.DB).ImageIDByName(ctx, "test/b"); err != nil || id == "" {
		t.Errorf("b's image record after a's GC: %v; want it kept", err)
	}
	unpacked, err := inventory.Chains(ctx, svc.DB)
	if err != nil {
		t.Fatal(err)
	}
	if len(unpacked) != 2 {
		t.Errorf("unpacked records after a's GC: %d, want 2 (the shared base and b's layer)", len(unpacked))
	}
	blobs, err := os.ReadDir(filepath.Join(cfg.Pipeline.DownloadDir, "blobs", "sha256"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if len(blobs) != 2 {
		t.Errorf("blob files after a's GC: %d, want 2 (a's own layer deleted)", len(blobs))
	}
	if _, err := ctl.Activate(ctx, "test/b"); err != nil {
		t.Errorf("activate b after a's GC: %v", err)
	}
}
