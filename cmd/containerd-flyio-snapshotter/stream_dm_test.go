//go:build dm

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// TestRejectedWhileExtracting: a layer the policy refuses at its last
// entry (a device node), whose extraction into the pool began while it
// downloaded, fails the pull with the entry named; nothing is committed
// and nothing is left: no device, no extraction snapshot, no mount, no temp
// file, no object or chain record.
func TestRejectedWhileExtracting(t *testing.T) {
	e := newPullEnv(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	for _, d := range []string{"etc/", "usr/", "var/", "usr/data/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime}); err != nil {
			t.Fatal(err)
		}
	}
	body := bytes.Repeat([]byte("layer data "), 6000)
	for i := range 200 {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("usr/data/f%03d", i), Mode: 0o644, Size: int64(len(body)), ModTime: mtime}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeChar, Name: "dev/evil", Mode: 0o666, Devmajor: 1, Devminor: 3, ModTime: mtime}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	e.srv.Put(t, "evil/1.tar", buf.Bytes())
	// The transfer starts late, so the extraction follows it from its
	// first byte.
	e.srv.Faults.Delay(1, "evil/1.tar", time.Second)
	_, err := e.pull("evil/", "")
	if err == nil || !strings.Contains(err.Error(), "dev/evil") {
		t.Fatalf("pull of a layer ending in a device node: %v, want a rejection naming dev/evil", err)
	}
	if !strings.Contains(e.d.stderr.String(), "extraction while downloading stopped") {
		t.Errorf("the daemon's log does not show the extraction that began while downloading; log tail:\n%s", tail(e.d.stderr.String(), 3000))
	}
	e.checkClean()
	db := e.db()
	if o, err := pipeline.RecordsOf(db).ObjectRecord(context.Background(), e.srv.Bucket, "evil/1.tar"); err != nil || o != nil {
		t.Errorf("object record of the rejected layer: %+v, %v", o, err)
	}
	snaps, err := snapshotter.ReadRecords(db).Snapshots(context.Background())
	if err != nil || len(snaps) != 0 {
		t.Errorf("snapshots recorded: %+v, %v; want none", snaps, err)
	}
}

// rangedEnv is a pull environment whose daemon reads objects larger than
// 1 MiB as ranged parts of 1 MiB, two at a time.
func rangedEnv(t *testing.T) *pullEnv {
	return newPullEnvTB(t, func(c *plugin.Config) {
		c.S3.PartSize = plugin.Size(s3source.MinPartSize)
		c.S3.ConnectionsPerObject = 2
	})
}

// TestRangedPartFaults: the daemon's ranged download of a layer survives
// a connection reset in the middle of a part (resumed from the byte
// reached), and an object overwritten between two of its parts is pulled
// as S3 lists it afterwards, never mixed with the version the first parts
// came from.
func TestRangedPartFaults(t *testing.T) {
	e := rangedEnv(t)
	t.Run("reset mid-part", func(t *testing.T) {
		e.srv.Put(t, "reset/1.tar", genLayer(t, 31, "r", 64, 64<<10, true)) // 4 MiB
		e.srv.Faults.DropAfter(1, "reset/1.tar", s3source.MinPartSize+s3source.MinPartSize/2)
		res, err := e.pull("reset/", "")
		if err != nil {
			t.Fatalf("pull with a reset in the middle of a part: %v", err)
		}
		e.checkActive(res, "r/f00063")
		e.checkClean()
	})
	t.Run("overwritten between parts", func(t *testing.T) {
		v1 := genLayer(t, 41, "old", 64, 64<<10, true)
		v2 := genLayer(t, 42, "new", 64, 64<<10, true)
		e.srv.Put(t, "ow/1.tar", v1)
		e.srv.Faults.BeforeGet("ow/1.tar", fmt.Sprintf("bytes=%d-%d", 2*s3source.MinPartSize, 3*s3source.MinPartSize-1), func() { e.srv.Put(t, "ow/1.tar", v2) })
		res, err := e.pull("ow/", "")
		if err != nil {
			t.Fatalf("pull of an object overwritten between its parts: %v", err)
		}
		e.checkActive(res, "new/f00063")
		dir := t.TempDir()
		if out, err := exec.Command("mount", "-o", "ro,noload", res.Snapshot.DevicePath, dir).CombinedOutput(); err != nil {
			t.Fatalf("mount: %v: %s", err, out)
		}
		defer exec.Command("umount", dir).Run()
		if _, err := os.Stat(filepath.Join(dir, "old")); !os.IsNotExist(err) {
			t.Errorf("the image holds the old version's folder (%v): two versions mixed", err)
		}
		if got := res.Layers[0].DiffID; got != fmt.Sprintf("sha256:%x", sha256.Sum256(v2)) {
			t.Errorf("layer's diff ID %s, want the new version's", got)
		}
		e.checkClean()
	})
}
