package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// commitEnv makes the test binary, re-run by runAsOther, a client of
// the snapshots API on the socket it names: it prepares a snapshot and
// commits it under commitNameEnv, and prints the answer.
const (
	commitEnv     = "PLUGIN_TEST_SNAPSHOTS_COMMIT_SOCKET"
	commitNameEnv = "PLUGIN_TEST_SNAPSHOTS_COMMIT_NAME"
)

func commitAndPrint(sock string) int {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println("error:", err)
		return 0
	}
	defer conn.Close()
	sn := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "flyio")
	ctx := namespaces.WithNamespace(context.Background(), "default")
	if _, err := sn.Prepare(ctx, "planted", ""); err != nil {
		fmt.Println("error:", err)
		return 0
	}
	if err := sn.Commit(ctx, os.Getenv(commitNameEnv), "planted"); err != nil {
		fmt.Println("error:", err)
		return 0
	}
	fmt.Println("committed")
	return 0
}

// TestSnapshotsAPIRefusesCallersOtherThanRoot: the S3 pipelines take a
// committed snapshot named by a chain ID as that chain, unpacked (a chain
// containerd unpacked is used so). A caller other than root committing a
// snapshot under a chain ID would have the next pull of an image with that
// chain take whatever it committed. daemon.socket is root's alone (mode
// 0600, root's group, whatever daemon.socket_group says), so such a
// caller, even one in root's group, cannot connect; containerd, as root,
// is served.
func TestSnapshotsAPIRefusesCallersOtherThanRoot(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test needs root, to run a client as another user")
	}
	sock := filepath.Join(socketDir(t), "snap.sock")
	sn := newNative(t)
	startServe(t, sn, ServeOptions{Socket: sock})
	const chain = "sha256:5a1f2e3d4c5b6a79881726354453627180a9b8c7d6e5f40312233445566778899"

	var st syscall.Stat_t
	if err := syscall.Stat(sock, &st); err != nil || st.Mode&0o777 != 0o600 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("%s: mode %o, owner %d:%d, %v; want 600, root:root", sock, st.Mode&0o777, st.Uid, st.Gid, err)
	}
	out := runAsOther(t, []string{commitEnv + "=" + sock, commitNameEnv + "=" + chain}, 0, 4242)
	if !strings.Contains(out, "permission denied") {
		t.Errorf("uid 65534 in groups 0 and 4242 committing %s: %q, want its connection refused (permission denied)", chain, out)
	}
	ctx := namespaces.WithNamespace(context.Background(), "default")
	if _, err := sn.Stat(ctx, chain); err == nil {
		t.Errorf("a caller other than root committed a snapshot named %s", chain)
	}

	client := DialProxy(t, sock)
	if _, err := client.Prepare(ctx, "k", ""); err != nil {
		t.Fatalf("Prepare as root: %v", err)
	}
	if err := client.Commit(ctx, chain, "k"); err != nil {
		t.Fatalf("Commit as root: %v", err)
	}
}
