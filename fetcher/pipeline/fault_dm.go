//go:build dm

package pipeline

import (
	"context"
	"os"

	"github.com/containerd/log"
)

// This file is compiled only with the dm build tag, which only the
// device-mapper test binaries carry (`make build` and `make release` never
// set it): the shipped daemon has no way to be told to stop its runs.

// FaultPauseEnv names an environment variable for crash tests: when set
// to a test point ("<transition>:started" for every transition of the three
// machines, "extract:started", "stream-extract:started", "validate:reading",
// "download:spooling", "extract:spooled", "create-snapshot:verified",
// "create-snapshot:replaced"),
// every run that reaches that point blocks there until the process is
// killed, so that a test can SIGKILL the daemon at exactly that step.
const FaultPauseEnv = "FLYIO_FAULT_PAUSE_AT"

// faultHooks returns the test points FaultPauseEnv asks for, or nil.
func faultHooks(ctx context.Context) map[string]func() {
	at := os.Getenv(FaultPauseEnv)
	if at == "" {
		return nil
	}
	log.G(ctx).WithField("point", at).Warn("fault injection: runs will stop at this point until the process is killed")
	return map[string]func(){at: func() { select {} }}
}
