package pipeline

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

// TestPullImageSizeSumDoesNotOverflow: a listing whose layer sizes add up
// past what an int64 holds is an image too large, refused before any GET
// or any room is asked of the pool, like one whose sum fits.
func TestPullImageSizeSumDoesNotOverflow(t *testing.T) {
	e := newPullEnvWith(t, nil, func(o *Options) { o.MaxImageSize = 1 << 30 })
	e.srv.Faults.Answer(1, "", func(int) []byte {
		b := `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>` + e.srv.Bucket +
			`</Name><Prefix>big/</Prefix><Delimiter>/</Delimiter><MaxKeys>1000</MaxKeys><KeyCount>2</KeyCount><IsTruncated>false</IsTruncated>`
		for _, k := range []string{"big/1.tar", "big/2.tar"} {
			b += fmt.Sprintf(`<Contents><Key>%s</Key><Size>%d</Size><ETag>"e"</ETag><LastModified>2024-01-01T00:00:00.000Z</LastModified><StorageClass>STANDARD</StorageClass></Contents>`, k, int64(1)<<62)
		}
		return []byte(b + `</ListBucketResult>`)
	})
	_, err := e.pull("big/", "")
	if !errors.Is(err, ErrImageTooLarge) {
		t.Errorf("pull of two layers of 2^62 bytes each with max image size 1 GiB: %v, want ErrImageTooLarge", err)
	}
	if n := e.srv.Requests(http.MethodGet, "big/1.tar"); n != 0 {
		t.Errorf("%d GETs of big/1.tar, want none", n)
	}
}
