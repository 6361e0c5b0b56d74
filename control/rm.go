package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
)

// Remover removes pulled images (*gc.Collector). Handler serves /v1/rm when
// the Puller it is given is one too.
type Remover interface {
	Remove(ctx context.Context, refs []string) ([]api.Removed, error)
}

// RmRequest is the body of /v1/rm: the names (or s3:// sources) of the
// images to remove.
type RmRequest struct {
	Refs []string `json:"refs"`
}

// RmAnswer is the answer of /v1/rm: the images removed and, when some were
// not (in use, never pulled, or their removal failed), why.
type RmAnswer struct {
	Removed []api.Removed `json:"removed"`
	Error   string        `json:"error,omitempty"`
}

func serveRm(rm Remover, w http.ResponseWriter, r *http.Request) {
	var req RmRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || len(req.Refs) == 0 {
		writeJSON(w, http.StatusBadRequest, RmAnswer{Error: fmt.Sprintf("rm: request must name at least one image (%v)", err)})
		return
	}
	for _, ref := range req.Refs {
		if ref == "" {
			writeJSON(w, http.StatusBadRequest, RmAnswer{Error: "rm: an image name must not be empty"})
			return
		}
	}
	removed, err := rm.Remove(r.Context(), req.Refs)
	a := RmAnswer{Removed: removed}
	status := http.StatusOK
	if err != nil {
		log.G(r.Context()).WithError(err).WithField("refs", req.Refs).Warn("control: rm refused or failed")
		a.Error, status = err.Error(), http.StatusConflict
	}
	writeJSON(w, status, a)
}

// Remove asks the daemon to remove the pulled images refs. It returns the
// images removed, and an error saying why the others were not.
func (c *Client) Remove(ctx context.Context, refs []string) ([]api.Removed, error) {
	resp, err := c.post(ctx, "/v1/rm", RmRequest{Refs: refs})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		return nil, fmt.Errorf("control socket %s: the daemon does not serve rm (status %s)", c.socket, resp.Status)
	}
	var a RmAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return nil, fmt.Errorf("control socket %s: bad answer (status %s): %w", c.socket, resp.Status, err)
	}
	if a.Error != "" {
		return a.Removed, errors.New(a.Error)
	}
	return a.Removed, nil
}
