package main

import (
	"context"
	"fmt"
	"os"
)

const rmDescription = `
Asks the running daemon (over daemon.control_socket) to remove pulled
images, the way garbage collection does: each image's names are removed
from containerd where this daemon created them (an image of that name
another tool made, or one a pull was refused, stays as it is), then its
activation, the chains no other image uses,
their devices, and its records and layer files. An image in use (a
container snapshot on it, a pull of it under way, or pinned by [gc] pinned
or containerd's io.cri-containerd.pinned label) is refused with the
reason. REF is a name given to pull, or the image's s3:// source. Prints
one line per image removed. Exit status 0 when every REF was removed, 1
with the reasons otherwise, 2 on a usage error.
`

func init() {
	register(&command{name: "rm", summary: "remove pulled images not in use (via the daemon)", run: runRm})
}

func runRm(ctx context.Context, args []string) error {
	fs := newFlagSet("rm", "rm REF... [--config FILE] [--socket PATH]", rmDescription)
	addConfigFlags(fs)
	var socket string
	addSocketFlag(fs, &socket)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return &exitError{code: 2, msg: "rm takes at least one REF argument (a name given to pull, or its s3:// source)"}
	}
	for _, ref := range pos {
		if ref == "" {
			return &exitError{code: 2, msg: "rm: a REF must not be empty"}
		}
	}
	c, err := controlClient(socket)
	if err != nil {
		return err
	}
	removed, err := c.Remove(ctx, pos)
	for _, r := range removed {
		fmt.Fprintf(os.Stdout, "removed %s (%s, names %v): %d bytes of pool data freed\n", r.ImageID, r.Source, r.Names, r.Freed)
	}
	return err
}
