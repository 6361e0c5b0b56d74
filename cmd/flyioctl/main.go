// Command flyioctl is the light client of the flyio snapshotter's daemon:
// pull, activate and rm over its control socket, the same subcommands, with
// the same flags and output, as containerd-flyio-snapshotter's. It links
// none of the daemon (no AWS SDK, containerd client, gRPC, protobuf or
// SQLite), so it starts like a small Go program: for an image already
// pulled, the whole call is mostly the process's start, which is what a
// deploy that re-pulls on every run waits on.
package main

import (
	"os"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"
)

func init() {
	cli.Program = "flyioctl"
	cli.About = "The flyio snapshotter's light client: pulls, activates and removes S3 images through the running daemon (containerd-flyio-snapshotter serve)."
	cli.RegisterVersion(nil)
}

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
