package plugin

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	diffapi "github.com/containerd/containerd/api/services/diff/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	diffproxy "github.com/containerd/containerd/v2/core/diff/proxy"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/differ"
)

// applyEnv makes the test binary, re-run by runAsOther, a client of the
// diff API on the socket it names: it asks Apply to write the layer of
// applyDigestEnv onto a bind mount of applyTargetEnv, and prints the answer.
const (
	applyEnv       = "PLUGIN_TEST_DIFF_APPLY_SOCKET"
	applyDigestEnv = "PLUGIN_TEST_DIFF_APPLY_DIGEST"
	applyTargetEnv = "PLUGIN_TEST_DIFF_APPLY_TARGET"
)

func applyAndPrint(sock string) int {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println("error:", err)
		return 0
	}
	defer conn.Close()
	ctx := namespaces.WithNamespace(context.Background(), "default")
	resp, err := diffapi.NewDiffClient(conn).Apply(ctx, &diffapi.ApplyRequest{
		Diff:   &types.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: os.Getenv(applyDigestEnv)},
		Mounts: []*types.Mount{{Type: "bind", Source: os.Getenv(applyTargetEnv), Options: []string{"rbind", "rw"}}},
	})
	if err != nil {
		fmt.Println("error:", err)
		return 0
	}
	fmt.Println("applied", resp.Applied.Digest)
	return 0
}

// TestDiffApplyRefusesCallersOtherThanRoot: Apply mounts what its caller
// names and writes a layer there as root. A caller other than root, even
// one in root's group and in the group daemon.socket_group gives the
// control socket, asking for a bind mount of a host directory is refused,
// and nothing is written there; containerd, as root, is served.
func TestDiffApplyRefusesCallersOtherThanRoot(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test needs root, to mount and to run a client as another user")
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "planted", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	cs, err := local.NewStore(filepath.Join(t.TempDir(), "content"))
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromBytes(layer.Bytes()), Size: int64(layer.Len())}
	if err := content.WriteBlob(context.Background(), cs, desc.Digest.String(), bytes.NewReader(layer.Bytes()), desc); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(socketDir(t), "snap.sock")
	startServe(t, newNative(t), ServeOptions{Socket: sock,
		Applier: &differ.Applier{Content: cs, Limits: differ.DefaultConfig().Limits()}})

	victim := t.TempDir()
	out := runAsOther(t, []string{applyEnv + "=" + sock, applyDigestEnv + "=" + desc.Digest.String(), applyTargetEnv + "=" + victim}, 0, 4242)
	if !strings.Contains(out, "permission denied") {
		t.Errorf("uid 65534 in groups 0 and 4242 asking to apply onto %s: %q, want its connection refused (permission denied)", victim, out)
	}
	if _, err := os.Lstat(filepath.Join(victim, "planted")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s/planted: %v: a caller other than root had a layer written as root onto a directory of its choosing", victim, err)
	}

	// containerd's own client of a diff plugin, as root.
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	target := t.TempDir()
	ctx := namespaces.WithNamespace(context.Background(), "default")
	got, err := diffproxy.NewDiffApplier(diffapi.NewDiffClient(conn)).(diff.Applier).Apply(ctx, desc,
		[]mount.Mount{{Type: "bind", Source: target, Options: []string{"rbind", "rw"}}})
	if err != nil || got.Digest != desc.Digest {
		t.Fatalf("Apply as root: %v, %v; want the layer applied with diff ID %s", got, err, desc.Digest)
	}
	if _, err := os.Lstat(filepath.Join(target, "planted")); err != nil {
		t.Errorf("Apply as root: %v", err)
	}
}
