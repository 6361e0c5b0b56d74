package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
)

const activateDescription = `
Asks the running daemon (over daemon.control_socket) to activate a pulled
image again: its active snapshot "snap-<image id>" on the top of its
unpacked chain is checked and, if it or its device is gone, re-created and
registered: in the containerd namespaces that have its name (those its
pulls registered it in), or in [containerd] namespace when none has it
(pull --namespace NS registers it again elsewhere). Prints the snapshot and its device (with --format json, the
daemon's answer as one JSON object, or {"error": REASON} on failure). Exit
status 0 on success, 1 with the reason on failure, 2 on a usage error.
`

func init() {
	Register(&Command{Name: "activate", Summary: "(re)activate a pulled image's snapshot (via the daemon)", Run: runActivate})
}

func runActivate(ctx context.Context, args []string) error {
	fs := NewFlagSet("activate", "activate REF [--format table|json] [--config FILE] [--control-socket PATH]", activateDescription)
	AddConfigFlags(fs)
	var socket string
	addControlSocketFlag(fs, &socket)
	format := AddFormatFlag(fs, DefaultFormatUsage)
	pos, err := ParseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return UsageError(fs, "activate takes exactly one REF argument (the name given to pull, or its s3:// source)")
	}
	if pos[0] == "" {
		return UsageError(fs, "a REF must not be empty")
	}
	c, err := controlClient(socket)
	if err != nil {
		return err
	}
	res, err := c.Activate(ctx, pos[0])
	var refused *control.RequestError
	if errors.As(err, &refused) {
		// A usage error, on stderr in either format, as before any request.
		return refusedAsUsage(fs, "", err)
	}
	if format.JSON() {
		if err != nil {
			if werr := WriteJSON(os.Stdout, ActivateFailure{Error: err.Error()}); werr != nil {
				return werr
			}
			// The reason is in the JSON: stderr stays quiet, as for
			// pull and rm --format json.
			return &ExitError{Code: 1}
		}
		return WriteJSON(os.Stdout, res)
	}
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(os.Stdout, "active %s: snapshot %s on device %s, origin device %d\n",
		pos[0], res.SnapshotName, res.DevicePath, res.OriginDevice); err != nil {
		return fmt.Errorf("%s active, but writing the result failed: %w", pos[0], err)
	}
	return nil
}

// ActivateFailure is what `activate --format json` prints when the
// activation fails: one object with the reason.
type ActivateFailure struct {
	Error string `json:"error"`
}
