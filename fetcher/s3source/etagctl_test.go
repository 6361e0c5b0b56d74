package s3source_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestListedETagWithControlCharacter: a listing whose ETag holds a line
// break cannot be sent back as If-Match: the listing is refused, naming
// the object, as invalid, instead of every read failing as if the
// network had (retryable, tried again and again).
func TestListedETagWithControlCharacter(t *testing.T) {
	srv := s3test.NewServer(t)
	srv.Put(t, "img/01.tar", payload(1000))
	srv.Faults.Answer(1, "", func(int) []byte {
		return []byte(`<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>` + srv.Bucket +
			`</Name><Prefix>img/</Prefix><Delimiter>/</Delimiter><MaxKeys>1000</MaxKeys><KeyCount>1</KeyCount><IsTruncated>false</IsTruncated>` +
			`<Contents><Key>img/01.tar</Key><Size>1000</Size><ETag>"ab&#10;cd"</ETag><LastModified>2024-01-01T00:00:00.000Z</LastModified><StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>`)
	})
	src := newSource(t, srv, 0)
	objs, err := src.ResolveImage(context.Background(), "img/")
	if err == nil {
		r := src.NewReader(context.Background(), objs[0], 3)
		_, err = io.Copy(io.Discard, r)
		r.Close()
	}
	if k := s3source.Classify(err); k != s3source.KindInvalid {
		t.Errorf("listing with an ETag holding a line break, then reading it: %v (kind %v), want kind invalid", err, k)
	}
	if n := srv.Requests(http.MethodGet, "img/01.tar"); n > 1 {
		t.Errorf("%d GETs of the object, want at most one", n)
	}
}
