package thinpool

import (
	"errors"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// TestWritesQueuedFromStatus: whether a pool out of data space is queueing
// writes or failing them is read from its status line, as the kernel
// prints it before and after the no-space timeout.
func TestWritesQueuedFromStatus(t *testing.T) {
	for _, c := range []struct {
		line            string
		queued, failing bool
	}{
		{"3 20/4096 4096/4096 - out_of_data_space ignore_discard queue_if_no_space - 1024", true, false},
		{"3 20/4096 4096/4096 - out_of_data_space ignore_discard error_if_no_space - 1024", false, true},
		{"3 20/4096 100/4096 - rw ignore_discard queue_if_no_space - 1024", false, false},
		{"3 20/4096 100/4096 - rw ignore_discard error_if_no_space - 1024", false, false},
		{"3 20/4096 4096/4096 - out_of_data_space", false, false}, // an old kernel says neither
	} {
		st, err := parsePoolStatus(c.line)
		if err != nil {
			t.Fatalf("parsePoolStatus(%q): %v", c.line, err)
		}
		if st.WritesQueued() != c.queued || st.WritesFailing() != c.failing {
			t.Errorf("%q: queued %v, failing %v; want %v, %v", c.line, st.WritesQueued(), st.WritesFailing(), c.queued, c.failing)
		}
	}
}

func TestReserveBlocks(t *testing.T) {
	for _, c := range []struct {
		total   uint64
		percent float64
		want    uint64
	}{
		{1000, 10, 100},
		{1001, 10, 101}, // rounded up: the reserve is never short of its percent
		{5, 10, 1},
		{4096, 0, 0},
		{0, 10, 0},
		{100, 99.5, 100},
	} {
		if got := ReserveBlocks(c.total, c.percent); got != c.want {
			t.Errorf("ReserveBlocks(%d, %v) = %d, want %d", c.total, c.percent, got, c.want)
		}
	}
}

// TestReserveError: a pool whose free data or metadata is under the
// reserve refuses with ErrBelowReserve (an ErrPoolFull), naming what is
// free, the reserve and the setting to change; at the reserve exactly, or
// without a reserve, it does not.
func TestReserveError(t *testing.T) {
	// 4096 data blocks of 64 KiB (256 MiB): the 10% reserve is 410 blocks.
	st := PoolStatus{UsedMetadataBlocks: 100, TotalMetadataBlocks: 4096, TotalDataBlocks: 4096, BlockSizeSectors: 128, Mode: ModeReadWrite}
	st.UsedDataBlocks = 4096 - 410
	if err := st.ReserveError(10, "pool.min_free_space"); err != nil {
		t.Fatalf("free data at the reserve exactly: %v", err)
	}
	st.UsedDataBlocks = 4096 - 409
	err := st.ReserveError(10, "pool.min_free_space")
	if !errors.Is(err, ErrBelowReserve) || !errors.Is(err, ErrPoolFull) || errors.Is(err, ErrDataFull) {
		t.Fatalf("one block under the reserve: %v; want ErrBelowReserve (an ErrPoolFull, not ErrDataFull)", err)
	}
	for _, want := range []string{"data 10.0% free", "25.6 MiB of 256.0 MiB", "10% reserve (25.6 MiB)", "pool.min_free_space"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := st.ReserveError(0, "pool.min_free_space"); err != nil {
		t.Errorf("no reserve: %v", err)
	}
	st.UsedDataBlocks = 0
	st.UsedMetadataBlocks = 4000
	err = st.ReserveError(10, "")
	if !errors.Is(err, ErrBelowReserve) || !strings.Contains(err.Error(), "metadata 2.3% free (384.0 KiB of 16.0 MiB)") {
		t.Fatalf("metadata under the reserve: %v; want ErrBelowReserve naming the metadata", err)
	}
	if strings.Contains(err.Error(), "lower") {
		t.Errorf("refusal %q names a setting though none was given", err)
	}
}

// TestLowWaterAtReserve: the default low-water mark is the reserve's
// edge, so the kernel's event comes when refusals begin; a configured
// mark, or no reserve, keeps the mark it had.
func TestLowWaterAtReserve(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want uint64
	}{
		{Config{MinFreeSpace: conf.Pct(10)}, 410},
		{Config{MinFreeSpace: conf.Pct(25)}, 1024},
		{Config{MinFreeSpace: conf.Pct(25), LowWaterMark: 7}, 7},
		{Config{}, 409}, // DefaultLowWaterPercent
	} {
		p := &Pool{cfg: c.cfg}
		if got := p.lowWaterBlocks(4096); got != c.want {
			t.Errorf("%+v: low-water mark of 4096 blocks = %d, want %d", c.cfg, got, c.want)
		}
	}
}

// TestReserveBlocksExactPercent: a reserve that is a whole number of
// blocks is that number, not one more: 1.1% of 3000 blocks is 33 blocks,
// though float64(3000)*1.1/100 is 33.000000000000004.
func TestReserveBlocksExactPercent(t *testing.T) {
	for _, c := range []struct {
		total   uint64
		percent float64
		want    uint64
	}{
		{3000, 1.1, 33},
		{1500, 2.2, 33},
		{3000, 2.7, 81},
		{750, 4.4, 33},
		{3001, 1.1, 34}, // 33.011: rounded up
	} {
		if got := ReserveBlocks(c.total, c.percent); got != c.want {
			t.Errorf("ReserveBlocks(%d, %v) = %d, want %d", c.total, c.percent, got, c.want)
		}
	}
}
