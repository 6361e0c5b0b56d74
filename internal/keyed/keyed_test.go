package keyed

import (
	"sync"
	"testing"
	"time"
)

// TestMutexSerialisesOneKeyOnly: a second Lock of a held key waits for its
// release, while another key is taken at once; released keys leave no
// entry behind.
func TestMutexSerialisesOneKeyOnly(t *testing.T) {
	var k Mutex[uint32]
	unlock := k.Lock(1)
	got, released := make(chan struct{}), make(chan struct{})
	go func() {
		u := k.Lock(1)
		close(got)
		u()
		close(released)
	}()
	k.Lock(2)() // another key: not blocked by 1
	select {
	case <-got:
		t.Fatal("Lock(1) returned while 1 was held")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	<-got
	<-released
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); k.Lock(3)() }()
	}
	wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.locks) != 0 {
		t.Errorf("%d entries left after every lock was released", len(k.locks))
	}
}
