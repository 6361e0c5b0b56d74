//go:build dm

package upgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

// The command-line spellings this test gives both binaries, kept here and
// nowhere else: the previous release and the current binary must both
// accept them, and the current CLI's flag names are still being reworked.
// Everything else reaches the daemons through their config file and
// positional arguments (pull and ls read the control socket and the
// database from the config).
const (
	flagConfig = "--config" // the config file, on serve, pull and ls alike
	flagName   = "--name"   // pull: the image name to register
)

// jsonOutput asks ls for JSON (a word both CLIs' vocabularies keep).
var jsonOutput = []string{"--format", "json"}

// pullArgv is the argv of `pull` of image ref from source s3URL through
// daemon d's control socket.
func pullArgv(d *stack.Daemon, ref, s3URL string) []string {
	return []string{d.Bin, "pull", flagConfig, d.Config, flagName, ref, s3URL}
}

// imageRow is what the test reads of a row of `ls images` in JSON: the
// fields the previous release and the current binary both print.
type imageRow struct {
	ImageID        string   `json:"image_id"`
	S3Key          string   `json:"s3_key"`
	Names          []string `json:"names"`
	State          string   `json:"state"`
	DownloadStatus string   `json:"download_status"`
}

// lsImages runs d's binary's `ls images` (read-only: it also works with the
// daemon stopped) and returns its rows.
func lsImages(ctx context.Context, d *stack.Daemon) ([]imageRow, error) {
	out, err := d.CLI(ctx, []string{"ls", "images"}, jsonOutput...)
	if err != nil {
		return nil, err
	}
	var rows []imageRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		return nil, fmt.Errorf("%s ls images: %w: %s", d.Bin, err, out)
	}
	return rows, nil
}

// rowOf returns the row of the image pulled from s3URL, if listed.
func rowOf(rows []imageRow, s3URL string) (imageRow, bool) {
	for _, r := range rows {
		if r.S3Key == s3URL {
			return r, true
		}
	}
	return imageRow{}, false
}

// runRow is what the test reads of a row of `ls runs` in JSON (both
// binaries print these fields).
type runRow struct {
	RunID   string          `json:"run_id"`
	FSM     string          `json:"fsm"`
	State   string          `json:"state"`
	Request json.RawMessage `json:"request"`
}

// liveRunsOf runs d's binary's `ls runs` and returns the runs not yet
// ended (pending or running) whose request names an object under
// images/<name>/.
func liveRunsOf(ctx context.Context, d *stack.Daemon, name string) ([]runRow, error) {
	out, err := d.CLI(ctx, []string{"ls", "runs"}, jsonOutput...)
	if err != nil {
		return nil, err
	}
	var rows, live []runRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		return nil, fmt.Errorf("%s ls runs: %w: %s", d.Bin, err, out)
	}
	for _, r := range rows {
		if (r.State == "pending" || r.State == "running") && strings.Contains(string(r.Request), "images/"+name+"/") {
			live = append(live, r)
		}
	}
	return live, nil
}

// previous is the previous release prepare.sh built on the host.
type previous struct {
	Bin, Tag, Commit string
	Schema           int // the schema version it migrates to
}

// readPrevious reads .cache/upgrade/inputs, which prepare.sh writes.
func readPrevious(repo string) (previous, error) {
	path := filepath.Join(repo, ".cache/upgrade/inputs")
	in, err := stack.ReadInputs(path, "integration/upgrade/prepare.sh")
	if err != nil {
		return previous{}, fmt.Errorf("previous release: %w", err)
	}
	p := previous{Bin: in["bin"], Tag: in["tag"], Commit: in["commit"]}
	p.Schema, _ = strconv.Atoi(in["schema"])
	if p.Bin == "" || p.Tag == "" || p.Commit == "" || p.Schema < 1 {
		return previous{}, fmt.Errorf("%s: want bin=, tag=, commit= and schema=N (run integration/upgrade/prepare.sh)", path)
	}
	if _, err := os.Stat(p.Bin); err != nil {
		return previous{}, fmt.Errorf("previous release of %s: %w", path, err)
	}
	return p, nil
}

// bgPull is a pull CLI running in the background, its output collected.
type bgPull struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan struct{}
	err  error
}

func (b *bgPull) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out.Write(p)
}

// startPull starts `pull` of ref from s3URL through d without waiting for it.
func startPull(d *stack.Daemon, ref, s3URL string) (*bgPull, error) {
	argv := pullArgv(d, ref, s3URL)
	b := &bgPull{cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	b.cmd.Stdout, b.cmd.Stderr = b, b
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	go func() {
		b.err = b.cmd.Wait()
		close(b.done)
	}()
	return b, nil
}

// wait returns the pull's exit error and output once it has ended, or an
// error when ctx ends first (the pull is then killed).
func (b *bgPull) wait(ctx context.Context) (exitErr error, out string, err error) {
	select {
	case <-b.done:
	case <-ctx.Done():
		_ = b.cmd.Process.Kill()
		<-b.done
		return nil, "", fmt.Errorf("pull still running: %w", ctx.Err())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err, b.out.String(), nil
}
