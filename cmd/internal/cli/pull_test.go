package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// TestPullImageArgument: pull takes an s3:// URL, or a bare path that the
// daemon resolves under its s3.bucket and s3.prefix (so the CLI sends no
// bucket).
func TestPullImageArgument(t *testing.T) {
	for _, c := range []struct {
		arg, bucket, key, err string
	}{
		{"s3://my-images/debian/", "my-images", "debian/", ""},
		{"debian/", "", "debian/", ""},
		{"base/1.tar", "", "base/1.tar", ""},
		{"/debian/", "", "", "without a leading '/'"},
		{"s3://only-bucket", "", "", "must name a bucket and a key"},
		{"http://x/y", "", "", "must be s3://"},
	} {
		bucket, key, err := parseImageArg(c.arg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %q %q %v, want an error with %q", c.arg, bucket, key, err, c.err)
			}
			continue
		}
		if err != nil || bucket != c.bucket || key != c.key {
			t.Errorf("%q: %q %q %v, want %q %q", c.arg, bucket, key, err, c.bucket, c.key)
		}
	}
}

// TestPullResultSaysWhenNotInContainerd: a pull made while containerd's
// socket was absent says, beside its one result line, that containerd does
// not have the image yet and that the daemon registers it later; a registered one, or one a daemon
// with no containerd to register in made, says nothing more.
func TestPullResultSaysWhenNotInContainerd(t *testing.T) {
	for _, c := range []struct {
		snap api.ActivateResponse
		says bool
	}{
		{api.ActivateResponse{RegisterPending: true}, true},
		{api.ActivateResponse{Registered: true}, false},
		{api.ActivateResponse{}, false},
	} {
		var out, notes strings.Builder
		printPullResult(&out, &notes, &api.PullResult{Ref: "app:v1", Snapshot: c.snap}, time.Second)
		if says := strings.Contains(notes.String(), "app:v1 is not in containerd yet"); says != c.says || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("%+v: pull printed %q and noted %q; want the one result line, and the note only when pending", c.snap, out.String(), notes.String())
		}
	}
}
