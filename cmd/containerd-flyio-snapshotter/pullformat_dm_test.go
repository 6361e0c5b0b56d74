//go:build dm

package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
)

// TestPullFormatJSON runs `pull --format json` against a real daemon and
// parses its stdout the way a script would: every line one JSON object
// with exactly one of event, result or error; the daemon's progress events
// of every machine and layer, a download event carrying the tarball's
// size; the result last. A failing pull ends with an error line and exit
// status 1. Without --format json and off a terminal, progress is plain
// lines on stderr and stdout holds only the result line.
func TestPullFormatJSON(t *testing.T) {
	e := newPullEnv(t)
	base := genLayer(t, 1, "base", 8, 512<<10, true)
	top := genLayer(t, 2, "app", 2, 4<<10, false)
	e.srv.Put(t, "fmt/1.tar", base)
	e.srv.Put(t, "fmt/2.tar", top)

	code, out, errOut := runCommand(t, nil, "pull", "--config", e.cfgPath, "--format", "json", "s3://"+e.srv.Bucket+"/fmt/", "--name", "fmt")
	if code != 0 {
		t.Fatalf("pull --format json: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	var (
		events []api.Event
		result *api.PullResult
	)
	for i, l := range lines {
		var line control.Line
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("stdout line %d is not JSON: %q: %v", i+1, l, err)
		}
		set := 0
		for _, ok := range []bool{line.Event != nil, line.Result != nil, line.Error != ""} {
			if ok {
				set++
			}
		}
		if set != 1 {
			t.Fatalf("stdout line %d %q: want exactly one of event, result, error", i+1, l)
		}
		switch {
		case line.Event != nil:
			if result != nil {
				t.Fatalf("event after the result: %q", l)
			}
			events = append(events, *line.Event)
		case line.Result != nil:
			result = line.Result
		default:
			t.Fatalf("error line in a successful pull: %q", l)
		}
	}
	if result == nil || result.Ref != "fmt" || len(result.Layers) != 2 || !strings.HasPrefix(result.Snapshot.SnapshotName, "snap-") {
		t.Fatalf("result %+v: want ref fmt, 2 layers, an activation", result)
	}
	seen := map[string]bool{}
	var sized bool
	for _, ev := range events {
		seen[ev.FSM+"/"+string(rune('0'+ev.Layer))] = true
		if ev.FSM == api.FSMDownload && ev.Layer == 1 && ev.Total == int64(len(base)) {
			sized = true
		}
	}
	for _, want := range []string{api.FSMDownload + "/1", api.FSMDownload + "/2", api.FSMUnpack + "/1", api.FSMUnpack + "/2", api.FSMActivate + "/0"} {
		if !seen[want] {
			t.Errorf("no event of %s (machine/layer) among %d events", want, len(events))
		}
	}
	if !sized {
		t.Errorf("no download event of layer 1 with total %d bytes", len(base))
	}
	if strings.Contains(errOut, "layer 1") {
		t.Errorf("--format json also wrote progress on stderr: %q", errOut)
	}
	t.Logf("pull --format json: %d lines, %d events; first %s; last %s", len(lines), len(events), lines[0], lines[len(lines)-1])

	code, out, _ = runCommand(t, nil, "pull", "--config", e.cfgPath, "--format", "json", "s3://"+e.srv.Bucket+"/no-such-image/")
	lines = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	var last control.Line
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); code != 1 || err != nil || last.Error == "" {
		t.Errorf("failing pull --format json: exit %d, last line %q (%v); want exit 1 and an error line", code, lines[len(lines)-1], err)
	}

	e.srv.Put(t, "plain/1.tar", genLayer(t, 3, "base", 8, 512<<10, true))
	code, out, errOut = runCommand(t, nil, "pull", "--config", e.cfgPath, "s3://"+e.srv.Bucket+"/plain/", "--name", "plain")
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "pulled plain: 1 layer(s)") {
		t.Fatalf("plain pull: exit %d, stdout %q (want the one result line), stderr %q", code, out, errOut)
	}
	if !strings.Contains(errOut, "layer 1   download") || strings.ContainsAny(errOut, "\r\033") {
		t.Errorf("plain progress on stderr %q: want 'layer 1   download' lines without terminal control characters", errOut)
	}
	t.Logf("plain pull stderr:\n%s", errOut)
}
