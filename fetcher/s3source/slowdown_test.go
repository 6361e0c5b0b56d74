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
// each connection of a ranged read alike, instead of at once: S3 asks for
// fewer requests, and a fleet retrying at once would keep it throttled.
// The object still comes back whole.
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
			// Two for each connection, which asks for one part.
			throttled := 2 * c.conns
			srv.Faults.FailNext(throttled, "slow.tar", 503, "SlowDown")
			r := readWhole(t, src, obj, 5, data)
			if r.Resumes() != throttled {
				t.Errorf("resumes %d, want %d", r.Resumes(), throttled)
			}
			// Each throttled GET's range is asked again only after a pause,
			// and the pauses of one range grow (which GET of the ranged
			// read was throttled is up to its workers).
			reqs := gets(srv, "slow.tar")
			gaps := map[string][]time.Duration{}
			for i, q := range reqs[:throttled] {
				for _, next := range reqs[i+1:] {
					if next.Range == q.Range {
						gaps[q.Range] = append(gaps[q.Range], next.At.Sub(q.At))
						break
					}
				}
			}
			n, grown := 0, false
			for rng, g := range gaps {
				n += len(g)
				for i, d := range g {
					if least := minResumePause << i; d < least {
						t.Errorf("range %q asked again after %v, want at least %v after its throttled GET %d", rng, g, least, i+1)
					}
				}
				grown = grown || len(g) > 1
			}
			if n != throttled || !grown {
				t.Fatalf("%d throttled GETs asked again, want %d, one range at least twice: %+v", n, throttled, reqs)
			}
		})
	}
}
