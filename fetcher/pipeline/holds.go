package pipeline

import "sync"

// chainHolds counts, per id, the pulls under way that hold it: per chain,
// those that build on it (Pipelines.Guard); per download or activate
// idempotency id, the pulls and activates that will still read its run
// (Pipelines.Retain).
type chainHolds struct {
	mu sync.Mutex
	n  map[string]int
}

// hold counts one more pull holding chain until release is called.
func (h *chainHolds) hold(chain string) (release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[chain]++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.n[chain]--; h.n[chain] == 0 {
			delete(h.n, chain)
		}
	}
}

func (h *chainHolds) count(chain string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[chain]
}

// ids lists the ids held now.
func (h *chainHolds) ids() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.n))
	for id := range h.n {
		out = append(out, id)
	}
	return out
}
