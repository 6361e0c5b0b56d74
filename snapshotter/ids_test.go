package snapshotter

import (
	"context"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

func TestCandidateIDIsDeterministicAndIn24Bits(t *testing.T) {
	seen := map[uint32]string{}
	for _, ns := range []string{"default", "k8s.io", "moby"} {
		for _, key := range []string{"a", "b", "extract-123 sha256:abc", strings.Repeat("x", 4096)} {
			id := candidateID(ns, key)
			if id == 0 || id > thinpool.MaxThinID {
				t.Fatalf("candidateID(%q, %q) = %d, want 1..%d", ns, key, id, thinpool.MaxThinID)
			}
			if again := candidateID(ns, key); again != id {
				t.Fatalf("candidateID(%q, %q) not stable: %d then %d", ns, key, id, again)
			}
			if prev, ok := seen[id]; ok {
				t.Fatalf("candidateID(%q, %q) = %d, same as %s (unexpected for this small set)", ns, key, id, prev)
			}
			seen[id] = ns + "/" + key
		}
	}
	// The separator keeps ("ab", "c") and ("a", "bc") apart.
	if candidateID("ab", "c") == candidateID("a", "bc") {
		t.Fatal("namespace/key boundary is not part of the hash")
	}
}

func TestProbeIDSkipsUsedIDs(t *testing.T) {
	ctx := context.Background()
	start := candidateID("default", "layer")
	used := map[uint32]bool{start: true, start + 1: true, start + 3: true}
	got, err := probeID(ctx, start, func(_ context.Context, id uint32) (bool, error) { return used[id], nil })
	if err != nil {
		t.Fatal(err)
	}
	if got != start+2 {
		t.Fatalf("probeID = %d, want first free id %d", got, start+2)
	}
}

func TestProbeIDWrapsAndSkipsZero(t *testing.T) {
	ctx := context.Background()
	used := map[uint32]bool{thinpool.MaxThinID - 1: true, thinpool.MaxThinID: true, 1: true}
	var asked []uint32
	got, err := probeID(ctx, thinpool.MaxThinID-1, func(_ context.Context, id uint32) (bool, error) {
		asked = append(asked, id)
		return used[id], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != 2 {
		t.Fatalf("probeID = %d, want 2 (after wrapping past %d and skipping 0 and 1)", got, thinpool.MaxThinID)
	}
	for _, id := range asked {
		if id == 0 {
			t.Fatalf("probeID asked about id 0: %v", asked)
		}
	}
}

func TestProbeIDGivesUpWhenEverythingIsTaken(t *testing.T) {
	_, err := probeID(context.Background(), 5, func(context.Context, uint32) (bool, error) { return true, nil })
	if err == nil || !strings.Contains(err.Error(), "taken") {
		t.Fatalf("probeID with every id taken: err = %v, want an error saying the ids are taken", err)
	}
}

func TestDeviceNamesFollowTheID(t *testing.T) {
	if got := deviceName("flyio-pool", 42); got != "flyio-pool-snap-42" {
		t.Fatalf("deviceName = %q", got)
	}
	if deviceName("p", 1) == baseDeviceName("p", 1) {
		t.Fatal("base and snapshot device names collide")
	}
}
