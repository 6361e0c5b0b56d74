package s3source_test

import (
	"context"
	"fmt"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"io"
	"testing"
	"time"
)

// slowDownBurst is how long the burst tests keep S3 answering SlowDown:
// less than the pauses of a read's first resumes add up to at their
// shortest (100+200+400+800 ms), so a read with a budget of 5 rides it
// out with a resume to spare whatever the jitter.
const slowDownBurst = time.Second

// TestRangedReadRidesOutASlowDownBurst: S3 answering SlowDown to every
// request for a second, as it does to a fleet pulling one image at once,
// is ridden out by a ranged read as by a single stream with the same
// budget: the concurrent parts it refuses together are one burst, not one
// resume each taken from the read's budget, and the read does not end
// (throwing away the parts it has) while a single stream goes on.
func TestRangedReadRidesOutASlowDownBurst(t *testing.T) {
	for _, c := range []struct {
		name  string
		conns int
	}{{"one stream", 1}, {"ranged", 4}} {
		t.Run(c.name, func(t *testing.T) {
			srv := s3test.NewServer(t)
			src := partedSource(t, srv, part, c.conns)
			data := payload(8 * part)
			obj := putAndStat(t, srv, src, "burst.tar", data)
			// The burst begins once the read is under way: the GET of the
			// object's second part is answered, every later one refused; a
			// single stream's body is cut after two parts' worth of bytes,
			// and its resume meets the burst.
			rng := fmt.Sprintf("bytes=%d-%d", part, 2*part-1)
			if c.conns == 1 {
				rng = ""
				srv.Faults.DropAfter(1, "burst.tar", 2*part)
			}
			srv.Faults.BeforeGet("burst.tar", rng, func() { srv.Faults.FailFor(slowDownBurst, "burst.tar", 503, "SlowDown") })
			start := time.Now()
			r := src.NewReader(context.Background(), obj, 5)
			got, err := io.ReadAll(r)
			r.Close()
			if err != nil || len(got) != len(data) {
				t.Fatalf("read %d of %d bytes through a %v SlowDown burst after %v and %d resumes: %v", len(got), len(data), slowDownBurst, time.Since(start).Round(time.Millisecond), r.Resumes(), err)
			}
			if r.Resumes() == 0 {
				t.Errorf("no resume: the burst did not hit the read")
			}
			t.Logf("read through the burst in %v with %d resumes", time.Since(start).Round(time.Millisecond), r.Resumes())
		})
	}
}
