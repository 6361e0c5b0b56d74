package thinpool

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"
)

// ReserveBlocks is the number of blocks, out of total, that a reserve of
// percent keeps free: rounded up, so that a reserve above 0 keeps at least
// one block.
func ReserveBlocks(total uint64, percent float64) uint64 {
	if percent <= 0 || total == 0 {
		return 0
	}
	x := float64(total) * percent / 100
	// The product is a few units in the last place off: a reserve that is
	// a whole number of blocks (1.1% of 3000, 33.000000000000004) is that
	// number, not one more.
	if r := math.Round(x); math.Abs(x-r) <= 4*x*0x1p-52 {
		x = r
	}
	return min(total, uint64(math.Ceil(x)))
}

// ReserveBytes returns the data and metadata bytes a reserve of percent
// keeps free in the pool st describes (ReserveBlocks of each, in bytes).
func (st PoolStatus) ReserveBytes(percent float64) (data, metadata uint64) {
	return ReserveBlocks(st.TotalDataBlocks, percent) * uint64(st.BlockSizeSectors) * 512,
		ReserveBlocks(st.TotalMetadataBlocks, percent) * metaBlockSize
}

// ReserveError returns ErrBelowReserve, in a message naming what is free,
// the reserve and setting (where the operator changes it, when not empty),
// when the free data blocks or the free metadata blocks of st are fewer
// than percent of the pool's (ReserveBlocks); nil otherwise, and always
// for a percent of 0. It does not judge a pool that cannot allocate at all
// (FullError does).
func (st PoolStatus) ReserveError(percent float64, setting string) error {
	if percent <= 0 {
		return nil
	}
	check := func(what string, used, total, blockBytes uint64) error {
		need := ReserveBlocks(total, percent)
		free := total - min(used, total)
		if free >= need {
			return nil
		}
		where := ""
		if setting != "" {
			where = fmt.Sprintf("; free space in the pool, or lower %s", setting)
		}
		return fmt.Errorf("%s %.1f%% free (%s of %s), under the %v%% reserve (%s) kept for the writes of running containers%s: %w",
			what, 100*float64(free)/float64(total), humanBytes(free*blockBytes), humanBytes(total*blockBytes),
			percent, humanBytes(need*blockBytes), where, ErrBelowReserve)
	}
	if err := check("data", st.UsedDataBlocks, st.TotalDataBlocks, uint64(st.BlockSizeSectors)*512); err != nil {
		return err
	}
	return check("metadata", st.UsedMetadataBlocks, st.TotalMetadataBlocks, metaBlockSize)
}

// humanBytes writes n with the largest binary unit under it, one decimal.
func humanBytes(n uint64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v, u := float64(n)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v, u = v/1024, u+1
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[u]
}

// noSpaceTimeoutPath is the dm_thin_pool module parameter holding how
// long, in whole seconds, a pool out of data space queues writes before
// failing them (0: forever). It is one value for every pool of the host.
var noSpaceTimeoutPath = "/sys/module/dm_thin_pool/parameters/no_space_timeout"

// NoSpaceTimeout returns the kernel's no-space timeout: how long a pool
// out of data space queues the writes that need a new block before
// failing them (0: it queues them until space comes).
func NoSpaceTimeout() (time.Duration, error) {
	b, err := os.ReadFile(noSpaceTimeoutPath)
	if err != nil {
		return 0, fmt.Errorf("thinpool: read the no-space timeout: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("thinpool: %s holds %q: %w", noSpaceTimeoutPath, strings.TrimSpace(string(b)), err)
	}
	return time.Duration(n) * time.Second, nil
}

// syncNoSpaceTimeout sets the kernel's no-space timeout to
// Config.NoSpaceTimeout when it differs. Not being able to (a read-only
// /sys) is logged, not fatal: the pool works with the kernel's value, and
// `pool status` shows which.
func (p *Pool) syncNoSpaceTimeout(ctx context.Context) {
	want := p.cfg.NoSpaceTimeout.Duration
	if want <= 0 {
		return
	}
	lg := log.G(ctx).WithField("pool", p.name).WithField("want_seconds", int64(want/time.Second))
	got, err := NoSpaceTimeout()
	if err == nil && got == want {
		return
	}
	if err == nil {
		lg = lg.WithField("was_seconds", int64(got/time.Second))
		err = os.WriteFile(noSpaceTimeoutPath, []byte(strconv.FormatInt(int64(want/time.Second), 10)), 0)
	}
	if err != nil {
		lg.WithError(err).Warn("thinpool: cannot set the kernel's no-space timeout; writes on a full pool wait for the kernel's value")
		return
	}
	lg.Info("thinpool: no-space timeout set (one value for every thin pool of the host)")
}
