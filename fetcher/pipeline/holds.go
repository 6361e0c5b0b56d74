package pipeline

import "sync"

// chainHolds counts, per chain, the pulls under way that build on it
// (Pipelines.Guard).
type chainHolds struct {
	mu sync.Mutex
	n  map[string]int
}

// hold counts one more pull building on chain until release is called.
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
