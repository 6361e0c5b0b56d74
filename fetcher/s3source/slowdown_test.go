package s3source_test

import (
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// minResumePause is the least a reader waits before reopening a read whose
// request was answered with an error: half its first backoff (jitter).
const minResumePause = 100 * time.Millisecond

// TestSlowDownIsBackedOff: a GET answered 503 SlowDown is asked again
// only after a pause that grows with each one, by a single stream and by
// a ranged read alike, instead of at once: S3 asks for fewer requests,
// and a fleet retrying at once would keep it throttled. The object still
// comes back whole.
func TestSlowDownIsBackedOff(t *testing.T) {
	for _, c := range []struct {
		name  string
		conns int
	}{{"one stream", 1}, {"ranged", 4}} {
		t.Run(c.name, func(t *testing.T) {
			srv := s3test.NewServer(t)
			src := partedSource(t, srv, part, c.conns)
			data := payload(3*part + 1)
			obj := putAndStat(t, srv, src, "slow.tar", data)
			srv.Faults.FailNext(2, "slow.tar", 503, "SlowDown")
			r := readWhole(t, src, obj, 5, data)
			if r.Resumes() != 2 {
				t.Errorf("resumes %d, want 2", r.Resumes())
			}
			// Each throttled GET's range is asked again only after a pause,
			// and the pauses grow (which request took which pause is up to
			// the workers of a ranged read).
			reqs := gets(srv, "slow.tar")
			var gaps []time.Duration
			for i, q := range reqs[:2] {
				for _, next := range reqs[i+1:] {
					if next.Range == q.Range {
						gaps = append(gaps, next.At.Sub(q.At))
						break
					}
				}
			}
			if len(gaps) != 2 {
				t.Fatalf("%d throttled GETs asked again, want 2: %+v", len(gaps), reqs)
			}
			if min(gaps[0], gaps[1]) < minResumePause || max(gaps[0], gaps[1]) < 2*minResumePause {
				t.Errorf("throttled GETs asked again after %v, want at least %v and one at least %v", gaps, minResumePause, 2*minResumePause)
			}
		})
	}
}
