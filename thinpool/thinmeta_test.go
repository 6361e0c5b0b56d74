package thinpool

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// metaImage builds a metadata image in the kernel's on-disk format: a held
// superblock copy at block 1 whose device-details btree (root block 2,
// internal) has two leaves (blocks 3 and 4).
func metaImage(t *testing.T, leaves [][]uint64) []byte {
	t.Helper()
	img := make([]byte, (3+len(leaves))*metaBlockSize)
	le := binary.LittleEndian
	blk := func(n int) []byte { return img[n*metaBlockSize : (n+1)*metaBlockSize] }
	sb := blk(1)
	le.PutUint64(sb[8:], 1)
	le.PutUint64(sb[32:], thinSuperMagic)
	le.PutUint64(sb[superDetailsRootAt:], 2)
	le.PutUint32(sb[336:], 128)
	le.PutUint32(sb[0:], dmChecksum(sb[4:], superCsumXor))

	node := func(b []byte, n uint64, flags uint32, keys, vals []uint64, vsize int) {
		max := (metaBlockSize - btreeHeaderSize) / (8 + vsize)
		le.PutUint32(b[4:], flags)
		le.PutUint64(b[8:], n)
		le.PutUint32(b[16:], uint32(len(keys)))
		le.PutUint32(b[20:], uint32(max))
		le.PutUint32(b[24:], uint32(vsize))
		for i, k := range keys {
			le.PutUint64(b[btreeHeaderSize+8*i:], k)
		}
		for i, v := range vals {
			le.PutUint64(b[btreeHeaderSize+8*max+vsize*i:], v)
		}
		le.PutUint32(b[0:], dmChecksum(b[4:], btreeCsumXor))
	}
	var rootKeys, children []uint64
	for i, keys := range leaves {
		n := uint64(3 + i)
		node(blk(int(n)), n, btreeLeafNode, keys, nil, 24)
		rootKeys = append(rootKeys, keys[0])
		children = append(children, n)
	}
	node(blk(2), 2, btreeInternalNode, rootKeys, children, 8)
	return img
}

func TestReadThinIDs(t *testing.T) {
	img := metaImage(t, [][]uint64{{0, 1, 5}, {9, 0xffffff}})
	path := filepath.Join(t.TempDir(), "meta")
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	ids, err := readThinIDs(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint32{0, 1, 5, 9, 0xffffff}; !reflect.DeepEqual(ids, want) {
		t.Errorf("readThinIDs = %v, want %v", ids, want)
	}
}

func TestMetadataBlocksValidated(t *testing.T) {
	img := metaImage(t, [][]uint64{{3, 4}})
	sb := img[metaBlockSize : 2*metaBlockSize]
	if root, err := detailsRootOf(sb, 1); err != nil || root != 2 {
		t.Fatalf("detailsRootOf = %d, %v", root, err)
	}
	if _, err := detailsRootOf(sb, 7); err == nil {
		t.Error("superblock accepted at the wrong block number")
	}
	sb[100] ^= 1
	if _, err := detailsRootOf(sb, 1); err == nil {
		t.Error("superblock with a flipped bit accepted")
	}
	leaf := img[3*metaBlockSize : 4*metaBlockSize]
	n, err := parseBtreeNode(leaf, 3)
	if err != nil || !n.leaf || !reflect.DeepEqual(n.keys, []uint64{3, 4}) {
		t.Fatalf("parseBtreeNode = %+v, %v", n, err)
	}
	leaf[40] ^= 1
	if _, err := parseBtreeNode(leaf, 3); err == nil {
		t.Error("btree node with a flipped bit accepted")
	}
}

// TestBtreeNodeSizesDoNotOverflow: a node whose max_entries and value_size
// multiply past what an int holds is refused as not fitting its block,
// not taken as fitting and read past the block's end (a panic).
func TestBtreeNodeSizesDoNotOverflow(t *testing.T) {
	le := binary.LittleEndian
	for _, c := range []struct {
		flags     uint32
		nr, max   uint32
		valueSize uint32
	}{
		// 2^31 * (8 + 2^32-8) = 2^63: wraps to a negative size.
		{btreeLeafNode, 600, 1 << 31, 1<<32 - 8},
		{btreeInternalNode, 600, 1 << 31, 1<<32 - 8},
	} {
		b := make([]byte, metaBlockSize)
		le.PutUint32(b[4:], c.flags)
		le.PutUint64(b[8:], 5)
		le.PutUint32(b[16:], c.nr)
		le.PutUint32(b[20:], c.max)
		le.PutUint32(b[24:], c.valueSize)
		le.PutUint32(b[0:], dmChecksum(b[4:], btreeCsumXor))
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("parseBtreeNode(flags %d, %d of %d entries of %d bytes) panicked: %v", c.flags, c.nr, c.max, c.valueSize, r)
				}
			}()
			if _, err := parseBtreeNode(b, 5); err == nil {
				t.Errorf("parseBtreeNode(flags %d, %d of %d entries of %d bytes) accepted a node that cannot fit a block", c.flags, c.nr, c.max, c.valueSize)
			}
		}()
	}
}
