package thinpool

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// DefaultLowWaterPercent sizes the low-water mark when
// Config.LowWaterMark is zero: the kernel raises its event once the
// free data blocks fall to this percent of the pool's data blocks, early
// enough for a collection or a growth to finish before writes run out.
const DefaultLowWaterPercent = 10

// lowWaterBlocks is the low-water mark loaded with a data device of
// totalBlocks blocks: the configured count; else the reserve's blocks, so
// that the event comes when new devices start being refused and the
// owner collects and grows before the running devices eat the reserve;
// else DefaultLowWaterPercent of the blocks (at least one).
func (p *Pool) lowWaterBlocks(totalBlocks uint64) uint64 {
	if p.cfg.LowWaterMark != 0 {
		return p.cfg.LowWaterMark
	}
	if r := ReserveBlocks(totalBlocks, p.cfg.MinFreeSpace.Value()); r > 0 {
		return r
	}
	return max(1, totalBlocks*DefaultLowWaterPercent/100)
}

// LowWaterRecheckInterval is how long Watch waits, after reporting the
// pool at or under its low-water mark, before it reads the status again
// and reports the pool once more if it is still there. The kernel raises
// the low-water event once per crossing (a table resume re-arms it), so
// without this a growth or collection that failed at the event would not
// be tried again until the pool ran out of data space.
const LowWaterRecheckInterval = time.Minute

// Event is what Watch reports: a device-mapper event the kernel raised on
// the pool (the data low-water mark crossed, a mode change: out of data
// space, read-only, back to rw; the metadata low-water mark crossed), or
// the pool found at or under its data low-water mark without one (see
// Recheck).
type Event struct {
	// EventNr is the pool's event counter after the event.
	EventNr uint32
	// Status is the pool's status when the wait returned.
	Status PoolStatus
	// LowWater is true when the free data blocks are at or under the
	// pool's low-water mark.
	LowWater bool
	// LowWaterBlocks is the low-water mark of the live table.
	LowWaterBlocks uint64
	// Recheck is true when the kernel raised no event since the last one
	// reported: Watch read the status LowWaterRecheckInterval after
	// reporting the pool at or under its mark and found it still there.
	// The report Watch makes when it starts on a pool already at or under
	// its mark stands for the crossing nobody watched and has Recheck
	// false.
	Recheck bool
}

// Watch calls fn with each event the kernel raises on the pool until ctx is
// done, then returns ctx's error. It waits with the DM_DEV_WAIT ioctl on
// the pool's event counter, so no event is lost between two waits (a wait
// for a counter the pool has already passed returns at once) and no
// dmeventd is needed. fn runs on Watch's goroutine: events raised while it
// runs are reported once it returns, merged into one.
//
// The kernel raises the low-water event only when the free data blocks
// cross the mark, so Watch also reports the pool's state without one
// (LowWater set, EventNr the current counter): once when it starts on a
// pool already at or under its mark (it crossed while nobody watched: the
// daemon was down or restarting), and then every LowWaterRecheckInterval
// while the pool stays there (Event.Recheck), so a handler that failed to
// make room is called again.
//
// The kernel offers no way to interrupt DM_DEV_WAIT from Go (the runtime's
// signals restart it), so when ctx ends the wait still under way is left to
// end with the pool's next event; it holds nothing but a goroutine.
func (p *Pool) Watch(ctx context.Context, fn func(ctx context.Context, ev Event)) error {
	if err := p.usable(); err != nil {
		return err
	}
	info, err := p.ctl.info(p.name)
	if err != nil {
		return p.errf(nil, err, "watch: event counter")
	}
	last := info.EventNr
	under := false
	if ev, ok := p.lowWaterNow(ctx, last); ok {
		under = true
		fn(ctx, ev)
	}
	type result struct {
		nr      uint32
		targets []dmTarget
		err     error
	}
	var ch chan result // the wait under way, nil when none is
	for {
		if ch == nil {
			ch = make(chan result, 1)
			go func(ch chan<- result, after uint32) {
				nr, targets, err := p.ctl.wait(p.name, after)
				ch <- result{nr, targets, err}
			}(ch, last)
		}
		var recheck <-chan time.Time
		timer := time.NewTimer(p.recheckInterval())
		if under {
			recheck = timer.C
		}
		var r result
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-recheck:
			ev, ok := p.lowWaterNow(ctx, last)
			if under = ok; ok {
				ev.Recheck = true
				fn(ctx, ev)
			}
			continue
		case r = <-ch:
			timer.Stop()
			ch = nil
		}
		if r.err != nil {
			return p.errf(nil, r.err, "watch: wait for event %d", last+1)
		}
		last = r.nr
		ev := Event{EventNr: r.nr}
		if len(r.targets) == 1 && r.targets[0].Type == "thin-pool" {
			if st, err := parsePoolStatus(r.targets[0].Params); err == nil {
				st.BlockSizeSectors = p.blockSize
				ev.Status = st
			}
		}
		if ev.Status.TotalDataBlocks == 0 && ev.Status.Mode == "" {
			if ev.Status, err = p.status(true); err != nil {
				log.G(ctx).WithError(err).WithField("pool", p.name).Warn("thinpool: status after an event")
			}
		}
		p.markLowWater(&ev)
		under = ev.LowWater
		fn(ctx, ev)
	}
}

// recheckInterval is LowWaterRecheckInterval unless a test shortened it.
func (p *Pool) recheckInterval() time.Duration {
	if p.lowWaterRecheck > 0 {
		return p.lowWaterRecheck
	}
	return LowWaterRecheckInterval
}

// markLowWater sets ev's low-water fields from the live table's mark and
// ev.Status. A status without data blocks (a failed pool, or one that
// could not be read) says nothing of the free blocks: it is not low water.
func (p *Pool) markLowWater(ev *Event) {
	if t, _, err := p.liveTable(); err == nil {
		ev.LowWaterBlocks = t.LowWater
		ev.LowWater = ev.Status.TotalDataBlocks > 0 && ev.Status.TotalDataBlocks-ev.Status.UsedDataBlocks <= t.LowWater
	}
}

// lowWaterNow reads the pool's status (committed first, so blocks freed
// since the last commit count as free) and returns it as an event with
// counter nr when the pool is at or under its low-water mark. ok is false
// when it is not, and when the status cannot be read or holds no data
// blocks (a failed pool): there is nothing a handler could grow then.
func (p *Pool) lowWaterNow(ctx context.Context, nr uint32) (ev Event, ok bool) {
	st, err := p.status(false)
	if err != nil {
		log.G(ctx).WithError(err).WithField("pool", p.name).Warn("thinpool: status for the low-water mark")
		return Event{}, false
	}
	ev = Event{EventNr: nr, Status: st}
	p.markLowWater(&ev)
	return ev, ev.LowWater && st.TotalDataBlocks > 0
}

// wait blocks until the event counter of device name differs from after
// (DM_DEV_WAIT) and returns the new counter with the targets' status.
func (c *dmControl) wait(name string, after uint32) (uint32, []dmTarget, error) {
	r, err := c.ioctl(unix.DM_DEV_WAIT, dmRequest{name: name, eventNr: after})
	if err != nil {
		return 0, nil, err
	}
	t, err := parseTargets(r.data, r.hdr.Target_count)
	if err != nil {
		return r.hdr.Event_nr, nil, fmt.Errorf("%s %q: %w", dmCmdName(unix.DM_DEV_WAIT), name, err)
	}
	return r.hdr.Event_nr, t, nil
}
