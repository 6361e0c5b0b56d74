package thinpool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reading the thin ids from the pool metadata.
//
// The kernel has no ioctl or message that lists a pool's thin ids. Instead
// of forking thin_ls/thin_dump (thin-provisioning-tools, which may be
// absent), ThinIDs asks the kernel for a metadata snapshot
// ("reserve_metadata_snap": the kernel commits, then copies the superblock
// to a held block and pins the btrees it points to), reads the keys of the
// device-details btree of that snapshot straight from the metadata device
// with O_DIRECT (bypassing any stale page cache), then releases the
// snapshot. Only the on-disk format documented in the kernel's
// dm-thin-metadata.c and persistent-data/dm-btree-internal.h is used:
//
//	superblock: csum u32 | flags u32 | blocknr u64 | uuid [16] | magic u64 |
//	  version u32 | time u32 | trans_id u64 | held_root u64 |
//	  data sm root [128] | metadata sm root [128] | data_mapping_root u64 |
//	  device_details_root u64 | data_block_size u32 | metadata_block_size u32 ...
//	btree node: csum u32 | flags u32 (1 internal, 2 leaf) | blocknr u64 |
//	  nr_entries u32 | max_entries u32 | value_size u32 | pad u32 |
//	  keys [max_entries]u64 | values [max_entries][value_size]
//
// Checksums are crc32c over the block after the csum field, xor'd with a
// per-kind constant; they and the blocknr fields are verified, so a torn or
// misread block is an error, never a wrong list.

const (
	metaBlockSize      = 4096
	thinSuperMagic     = 27022010
	superCsumXor       = 160774
	btreeCsumXor       = 121107
	btreeInternalNode  = 1
	btreeLeafNode      = 2
	btreeHeaderSize    = 32
	superDetailsRootAt = 328
	maxBtreeDepth      = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// dmChecksum is the kernel's dm_bm_checksum: crc32c seeded with ~0, not
// inverted at the end, xor'd with a constant.
func dmChecksum(b []byte, xor uint32) uint32 {
	return ^crc32.Checksum(b, castagnoli) ^ xor
}

// metaReader reads 4 KiB metadata blocks with O_DIRECT.
type metaReader struct {
	f   *os.File
	buf []byte // aligned block buffer
}

func openMetaReader(dev string) (*metaReader, error) {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EINVAL) {
		// Block devices always take O_DIRECT; a regular file on a
		// filesystem without it (a metadata image on tmpfs) has a
		// coherent page cache, so a buffered read is exact there.
		f, err = os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open metadata device: %w", err)
	}
	raw := make([]byte, 2*metaBlockSize)
	off := int(uintptr(unsafe.Pointer(&raw[0])) & (metaBlockSize - 1))
	if off != 0 {
		off = metaBlockSize - off
	}
	return &metaReader{f: f, buf: raw[off : off+metaBlockSize]}, nil
}

func (r *metaReader) Close() error { return r.f.Close() }

// block returns a copy of metadata block n.
func (r *metaReader) block(n uint64) ([]byte, error) {
	if _, err := r.f.ReadAt(r.buf, int64(n)*metaBlockSize); err != nil {
		return nil, fmt.Errorf("read metadata block %d: %w", n, err)
	}
	return append([]byte(nil), r.buf...), nil
}

// detailsRootOf validates a superblock (or held-root copy) at block n and
// returns its device-details btree root.
func detailsRootOf(b []byte, n uint64) (uint64, error) {
	le := binary.LittleEndian
	if le.Uint64(b[32:]) != thinSuperMagic {
		return 0, fmt.Errorf("metadata block %d: not a thin superblock (magic %d)", n, le.Uint64(b[32:]))
	}
	if got := le.Uint64(b[8:]); got != n {
		return 0, fmt.Errorf("metadata block %d: superblock says it is block %d", n, got)
	}
	if want, got := le.Uint32(b[0:]), dmChecksum(b[4:], superCsumXor); want != got {
		return 0, fmt.Errorf("metadata block %d: superblock checksum %#x, computed %#x", n, want, got)
	}
	return le.Uint64(b[superDetailsRootAt:]), nil
}

// btreeKeys returns every key of the btree rooted at block root.
func (r *metaReader) btreeKeys(root uint64) ([]uint64, error) {
	var keys []uint64
	err := r.btreeLeaves(root, func(node btreeNode) error {
		keys = append(keys, node.keys...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return keys, nil
}

// btreeLeaves calls fn with every leaf of the btree rooted at block root,
// in key order, until fn returns an error.
func (r *metaReader) btreeLeaves(root uint64, fn func(leaf btreeNode) error) error {
	var walk func(n uint64, depth int) error
	walk = func(n uint64, depth int) error {
		if depth > maxBtreeDepth {
			return fmt.Errorf("btree deeper than %d levels at block %d", maxBtreeDepth, n)
		}
		b, err := r.block(n)
		if err != nil {
			return err
		}
		node, err := parseBtreeNode(b, n)
		if err != nil {
			return err
		}
		if node.leaf {
			return fn(node)
		}
		for _, child := range node.children {
			if err := walk(child, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(root, 0)
}

type btreeNode struct {
	leaf     bool
	keys     []uint64
	children []uint64 // internal nodes only
	values   [][]byte // leaves only: each key's value
}

// parseBtreeNode decodes and validates btree node block n.
func parseBtreeNode(b []byte, n uint64) (btreeNode, error) {
	le := binary.LittleEndian
	if want, got := le.Uint32(b[0:]), dmChecksum(b[4:], btreeCsumXor); want != got {
		return btreeNode{}, fmt.Errorf("btree node %d: checksum %#x, computed %#x", n, want, got)
	}
	if got := le.Uint64(b[8:]); got != n {
		return btreeNode{}, fmt.Errorf("btree node %d: node says it is block %d", n, got)
	}
	flags := le.Uint32(b[4:])
	nr := int(le.Uint32(b[16:]))
	max := int(le.Uint32(b[20:]))
	vsize := int(le.Uint32(b[24:]))
	// max and vsize are each checked against the block first, so that
	// their product cannot overflow into a size that seems to fit.
	if nr > max || max > len(b) || vsize > len(b) || btreeHeaderSize+max*(8+vsize) > len(b) {
		return btreeNode{}, fmt.Errorf("btree node %d: %d of %d entries of %d-byte values do not fit a block", n, nr, max, vsize)
	}
	var node btreeNode
	switch {
	case flags&btreeLeafNode != 0:
		node.leaf = true
	case flags&btreeInternalNode != 0:
		if vsize != 8 {
			return btreeNode{}, fmt.Errorf("btree node %d: internal node with %d-byte values", n, vsize)
		}
	default:
		return btreeNode{}, fmt.Errorf("btree node %d: flags %#x name neither leaf nor internal", n, flags)
	}
	node.keys = make([]uint64, nr)
	for i := range node.keys {
		node.keys[i] = le.Uint64(b[btreeHeaderSize+8*i:])
	}
	vals := btreeHeaderSize + 8*max
	if !node.leaf {
		node.children = make([]uint64, nr)
		for i := range node.children {
			node.children[i] = le.Uint64(b[vals+8*i:])
		}
		return node, nil
	}
	node.values = make([][]byte, nr)
	for i := range node.values {
		node.values[i] = b[vals+vsize*i : vals+vsize*(i+1)]
	}
	return node, nil
}

// readThinIDs reads the thin ids of the superblock copy at block heldRoot
// of metadata device dev (a held metadata snapshot, or 0 for the committed
// superblock of a pool that cannot change).
func readThinIDs(dev string, heldRoot uint64) ([]uint32, error) {
	r, err := openMetaReader(dev)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	sb, err := r.block(heldRoot)
	if err != nil {
		return nil, err
	}
	root, err := detailsRootOf(sb, heldRoot)
	if err != nil {
		return nil, err
	}
	keys, err := r.btreeKeys(root)
	if err != nil {
		return nil, err
	}
	ids := make([]uint32, 0, len(keys))
	for _, k := range keys {
		if k > MaxThinID {
			return nil, fmt.Errorf("device details btree holds id %d above %d", k, MaxThinID)
		}
		ids = append(ids, uint32(k))
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// The data space map, as dm-space-map-common.c lays it out: the
// superblock's data space map root starts with nr_blocks u64 |
// nr_allocated u64 | bitmap_root u64; bitmap_root is a btree from bitmap
// index i to an index entry (blocknr u64 | nr_free u32 |
// none_free_before u32) naming the bitmap block that holds data blocks
// [i*bitmapEntries, (i+1)*bitmapEntries): a header (csum u32 | not_used
// u32 | blocknr u64), then 2 bits per data block in little-endian u64
// words, 0 for a free block.
const (
	superDataSpaceMapAt  = 64
	superDataBlockSizeAt = 336
	bitmapCsumXor        = 240779
	bitmapHeaderSize     = 16
	bitmapEntries        = (metaBlockSize - bitmapHeaderSize) * 4
	indexEntrySize       = 16
)

// committedDataSpace reads, from the committed superblock of the thin
// metadata at metaPath, how many data blocks the metadata expects and
// their size in sectors. ok is false when the metadata holds no superblock
// yet (fresh metadata the kernel formats when the pool is loaded).
func committedDataSpace(metaPath string) (blocks uint64, blockSectors uint32, ok bool, err error) {
	r, err := openMetaReader(metaPath)
	if err != nil {
		return 0, 0, false, err
	}
	defer r.Close()
	sb, err := r.block(0)
	if err != nil {
		return 0, 0, false, err
	}
	if binary.LittleEndian.Uint64(sb[32:]) != thinSuperMagic {
		return 0, 0, false, nil
	}
	if _, err := detailsRootOf(sb, 0); err != nil {
		return 0, 0, false, err
	}
	return binary.LittleEndian.Uint64(sb[superDataSpaceMapAt:]), binary.LittleEndian.Uint32(sb[superDataBlockSizeAt:]), true, nil
}

// firstDataBlockInUse returns the first data block at or past from that the
// committed data space map of the thin metadata at metaPath counts as in
// use (mapped by a device, or held by a metadata snapshot); inUse is false
// when every block from there to the map's end is free.
func firstDataBlockInUse(metaPath string, from uint64) (block uint64, inUse bool, err error) {
	r, err := openMetaReader(metaPath)
	if err != nil {
		return 0, false, err
	}
	defer r.Close()
	sb, err := r.block(0)
	if err != nil {
		return 0, false, err
	}
	if _, err := detailsRootOf(sb, 0); err != nil {
		return 0, false, err
	}
	le := binary.LittleEndian
	nrBlocks := le.Uint64(sb[superDataSpaceMapAt:])
	bitmapRoot := le.Uint64(sb[superDataSpaceMapAt+16:])
	errFound := errors.New("found")
	err = r.btreeLeaves(bitmapRoot, func(leaf btreeNode) error {
		for i, idx := range leaf.keys {
			lo, hi := idx*bitmapEntries, min((idx+1)*bitmapEntries, nrBlocks)
			if hi <= from || lo >= hi {
				continue
			}
			if len(leaf.values[i]) != indexEntrySize {
				return fmt.Errorf("data space map index %d: %d-byte entry, want %d", idx, len(leaf.values[i]), indexEntrySize)
			}
			n := le.Uint64(leaf.values[i])
			b, err := r.block(n)
			if err != nil {
				return err
			}
			if want, got := le.Uint32(b[0:]), dmChecksum(b[4:], bitmapCsumXor); want != got {
				return fmt.Errorf("data space map bitmap %d (block %d): checksum %#x, computed %#x", idx, n, want, got)
			}
			if got := le.Uint64(b[8:]); got != n {
				return fmt.Errorf("data space map bitmap %d: block %d says it is block %d", idx, n, got)
			}
			for d := max(lo, from); d < hi; d++ {
				e := d - lo
				word := le.Uint64(b[bitmapHeaderSize+8*(e/32):])
				if word>>(2*(e%32))&3 != 0 {
					block, inUse = d, true
					return errFound
				}
			}
		}
		return nil
	})
	if errors.Is(err, errFound) {
		return block, true, nil
	}
	return 0, false, err
}
