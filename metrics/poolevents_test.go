package metrics

import "testing"

// TestPoolEventsCount: low-water events and growths are counted with the
// bytes added; a "growth" that added nothing counts nothing.
func TestPoolEventsCount(t *testing.T) {
	m := New()
	e := NewPoolEvents("p1")
	m.AddPoolEvents(e)
	e.LowWater()
	e.LowWater()
	e.Grew(32<<20, 40<<20)
	e.Grew(40<<20, 40<<20)
	if got := counters(t, m, Namespace+"_pool_low_water_events_total"); got["pool=p1"] != 2 {
		t.Errorf("low-water events = %v", got)
	}
	if got := counters(t, m, Namespace+"_pool_growths_total"); got["pool=p1"] != 1 {
		t.Errorf("growths = %v", got)
	}
	if got := counters(t, m, Namespace+"_pool_grown_bytes_total"); got["pool=p1"] != 8<<20 {
		t.Errorf("grown bytes = %v", got)
	}
}
