//go:build tools

// Package registry pins distribution's OCI registry (cmd/registry), which
// the integration tests serve on loopback inside the VM so that containerd,
// nerdctl and the CRI plugin pull real images from a real registry. It is a
// module of its own so that its dependencies do not move containerd's.
// integration/tools/build.sh builds it into .cache/tools.
package registry

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
