//go:build dm

package thinpool

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/vm/scratch"
)

// damageMetadata does to a stopped pool's metadata file what a metadata
// write error does: the kernel's needs_check flag is set in the superblock
// (with its checksum recomputed, as the kernel writes it), and the root
// block of the data space map's index is overwritten, so thin_check fails
// on it while the devices' mappings stay intact for thin_repair.
func damageMetadata(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sb := make([]byte, metaBlockSize)
	if _, err := f.ReadAt(sb, 0); err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if le.Uint64(sb[32:]) != thinSuperMagic {
		t.Fatalf("%s has no thin superblock", path)
	}
	const (
		flagsAt           = 4
		needsCheckFlag    = 1
		dataSMBitmapRoot  = 64 + 16 // data sm root: nr_blocks, nr_allocated, bitmap_root, ref_count_root
		damagedRangeStart = 64
	)
	bitmapRoot := le.Uint64(sb[dataSMBitmapRoot:])
	le.PutUint32(sb[flagsAt:], le.Uint32(sb[flagsAt:])|needsCheckFlag)
	le.PutUint32(sb[0:], dmChecksum(sb[4:], superCsumXor))
	if _, err := f.WriteAt(sb, 0); err != nil {
		t.Fatal(err)
	}
	junk := []byte(strings.Repeat("damaged!", 8))
	if _, err := f.WriteAt(junk, int64(bitmapRoot)*metaBlockSize+damagedRangeStart); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	t.Logf("needs_check set, block %d (data space map index) overwritten", bitmapRoot)
}

// sh runs a runbook command line and returns its output and whether it
// succeeded.
func sh(t *testing.T, line string) (string, bool) {
	t.Helper()
	out, err := exec.Command("sh", "-c", line).CombinedOutput()
	t.Logf("$ %s\n%s(%v)", line, out, err)
	return string(out), err == nil
}

// TestRepairRunbook runs the README's repair runbook on a loop-file pool
// whose metadata was damaged on purpose: the pool comes back read-only
// with needs_check; after stop, thin_check (which fails), thin_repair,
// swapping the metadata file and start, it is rw without needs_check and
// the thin device holds what was written before the damage.
func TestRepairRunbook(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Name: "tp-repair", RootDir: scratch.Dir(t, "tp-repair-"), DataSize: 64 * mib, MetadataSize: 16 << 20}
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyPool(t, cfg) })
	path := activeThin(t, ctx, p, 1, "tp-repair-1", 32*mib)
	want := pattern(11, 4*mib)
	d := openDirect(t, path)
	d.mustWrite(mib, want)
	d.f.Close()
	if err := p.Deactivate(ctx, "tp-repair-1"); err != nil {
		t.Fatal(err)
	}
	stop := "dmsetup remove " + cfg.Name // the daemon stopped, its thin devices removed
	if _, ok := sh(t, stop); !ok {
		t.Fatal("removing the pool failed")
	}
	removeNode(cfg.Name)
	meta := filepath.Join(cfg.RootDir, MetadataFileName)
	damageMetadata(t, meta)

	// What the operator sees after the damage.
	p, err = Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open the damaged pool: %v", err)
	}
	st, err := p.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.NeedsCheck || st.Mode != ModeReadOnly {
		t.Fatalf("status of the damaged pool: %+v; want ro with needs_check", st)
	}
	if err := p.CreateThin(ctx, 2); err == nil {
		t.Fatal("create_thin on a read-only pool succeeded")
	}

	// The runbook.
	if _, ok := sh(t, stop); !ok {
		t.Fatal("stop: removing the pool failed")
	}
	removeNode(cfg.Name)
	// The tools open with O_DIRECT, which a file on tmpfs refuses: they
	// are given the files through loop devices, which work everywhere.
	out, ok := sh(t, "losetup --find --show "+meta)
	if !ok {
		t.Fatal("losetup failed")
	}
	mloop := strings.TrimSpace(out)
	if _, ok := sh(t, "thin_check "+mloop); ok {
		t.Fatal("thin_check passed the damaged metadata")
	}
	repaired := meta + ".repaired"
	if _, ok := sh(t, "truncate -s $(stat -c %s "+meta+") "+repaired); !ok {
		t.Fatal("truncate failed")
	}
	out, ok = sh(t, "losetup --find --show "+repaired)
	if !ok {
		t.Fatal("losetup failed")
	}
	rloop := strings.TrimSpace(out)
	for _, line := range []string{
		"thin_repair -i " + mloop + " -o " + rloop,
		"thin_check --clear-needs-check-flag " + rloop,
		"losetup -d " + mloop + " " + rloop,
		"mv " + meta + " " + meta + ".damaged",
		"mv " + repaired + " " + meta,
	} {
		if _, ok := sh(t, line); !ok {
			t.Fatalf("runbook step %q failed", line)
		}
	}
	p, err = Open(ctx, cfg) // start
	if err != nil {
		t.Fatalf("open the repaired pool: %v", err)
	}
	if st, err = p.Status(ctx); err != nil || st.NeedsCheck || st.Mode != ModeReadWrite {
		t.Fatalf("status of the repaired pool: %+v, %v; want rw without needs_check", st, err)
	}
	if ids, err := p.ThinIDs(ctx); err != nil || len(ids) != 1 || ids[0] != 1 {
		t.Fatalf("thin ids after the repair = %v, %v; want [1]", ids, err)
	}
	if path, err = p.Activate(ctx, "tp-repair-1", 1, 32*mib); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "data written before the damage", openDirect(t, path).read(mib, 4*mib), want)
	if err := p.CreateThin(ctx, 2); err != nil {
		t.Fatalf("create_thin on the repaired pool: %v", err)
	}
}
