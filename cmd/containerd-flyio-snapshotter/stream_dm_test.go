//go:build dm

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
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
	if o, err := db.ObjectRecord(context.Background(), e.srv.Bucket, "evil/1.tar"); err != nil || o != nil {
		t.Errorf("object record of the rejected layer: %+v, %v", o, err)
	}
	snaps, err := db.SnapshotterReads().Snapshots(context.Background(), "", true)
	if err != nil || len(snaps) != 0 {
		t.Errorf("snapshots recorded: %+v, %v; want none", snaps, err)
	}
}
