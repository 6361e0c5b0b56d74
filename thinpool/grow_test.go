package thinpool

import "testing"

// TestBackingOvercommitted: loop files overcommit their filesystem when what
// they may still claim (virtual size less what they hold) is more than it
// has free; a pool on block devices never does.
func TestBackingOvercommitted(t *testing.T) {
	for _, c := range []struct {
		b    Backing
		want bool
	}{
		{Backing{Loop: true, FSFree: 50 << 30, Virtual: 101 << 30, Allocated: 1 << 30}, true},   // the default 100 GiB files on 50 GiB free
		{Backing{Loop: true, FSFree: 50 << 30, Virtual: 101 << 30, Allocated: 60 << 30}, false}, // 41 GiB still to claim
		{Backing{Loop: true, FSFree: 0, Virtual: 4 << 20, Allocated: 8 << 20}, false},           // fully allocated
		{Backing{FSFree: 0, Virtual: 0}, false},
	} {
		if got := c.b.Overcommitted(); got != c.want {
			t.Errorf("%+v: Overcommitted = %v, want %v (unbacked %d)", c.b, got, c.want, c.b.Unbacked())
		}
	}
}
