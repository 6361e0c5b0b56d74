//go:build dm

package clients

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/containerd/ociimage"
)

// testCRI drives containerd's CRI plugin over its gRPC API, the calls the
// kubelet (and crictl) make: pull the registry's image, run a pod sandbox
// on the host network (its pause image pulled from the registry by the
// plugin itself), create and start a container in it that prints the
// image's marker file, read its CRI log, then remove container, sandbox and
// both images.
func (e *env) testCRI(t *testing.T, ctx context.Context) {
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("CRI client for %s: %v", e.socket, err)
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	images := runtimeapi.NewImageServiceClient(conn)

	v, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatalf("CRI Version (is the CRI plugin on?): %v; containerd log:\n%s", err, e.ctrd.LogTail(30))
	}
	t.Logf("CRI runtime %s %s, API %s", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)

	e.timed(t, "CRI PullImage", func() error {
		r, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: e.imageRef}})
		if err == nil {
			t.Logf("CRI PullImage %s: %s", e.imageRef, r.ImageRef)
		}
		return err
	})
	if err := e.unpackedInFlyio(ctx, criNamespace, e.imageRef); err != nil {
		t.Fatal(err)
	}

	logDir := filepath.Join(e.scratch, "pods", "flyio-pod")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sandboxConfig := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "flyio-pod", Uid: "flyio-pod-uid", Namespace: "default"},
		LogDirectory: logDir,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			},
		},
	}
	var podID string
	e.timed(t, "CRI RunPodSandbox (pulls the pause image)", func() error {
		r, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig})
		if err != nil {
			return fmt.Errorf("%w; containerd log:\n%s", err, e.ctrd.LogTail(30))
		}
		podID = r.PodSandboxId
		return nil
	})
	if err := e.unpackedInFlyio(ctx, criNamespace, e.pauseRef); err != nil {
		t.Error(err)
	}

	var ctrID string
	e.timed(t, "CRI CreateContainer + StartContainer", func() error {
		r, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId: podID,
			Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: "hello"},
				Image:    &runtimeapi.ImageSpec{Image: e.imageRef},
				Command:  []string{"/bin/cat", ociimage.MarkerPath},
				LogPath:  "hello.log",
				Linux:    &runtimeapi.LinuxContainerConfig{},
			},
			SandboxConfig: sandboxConfig,
		})
		if err != nil {
			return fmt.Errorf("%w; containerd log:\n%s", err, e.ctrd.LogTail(30))
		}
		ctrID = r.ContainerId
		if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctrID}); err != nil {
			return fmt.Errorf("%w; containerd log:\n%s", err, e.ctrd.LogTail(30))
		}
		return nil
	})
	// The sandbox's and the container's root filesystems are snapshots of
	// ours.
	cctx := namespaces.WithNamespace(ctx, criNamespace)
	for _, id := range []string{podID, ctrID} {
		c, err := e.client.LoadContainer(cctx, id)
		if err != nil {
			t.Errorf("containerd container %s: %v", id, err)
			continue
		}
		info, err := c.Info(cctx)
		if err != nil {
			t.Errorf("containerd container %s: %v", id, err)
		} else if info.Snapshotter != "flyio" {
			t.Errorf("containerd container %s (image %s) uses snapshotter %q, want flyio", id, info.Image, info.Snapshotter)
		}
	}

	var status *runtimeapi.ContainerStatus
	e.timed(t, "CRI container runs to its exit", func() error {
		for {
			r, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ctrID})
			if err != nil {
				return err
			}
			if status = r.Status; status.State == runtimeapi.ContainerState_CONTAINER_EXITED {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("container %s still %s: %w", ctrID, status.State, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	if status.ExitCode != 0 {
		t.Errorf("container exited with %d (%s: %s)", status.ExitCode, status.Reason, status.Message)
	}
	logText, err := readAll(status.LogPath)
	if err != nil {
		t.Fatalf("container log: %v", err)
	}
	if got := criLogStdout(logText); got != ociimage.MarkerContent {
		t.Errorf("CRI container printed %q (log %s:\n%s), want %q", got, status.LogPath, logText, ociimage.MarkerContent)
	}
	t.Logf("CRI container log %s:\n%s", status.LogPath, strings.TrimSpace(logText))

	e.timed(t, "CRI RemoveContainer, StopPodSandbox, RemovePodSandbox", func() error {
		if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ctrID}); err != nil {
			return err
		}
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
			return err
		}
		_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: podID})
		return err
	})
	e.timed(t, "CRI RemoveImage (image and pause)", func() error {
		for _, ref := range []string{e.imageRef, e.pauseRef} {
			if _, err := images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
				return fmt.Errorf("remove %s: %w", ref, err)
			}
		}
		return nil
	})
	list, err := images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range list.Images {
		t.Errorf("CRI still lists image %s %v after RemoveImage", img.Id, img.RepoTags)
	}
}

// criLogStdout returns what a CRI log file holds from stdout: each line is
// "TIMESTAMP STREAM TAG CONTENT", TAG F ending a line and P a partial one.
func criLogStdout(log string) string {
	var b strings.Builder
	for _, line := range strings.Split(log, "\n") {
		f := strings.SplitN(line, " ", 4)
		if len(f) != 4 || f[1] != "stdout" {
			continue
		}
		b.WriteString(f[3])
		if f[2] == "F" {
			b.WriteString("\n")
		}
	}
	return b.String()
}
