//go:build dm

package thinpool

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPeek: Peek reports the blocks just written, as Status does, and
// makes the kernel write nothing: on an idle pool, 20 Peeks leave its
// metadata device without a write or a flush, where 20 Status calls, each
// committing the metadata first, write to it.
func TestPeek(t *testing.T) {
	ctx := context.Background()
	p, _ := testPool(t, 64*mib)
	path := activeThin(t, ctx, p, 1, p.name+"-peek", 32*mib)
	openDirect(t, path).mustWrite(0, pattern(1, 4*mib))
	peek, err := p.Peek(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(4 * mib / (64 << 10)); peek.UsedDataBlocks < want {
		t.Fatalf("Peek after writing 4 MiB: %d data blocks used, want at least %d", peek.UsedDataBlocks, want)
	}
	st, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.UsedDataBlocks != peek.UsedDataBlocks {
		t.Errorf("data blocks used: Peek %d, then Status %d; nothing was freed in between", peek.UsedDataBlocks, st.UsedDataBlocks)
	}

	tbl, _, err := p.liveTable()
	if err != nil {
		t.Fatal(err)
	}
	metaIO := func() uint64 {
		t.Helper()
		b, err := os.ReadFile("/sys/dev/block/" + tbl.MetaDev + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		var n uint64
		// Writes completed, and flushes completed where the kernel counts them.
		for _, i := range []int{4, 15} {
			if i < len(f) {
				v, err := strconv.ParseUint(f[i], 10, 64)
				if err != nil {
					t.Fatalf("metadata device %s stat %q: %v", tbl.MetaDev, b, err)
				}
				n += v
			}
		}
		return n
	}
	// The kernel commits a pool with changes every second by itself: past
	// that, this one has none left.
	time.Sleep(1500 * time.Millisecond)
	before := metaIO()
	for range 20 {
		if _, err := p.Peek(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := metaIO() - before; n != 0 {
		t.Errorf("20 Peeks of an idle pool: %d writes and flushes of its metadata device, want none", n)
	}
	before = metaIO()
	for range 20 {
		if _, err := p.Status(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if metaIO() == before {
		t.Errorf("20 Status calls of an idle pool wrote nothing to its metadata device: they should commit, and this test cannot tell Peek from them")
	}
}
