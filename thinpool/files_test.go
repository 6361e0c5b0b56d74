package thinpool

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// TestEnsureFilesAfterKillDuringCreation: a process killed between
// creating a loop file and sizing it leaves the file at 0 bytes under its
// final name. The next Open must still get a data file of pool.data_size
// and a metadata file of pool.metadata_size, not take the empty file as
// the pool's (a 0-byte data file is refused as smaller than one block on
// every start after, and a 0-byte metadata file cannot hold a pool).
func TestEnsureFilesAfterKillDuringCreation(t *testing.T) {
	for _, left := range []string{DataFileName, MetadataFileName} {
		t.Run(left, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Name: "p", RootDir: dir, DataSize: conf.Size(64 << 20), MetadataSize: conf.Size(4 << 20)}.withDefaults()
			// What the kill left: the file created (O_CREAT|O_EXCL), never sized.
			if err := os.WriteFile(filepath.Join(dir, left), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			p := &Pool{cfg: cfg, name: cfg.Name}
			metaFile, dataFile, err := p.ensureFiles(context.Background())
			if err != nil {
				t.Fatalf("ensureFiles after a creation cut short: %v", err)
			}
			for path, want := range map[string]int64{dataFile: cfg.DataSize.Bytes(), metaFile: cfg.MetadataSize.Bytes()} {
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Size() != want {
					t.Errorf("%s holds %d bytes after ensureFiles, want %d", path, fi.Size(), want)
				}
			}
		})
	}
}

// spaceMapImage builds thin metadata in the kernel's on-disk format whose
// committed superblock (block 0) has a data space map of nrBlocks data
// blocks of 128 sectors, those of inUse counted in use: its index btree
// (a leaf at block 1) names one bitmap (block 2).
func spaceMapImage(t *testing.T, nrBlocks uint64, inUse ...uint64) []byte {
	t.Helper()
	img := make([]byte, 3*metaBlockSize)
	le := binary.LittleEndian
	blk := func(n int) []byte { return img[n*metaBlockSize : (n+1)*metaBlockSize] }
	sb := blk(0)
	le.PutUint64(sb[32:], thinSuperMagic)
	le.PutUint64(sb[superDataSpaceMapAt:], nrBlocks)
	le.PutUint64(sb[superDataSpaceMapAt+8:], uint64(len(inUse)))
	le.PutUint64(sb[superDataSpaceMapAt+16:], 1)
	le.PutUint32(sb[superDataBlockSizeAt:], 128)
	le.PutUint32(sb[0:], dmChecksum(sb[4:], superCsumXor))
	leaf := blk(1)
	const vsize = indexEntrySize
	max := (metaBlockSize - btreeHeaderSize) / (8 + vsize)
	le.PutUint32(leaf[4:], btreeLeafNode)
	le.PutUint64(leaf[8:], 1)
	le.PutUint32(leaf[16:], 1)
	le.PutUint32(leaf[20:], uint32(max))
	le.PutUint32(leaf[24:], vsize)
	le.PutUint64(leaf[btreeHeaderSize:], 0)          // bitmap index 0
	le.PutUint64(leaf[btreeHeaderSize+8*max:], 2)    // in block 2
	le.PutUint32(leaf[btreeHeaderSize+8*max+8:], 0)  // nr_free, not read
	le.PutUint32(leaf[btreeHeaderSize+8*max+12:], 0) // none_free_before, not read
	le.PutUint32(leaf[0:], dmChecksum(leaf[4:], btreeCsumXor))
	bm := blk(2)
	le.PutUint64(bm[8:], 2)
	for _, d := range inUse {
		at := bitmapHeaderSize + 8*(d/32)
		le.PutUint64(bm[at:], le.Uint64(bm[at:])|1<<(2*(d%32)))
	}
	le.PutUint32(bm[0:], dmChecksum(bm[4:], bitmapCsumXor))
	return img
}

// TestEnsureFilesRefusesLostDataFile: a metadata file that holds a pool
// whose devices map data blocks, beside a data file that is gone (deleted,
// or left empty), is a pool whose data was lost, not one whose creation
// was cut short (the data file is made first): a new, empty data file
// under that metadata would have every device read zeros where it wrote
// its data, so Open refuses, naming the block in use. Metadata whose
// devices map nothing takes a new data file.
func TestEnsureFilesRefusesLostDataFile(t *testing.T) {
	for _, c := range []struct {
		name  string
		data  []byte // nil: no data file
		inUse []uint64
		ok    bool
	}{
		{"data file gone", nil, []uint64{7}, false},
		{"data file empty", []byte{}, []uint64{7}, false},
		{"no block in use", nil, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Name: "p", RootDir: dir, DataSize: conf.Size(64 << 20), MetadataSize: conf.Size(4 << 20)}.withDefaults()
			meta := spaceMapImage(t, 64<<20/(128*512), c.inUse...)
			meta = append(meta, make([]byte, cfg.MetadataSize.Bytes()-int64(len(meta)))...)
			if err := os.WriteFile(filepath.Join(dir, MetadataFileName), meta, 0o600); err != nil {
				t.Fatal(err)
			}
			if c.data != nil {
				if err := os.WriteFile(filepath.Join(dir, DataFileName), c.data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			p := &Pool{cfg: cfg, name: cfg.Name}
			_, _, err := p.ensureFiles(context.Background())
			switch {
			case c.ok && err != nil:
				t.Fatalf("ensureFiles beside metadata whose devices map nothing: %v", err)
			case !c.ok && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "data block 7")):
				t.Fatalf("ensureFiles with the data file lost under metadata mapping data block 7: %v, want a refusal naming it (ErrInvalid)", err)
			case !c.ok:
				if fi, serr := os.Stat(filepath.Join(dir, DataFileName)); serr == nil && fi.Size() != int64(len(c.data)) {
					t.Errorf("refused ensureFiles left a data file of %d bytes, want it left as it was", fi.Size())
				}
			}
		})
	}
}
