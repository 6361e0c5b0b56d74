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
// image's marker file, and one on the S3 image our pull registered in
// k8s.io, read their CRI logs, then remove containers, sandbox and every
// image.
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
	// The S3 subtest left this image's chains in the CRI's namespace, so
	// the pull above applied nothing. The CRI pulls through containerd's
	// transfer service, whose unpack configuration names flyio-diff: an
	// image of new chains shows it.
	mark := e.daemonLogMark(t)
	e.timed(t, "CRI PullImage (new chains: device node, lower-layer hard link)", func() error {
		_, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: e.specialsRef}})
		return err
	})
	e.appliedByDaemon(t, e.specials, mark)

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

	cctx := namespaces.WithNamespace(ctx, criNamespace)
	// The sandbox's root filesystem is a snapshot of ours.
	e.checkFlyioContainer(t, cctx, podID)
	ctrIDs := []string{e.criContainer(t, ctx, rt, podID, sandboxConfig, "hello", e.imageRef, ociimage.MarkerPath, ociimage.MarkerContent)}
	if e.s3Ref != "" {
		// An image pulled from S3 by our pull, registered in k8s.io, runs
		// by its name like one the CRI plugin pulled.
		ctrIDs = append(ctrIDs, e.criContainer(t, ctx, rt, podID, sandboxConfig, "from-s3", e.s3Ref, s3LayerPath, s3LayerContent))
	}

	e.timed(t, "CRI RemoveContainer, StopPodSandbox, RemovePodSandbox", func() error {
		for _, id := range ctrIDs {
			if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
				return err
			}
		}
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
			return err
		}
		_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: podID})
		return err
	})
	e.timed(t, "CRI RemoveImage (images and pause)", func() error {
		refs := []string{e.imageRef, e.pauseRef, e.specialsRef}
		if e.s3Ref != "" {
			refs = append(refs, e.s3Ref)
		}
		for _, ref := range refs {
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

// checkFlyioContainer checks that containerd's container id (in the CRI
// namespace of ctx) has its root filesystem on flyio.
func (e *env) checkFlyioContainer(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	c, err := e.client.LoadContainer(ctx, id)
	if err != nil {
		t.Errorf("containerd container %s: %v", id, err)
		return
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Errorf("containerd container %s: %v", id, err)
	} else if info.Snapshotter != "flyio" {
		t.Errorf("containerd container %s (image %s) uses snapshotter %q, want flyio", id, info.Image, info.Snapshotter)
	}
}

// criContainer creates and starts container name of image in the pod,
// running `cat file`, waits for its exit and checks that its CRI log holds
// want and that it ran on flyio; it returns the container's id.
func (e *env) criContainer(t *testing.T, ctx context.Context, rt runtimeapi.RuntimeServiceClient, podID string, sandboxConfig *runtimeapi.PodSandboxConfig,
	name, image, file, want string) string {
	t.Helper()
	var ctrID string
	e.timed(t, "CRI CreateContainer + StartContainer ("+name+")", func() error {
		r, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId: podID,
			Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: name},
				Image:    &runtimeapi.ImageSpec{Image: image},
				Command:  []string{"/bin/cat", file},
				LogPath:  name + ".log",
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
	e.checkFlyioContainer(t, namespaces.WithNamespace(ctx, criNamespace), ctrID)

	var status *runtimeapi.ContainerStatus
	e.timed(t, "CRI container runs to its exit ("+name+")", func() error {
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
		t.Errorf("container %s exited with %d (%s: %s)", name, status.ExitCode, status.Reason, status.Message)
	}
	logText, err := readAll(status.LogPath)
	if err != nil {
		t.Fatalf("container log: %v", err)
	}
	if got := criLogStdout(logText); got != want {
		t.Errorf("CRI container %s (image %s) printed %q (log %s:\n%s), want %q", name, image, got, status.LogPath, logText, want)
	}
	t.Logf("CRI container %s (image %s) log %s:\n%s", name, image, status.LogPath, strings.TrimSpace(logText))
	return ctrID
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
