package cli

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
)

// fullDisk fails every write, as stdout on a full disk does.
type fullDisk struct{ writes int }

func (w *fullDisk) Write([]byte) (int, error) { w.writes++; return 0, syscall.ENOSPC }

// TestPullJSONFailsWhenItsAnswerIsNotWritten: `pull --format json` whose
// stdout takes no write does not exit 0 as if the script had its result:
// it fails, naming the write's error.
func TestPullJSONFailsWhenItsAnswerIsNotWritten(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		_ = enc.Encode(control.Line{Event: &api.Event{FSM: api.FSMDownload, State: "download", Layer: 1}})
		_ = enc.Encode(control.Line{Result: &api.PullResult{Ref: "app:v1"}})
	})}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()

	w := &fullDisk{}
	err = pullJSON(context.Background(), control.NewClient(sock), api.PullRequest{Key: "app/"}, w)
	if w.writes == 0 {
		t.Fatal("nothing was written")
	}
	var exit *ExitError
	if err == nil || errors.As(err, &exit) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "app:v1") {
		t.Fatalf("pull --format json with every write failing: %v; want an error naming the image and the write's error", err)
	}
}
