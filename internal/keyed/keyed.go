// Package keyed provides a mutex per key, for work that must not overlap
// on one object (a thin device id) while work on others goes on.
package keyed

import "sync"

// Mutex serialises callers per key of type K; the zero value is ready to
// use. A key's entry lives only while someone holds or waits for it.
type Mutex[K comparable] struct {
	mu    sync.Mutex
	locks map[K]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int
}

// Lock waits until no one else holds key, takes it and returns the
// function that releases it, which must be called exactly once.
func (k *Mutex[K]) Lock(key K) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = make(map[K]*entry)
	}
	e := k.locks[key]
	if e == nil {
		e = &entry{}
		k.locks[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
