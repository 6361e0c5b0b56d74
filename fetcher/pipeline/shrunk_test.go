package pipeline

import "testing"

// TestPullObjectShrunkDuringResume: an object overwritten by a shorter
// version while it downloads, whose resume asks for bytes past the new
// end (a server that answers the range before If-Match: 416), is pulled
// again as S3 lists it now, like any object overwritten during a pull.
func TestPullObjectShrunkDuringResume(t *testing.T) {
	e := newPullEnv(t, nil)
	v1 := layerTar(t, "v1", 200_000)
	v2 := layerTar(t, "v2", 100)
	e.srv.Put(t, "shrink/1.tar", v1)
	e.srv.Faults.Truncate(1, "shrink/1.tar", 150_000)
	e.srv.Faults.BeforeGet("shrink/1.tar", "bytes=150000-", func() { e.srv.Put(t, "shrink/1.tar", v2) })
	res, err := e.pull("shrink/", "shrink")
	if err != nil {
		t.Fatalf("pull of an object that shrank while it downloaded: %v, want it pulled as it is now", err)
	}
	if got := e.sn.readFile(t, res.Snapshot.SnapshotName, "etc/marker"); got != "v2" {
		t.Errorf("activation shows marker %q, want v2", got)
	}
}
