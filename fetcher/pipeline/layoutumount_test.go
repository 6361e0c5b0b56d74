package pipeline

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// TestPullLayoutRefusalKeptWhenUnmountFails: an image whose layout the
// policy refuses, checked through a mount that then cannot be unmounted
// (kept busy), fails; the pull's error must still say the layout was
// refused, not only that the unmount failed: the refusal is the reason
// the image is not accepted, and what the operator must act on.
func TestPullLayoutRefusalKeptWhenUnmountFails(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "bad/1.tar", noVarTar(t))
	_, imageID := imageSource(e.srv.Bucket, "bad/")
	inner := e.p.mountAt
	e.p.mountAt = func(ms []mount.Mount, dir string) (func() error, error) {
		umount, err := inner(ms, dir)
		if err != nil || filepath.Base(dir) != imageID {
			return umount, err
		}
		// A busy unmount (fake, at the mount boundary): the mount is
		// undone, and the unmount still reports it busy.
		return func() error {
			if err := umount(); err != nil {
				return err
			}
			return fmt.Errorf("injected: unmount %s: %w", dir, syscall.EBUSY)
		}, nil
	}
	_, err := e.pull("bad/", "bad")
	if err == nil {
		t.Fatal("an image without var/ was accepted")
	}
	if !errors.Is(err, tarball.ErrLayoutMissing) {
		t.Errorf("pull of an image without var/ whose check's unmount failed: %v; want the layout refusal (tarball.ErrLayoutMissing) in the error", err)
	}
	if ok, err := e.sn.Exists(context.Background(), ActivationKey(imageID)); err != nil || ok {
		t.Errorf("the refused image's activation is left: %v, %v", ok, err)
	}
}
