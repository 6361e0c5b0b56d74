package pipeline

import (
	"context"
	"testing"
)

// TestExtractBudgetWithoutRoomIsNotUnlimited: a pool with no free space a
// layer may take (the daemon's PoolFree leaves out the reserve, so a pool
// at its reserve answers 0) gives an extraction a budget that refuses any
// file data, never one the extractor reads as no limit (a budget of 0).
func TestExtractBudgetWithoutRoomIsNotUnlimited(t *testing.T) {
	// fakePoolFree: a pool at its reserve.
	fakePoolFree := func(context.Context) (int64, error) { return 0, nil }
	p := &Pipelines{opts: Options{PoolFree: fakePoolFree}}
	for _, limit := range []int64{0, 1 << 20} {
		budget, err := p.extractBudget(context.Background(), limit)
		if err != nil || budget <= 0 || budget > 1 {
			t.Errorf("extractBudget(limit %d) on a pool with no room: %d, %v; want a budget of at most 1 byte (0 is no limit)", limit, budget, err)
		}
	}
}
