//go:build dm

package plugin

import (
	"context"
	"os"

	"github.com/containerd/log"
)

// This file is compiled only with the dm build tag, which only the
// device-mapper test binaries carry (`make build` and `make release` never
// set it): the shipped daemon has no way to be told to hold its start-up.

// FaultHoldStartEnv names an environment variable for stop tests: when set
// to a point of StartFetcher ("start-fetcher:begin", before the pipelines
// are built; "start-fetcher:resumed", once the runs a previous process left
// are resumed), StartFetcher waits there until its context is done, then
// goes on, so that a test can stop the daemon at exactly that step of its
// start-up.
const FaultHoldStartEnv = "FLYIO_FAULT_HOLD_START_AT"

// holdStart waits at point until ctx is done when FaultHoldStartEnv names
// it.
func holdStart(ctx context.Context, point string) {
	if os.Getenv(FaultHoldStartEnv) != point {
		return
	}
	log.G(ctx).WithField("point", point).Warn("fault injection: start-up held here until the daemon is asked to stop")
	<-ctx.Done()
}
