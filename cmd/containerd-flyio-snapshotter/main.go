// Command containerd-flyio-snapshotter is the daemon (serve) and the operator
// tool (pull, activate, rm, ls, db, pool, validate, version) of the flyio
// snapshotter. Each subcommand lives in its own file and registers itself with
// cli.Register (pull, activate and rm, which only talk to the daemon, in
// package cli, which flyioctl shares); main only dispatches.
package main

import (
	"os"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

func init() {
	cli.RegisterVersion(metadata.SQLiteVersion)
}

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
