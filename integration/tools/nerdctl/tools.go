//go:build tools

// Package nerdctl pins the nerdctl release the integration tests run, in a
// module of its own: nerdctl is built against its own containerd version,
// which need not be the one the parent module pins for the daemon.
// integration/tools/build.sh builds it into .cache/tools.
package nerdctl

import (
	_ "github.com/containerd/nerdctl/v2/cmd/nerdctl"
)
