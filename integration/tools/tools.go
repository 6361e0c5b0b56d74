//go:build tools

// Package tools pins the external programs the integration tests run (real
// containerd, its runc shim and ctr) without adding them to the project's own
// go.mod. integration/tools/build.sh builds them into .cache/tools.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
