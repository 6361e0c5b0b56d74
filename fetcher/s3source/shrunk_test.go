package s3source_test

import (
	"context"
	"io"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestResumeOfAShrunkObjectIsAChange: an object overwritten by a shorter
// version while it is read, whose resume asks for a range past the new
// end, changed (as a 412 would say): the pull lists the image again
// instead of failing on the server's "invalid range".
func TestResumeOfAShrunkObjectIsAChange(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/01.tar", payload(200_000))
	src := newSource(t, srv, 0)
	objs, err := src.List(context.Background(), "img/")
	if err != nil || len(objs) != 1 {
		t.Fatalf("list: %v %v", objs, err)
	}
	srv.Faults.Truncate(1, "img/01.tar", 150_000)
	srv.Faults.BeforeGet("img/01.tar", "bytes=150000-", func() { srv.Put(t, "img/01.tar", payload(100)) })
	r := src.NewReader(context.Background(), objs[0], 3)
	defer r.Close()
	n, err := io.Copy(io.Discard, r)
	t.Logf("read %d bytes, %d resumes; requests %+v", n, r.Resumes(), srv.Faults.Recorded())
	if k := s3source.Classify(err); k != s3source.KindChanged {
		t.Errorf("read of an object that shrank to 100 bytes after 150000 were read: %v (kind %v), want kind changed", err, k)
	}
}
