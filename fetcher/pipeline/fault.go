//go:build !dm

package pipeline

import "context"

// faultHooks returns no test points: fault injection exists only in the
// device-mapper test binaries (fault_dm.go).
func faultHooks(context.Context) map[string]func() { return nil }
