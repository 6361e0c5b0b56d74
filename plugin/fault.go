//go:build !dm

package plugin

import "context"

// holdStart does nothing: holding the start-up is a test point of the
// device-mapper test binaries alone (fault_dm.go).
func holdStart(context.Context, string) {}
