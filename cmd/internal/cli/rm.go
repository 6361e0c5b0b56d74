package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
)

const rmDescription = `
Asks the running daemon (over daemon.control_socket) to remove pulled
images, the way garbage collection does: each image's names are removed
from containerd where this daemon created them (an image of that name
another tool made, or one a pull was refused, stays as it is), then its
activation, the chains no other image uses,
their devices, and its records and layer files. An image in use is
refused with the reason: a container or a container snapshot on it, a
pull of it under way, a containerd lease holding it, its activation's
device is open (a VM, a mount or a process uses it), or pinned by [gc]
pinned or containerd's io.cri-containerd.pinned label; so is one
containerd has a name of while containerd does not answer, since its
containers and pins cannot be checked then. REF is a name given to
pull, or the image's s3:// source (what
'ls images -q' prints). Prints one line per image removed; with --format
json, one JSON object: {"removed":[...]} with each image removed, and
"error" with the reasons when some REF was not removed. Exit status 0 when
every REF was removed, 1 with the reasons otherwise, 2 on a usage error.
`

func init() {
	Register(&Command{Name: "rm", Summary: "remove pulled images not in use (via the daemon)", Run: runRm})
}

func runRm(ctx context.Context, args []string) error {
	fs := NewFlagSet("rm", "rm REF... [--format table|json] [--config FILE] [--control-socket PATH]", rmDescription)
	AddConfigFlags(fs)
	var socket string
	addControlSocketFlag(fs, &socket)
	format := AddFormatFlag(fs, DefaultFormatUsage)
	pos, err := ParseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return UsageError(fs, "rm takes at least one REF argument (a name given to pull, or its s3:// source)")
	}
	for _, ref := range pos {
		if ref == "" {
			return UsageError(fs, "a REF must not be empty")
		}
	}
	c, err := controlClient(socket)
	if err != nil {
		return err
	}
	removed, err := c.Remove(ctx, pos)
	if format.JSON() {
		out := RmOutput{Removed: make([]RemovedOutput, 0, len(removed))}
		for _, r := range removed {
			names := r.Names
			if names == nil {
				names = []string{} // a list in JSON, even when empty
			}
			out.Removed = append(out.Removed, RemovedOutput{ImageID: r.ImageID, Source: r.Source, Names: names, FreedBytes: r.Freed})
		}
		if err != nil {
			out.Error = err.Error()
		}
		if werr := WriteJSON(os.Stdout, out); werr != nil {
			return werr
		}
		if err != nil {
			// The reasons are in the JSON: stderr stays quiet, as for
			// pull --format json.
			return &ExitError{Code: 1}
		}
		return nil
	}
	for _, r := range removed {
		if _, werr := fmt.Fprintf(os.Stdout, "removed %s (%s, names %v): %d bytes of pool data freed\n", r.ImageID, r.Source, r.Names, r.Freed); werr != nil {
			return errors.Join(err, fmt.Errorf("writing the images removed failed: %w", werr))
		}
	}
	return err
}

// RmOutput is what `rm --format json` prints: the images removed, and why
// the others were not.
type RmOutput struct {
	Removed []RemovedOutput `json:"removed"`
	Error   string          `json:"error,omitempty"`
}

// RemovedOutput is one image rm removed.
type RemovedOutput struct {
	ImageID    string   `json:"image_id"`
	Source     string   `json:"source"`
	Names      []string `json:"names"`
	FreedBytes int64    `json:"freed_bytes"`
}
