package snapshotter

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// maxProbe bounds how many ids after a candidate are tried before giving up.
const maxProbe = 1 << 16

// baseSeedKey is the key the base device's candidate id derives from; it
// cannot clash with a containerd key because containerd namespaces are never
// empty.
const baseSeedKey = "\x00base"

// candidateID derives a thin id from (namespace, key): the 64-bit FNV-1a hash
// of both, folded into 24 bits. It is never 0 (not a usable thin id).
func candidateID(namespace, key string) uint32 {
	h := fnv.New64a()
	h.Write([]byte(namespace))
	h.Write([]byte{0})
	h.Write([]byte(key))
	v := h.Sum64()
	id := uint32((v ^ (v >> 24) ^ (v >> 48)) & thinpool.MaxThinID)
	if id == 0 {
		id = 1
	}
	return id
}

// nextID returns the id after id in probe order: ids run 1..MaxThinID and
// wrap, skipping 0.
func nextID(id uint32) uint32 {
	if id >= thinpool.MaxThinID {
		return 1
	}
	return id + 1
}

// probeID returns the first id, starting at start and going up (wrapping
// and skipping 0), for which used reports false.
func probeID(ctx context.Context, start uint32, used func(context.Context, uint32) (bool, error)) (uint32, error) {
	id := start
	if id == 0 || id > thinpool.MaxThinID {
		id = 1
	}
	for range maxProbe {
		u, err := used(ctx, id)
		if err != nil {
			return 0, err
		}
		if !u {
			return id, nil
		}
		id = nextID(id)
	}
	return 0, fmt.Errorf("choose thin id from candidate %d: %d ids in a row are taken", start, maxProbe)
}

// deviceName is the dm name of the snapshot device with thin id id in pool.
func deviceName(pool string, id uint32) string {
	return fmt.Sprintf("%s-snap-%d", pool, id)
}

// baseDeviceName is the dm name of the pool's base device.
func baseDeviceName(pool string, id uint32) string {
	return fmt.Sprintf("%s-base-%d", pool, id)
}
