package s3source_test

import (
	"net/http"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
)

// TestCutsAfterProgressAreResumed: a large object whose bodies are cut
// more times than the resume budget, each after more than
// s3source.ResumeProgress bytes of it, still comes back whole: such a cut
// moved the read on, and a budget that counted it would fail every read
// of an object large enough to see a few, the download starting over
// from its first byte each time. Cuts that bring less still end the read
// within the budget (TestResumingReader, TestRangedReaderResumeBudget).
func TestCutsAfterProgressAreResumed(t *testing.T) {
	const budget = 2
	t.Run("one stream", func(t *testing.T) {
		srv := s3test.NewServer(t)
		src := partedSource(t, srv, 16<<20, 1)
		data := payload(8 << 20)
		obj := putAndStat(t, srv, src, "far.tar", data)
		srv.Faults.Truncate(6, "far.tar", s3source.ResumeProgress+1)
		r := readWhole(t, src, obj, budget, data)
		if r.Resumes() != 6 || srv.Requests(http.MethodGet, "far.tar") != 7 {
			t.Errorf("resumes %d, GETs %d; want 6 and 7", r.Resumes(), srv.Requests(http.MethodGet, "far.tar"))
		}
	})
	t.Run("ranged", func(t *testing.T) {
		srv := s3test.NewServer(t)
		const ps = 4 << 20
		src := partedSource(t, srv, ps, 2)
		data := payload(4 * ps)
		obj := putAndStat(t, srv, src, "far.tar", data)
		// Each part's first GET is cut half-way; its resume, asking for
		// the half left, is sent it whole.
		srv.Faults.Truncate(8, "far.tar", ps/2)
		r := readWhole(t, src, obj, budget, data)
		if r.Resumes() != 4 {
			t.Errorf("resumes %d, want 4 (one per part)", r.Resumes())
		}
	})
}
