//go:build dm

package snapshotter

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// TestCleanupGivesBlocksBackToLoopFile: with pool.discard_blocks, the
// Cleanup that deletes a removed snapshot's device gives the blocks its
// files took back to the filesystem under the loop-file pool; without it
// the data file keeps them.
func TestCleanupGivesBlocksBackToLoopFile(t *testing.T) {
	const written = 24 << 20
	body := make([]byte, written)
	r := rand.New(rand.NewPCG(3, 3))
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	for _, c := range []struct {
		discard bool
		prefix  string
	}{{true, "dd"}, {false, "dn"}} {
		e := newTestEnv(t, c.prefix)
		ctx := nsCtx("default")
		s := e.newSnapshotter(t, Config{AsyncRemove: true, DiscardBlocks: c.discard})
		allocated := func() int64 {
			t.Helper()
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(poolConfig(e.dir, e.poolNm).RootDir, thinpool.DataFileName), &st); err != nil {
				t.Fatal(err)
			}
			return st.Blocks * 512
		}
		mounts, err := s.Prepare(ctx, "k", "")
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, mounts, "payload", string(body))
		if err := s.Commit(ctx, "c", "k"); err != nil {
			t.Fatal(err)
		}
		before := allocated()
		if err := s.Remove(ctx, "c"); err != nil {
			t.Fatal(err)
		}
		if err := s.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		freed := before - allocated()
		t.Logf("discard_blocks=%v: data file %d MiB allocated, %d MiB given back by the Cleanup", c.discard, before>>20, freed>>20)
		switch {
		case c.discard && freed < written:
			t.Errorf("discard_blocks=true: the Cleanup gave back %d bytes of the data file, want at least the %d written", freed, written)
		case !c.discard && freed != 0:
			t.Errorf("discard_blocks=false: the Cleanup gave back %d bytes of the data file, want none", freed)
		}
	}
}
