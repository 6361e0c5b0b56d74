//go:build dm

package snapshotter

import (
	"testing"
	"time"
)

// maxStartupDM is how long start-up reconciliation may take in the VM with
// the largest population.
const maxStartupDM = 10 * time.Second

// BenchmarkScaleDM is BenchmarkScale on real thin pools (one per size):
// every snapshot a thin device, every call's device-mapper work done. It
// also fails when start-up reconciliation at the largest size takes longer
// than maxStartupDM.
func BenchmarkScaleDM(b *testing.B) {
	sizes := scaleSizeList(b)
	var envs []*scaleEnv
	for _, n := range sizes {
		e := newTestEnv(b, "sc")
		envs = append(envs, &scaleEnv{n: n, s: e.newSnapshotter(b, Config{}), pool: e.pool})
	}
	results := measureScale(b, envs)
	reportScale(b, sizes, results)
	for _, row := range results[len(results)-1] {
		if row.name == startupRow && row.p50 > maxStartupDM {
			b.Errorf("start-up reconciliation with %d devices: p50 %s, over %s", sizes[len(sizes)-1], row.p50, maxStartupDM)
		}
	}
	for b.Loop() {
	}
}
