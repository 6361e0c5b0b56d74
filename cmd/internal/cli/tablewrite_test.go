package cli

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
)

// TestTableResultNotWrittenFails: pull, activate and rm in the table
// format whose result line cannot be written (stdout on a full disk) do
// not exit 0 as if the script redirecting stdout had its answer, as
// --format json does not (TestPullJSONFailsWhenItsAnswerIsNotWritten).
func TestTableResultNotWrittenFails(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer full.Close()
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pull", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(control.Line{Result: &api.PullResult{Ref: "app:v1"}})
	})
	mux.HandleFunc("POST /v1/activate", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(control.ActivateAnswer{Result: &api.ActivateResponse{SnapshotName: "snap-x"}})
	})
	mux.HandleFunc("POST /v1/rm", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(control.RmAnswer{Removed: []api.Removed{{ImageID: "x", Source: "s3://b/k"}}})
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()

	stdout := os.Stdout
	os.Stdout = full
	defer func() { os.Stdout = stdout }()
	for _, c := range []struct {
		name string
		run  func(context.Context, []string) error
		args []string
	}{
		{"pull", runPull, []string{"--control-socket", sock, "s3://b/k"}},
		{"activate", runActivate, []string{"--control-socket", sock, "app:v1"}},
		{"rm", runRm, []string{"--control-socket", sock, "app:v1"}},
	} {
		if err := c.run(context.Background(), c.args); err == nil {
			t.Errorf("%s with its result line not written (stdout full) returned no error: exit 0", c.name)
		}
	}
}
