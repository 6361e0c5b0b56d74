//go:build dm

package clients

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/platforms"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/containerd/ociimage"
)

// applyMounts returns the mount points of the snapshots mounted to apply a
// layer onto: containerd's temporary mounts ("containerd-mount…"), which
// the daemon's diff service makes too.
func applyMounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.Contains(f[4], "containerd-mount") {
			out = append(out, f[4])
		}
	}
	return out, nil
}

// killedLayerBytes is the payload of the layer whose apply is cut off: its
// extraction (writing and hashing it) lasts seconds under the VM's
// emulation, well past the half second the test waits after that apply has
// begun.
const killedLayerBytes = 32 << 20

// TestKillDuringApply: SIGKILL of the daemon while it extracts a registry
// layer for containerd fails that pull, and leaves the snapshot mounted
// where the dead process mounted it. After a restart the same pull
// completes and a container runs on it; once the image is removed and
// containerd has collected its garbage, nothing of the cut-off apply stays:
// no mount, no thin device, no record.
func TestKillDuringApply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	e := setup(t, ctx)

	ref := e.reg.Host + "/flyio-it/killed-apply:v1"
	var buf bytes.Buffer
	img, err := ociimage.Write(&buf, ociimage.Options{Name: ref, PayloadBytes: killedLayerBytes, PayloadSeed: "killed-apply", Platform: platforms.DefaultSpec()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.PushOCIArchive(ctx, buf.Bytes(), "flyio-it/killed-apply", "v1"); err != nil {
		t.Fatal(err)
	}
	const ns = "flyio-kill"
	pull := func() error { return e.ctrPull(ctx, ns, ref) }

	// Kill once the second layer (the payload's) is being extracted: the
	// first has been applied and a snapshot is mounted for the next.
	pulled := make(chan error, 1)
	go func() { pulled <- pull() }()
	firstApplied := fmt.Sprintf("layer=%q", img.Layers[0].Digest)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		logged, err := os.ReadFile(e.daemon.Proc.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		mounts, err := applyMounts()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(logged), firstApplied) && len(mounts) > 0 {
			break
		}
		select {
		case err := <-pulled:
			t.Fatalf("the pull ended before the second layer's apply was seen (%v); daemon log:\n%s", err, e.daemon.Proc.LogTail(20))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no apply of the second layer within 5 minutes; daemon log:\n%s", e.daemon.Proc.LogTail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	e.daemon.Proc.Kill()
	if err := <-pulled; err == nil {
		t.Fatal("the pull succeeded although the daemon applying its layer was killed")
	} else {
		t.Logf("the pull failed, as it must: %v", err)
	}
	left, err := applyMounts()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mounts the killed daemon left: %v", left)

	if err := e.daemon.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := applyMounts(); err != nil || len(left) != 0 {
		t.Errorf("after the restart, apply mounts %v (%v), want none: the daemon unmounts those its last run left", left, err)
	}
	// containerd dials a proxy plugin again with a backoff of up to 3 s:
	// until it has, its calls fail with a connection error, and an
	// operator's pull is tried again.
	for attempt := 1; ; attempt++ {
		err := pull()
		if err == nil {
			break
		}
		if attempt == 5 || !strings.Contains(err.Error(), "connection error") {
			t.Fatalf("the pull after the restart (attempt %d): %v\ndaemon log:\n%s", attempt, err, e.daemon.Proc.LogTail(30))
		}
		t.Logf("the pull after the restart, attempt %d: containerd has not dialled the daemon again yet", attempt)
		time.Sleep(2 * time.Second)
	}
	if err := e.unpackedInFlyio(ctx, ns, ref); err != nil {
		t.Fatal(err)
	}
	out, err := e.containerOutput(ctx, e.ctrArgv(ns, "run", "--rm", "--snapshotter", "flyio", ref, "ctr-killed-apply", "/bin/sh", "-c",
		"wc -c < "+ociimage.PayloadPath+"; cat "+ociimage.MarkerPath))
	if want := fmt.Sprintf("%d\n%s", killedLayerBytes, ociimage.MarkerContent); err != nil || out != want {
		t.Errorf("ctr run printed %q (%v), want %q", out, err, want)
	}
	if _, err := e.ctr(ctx, ns, "image", "rm", "--sync", ref); err != nil {
		t.Fatal(err)
	}
	if err := e.collectGarbage(ctx); err != nil {
		t.Fatal(err)
	}
	thins, err := e.ourThinDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(thins) != 0 {
		t.Errorf("after the image's removal and containerd's garbage collection our pool still holds %v", thins)
	}
	if left, err := applyMounts(); err != nil || len(left) != 0 {
		t.Errorf("apply mounts at the end: %v (%v), want none", left, err)
	}
}
