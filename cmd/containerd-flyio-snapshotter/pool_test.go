package main

import (
	"os"
	"strings"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

func TestPoolHelp(t *testing.T) {
	for _, args := range [][]string{{"pool", "--help"}, {"pool", "status", "--help"}, {"pool", "ls", "--help"}} {
		code, out, _ := runCommand(t, nil, args...)
		if code != 0 || !strings.HasPrefix(out, "Usage: containerd-flyio-snapshotter "+strings.Join(args[:len(args)-1], " ")) {
			t.Errorf("%v = %d, %q", args, code, out)
			continue
		}
		if len(args) == 3 {
			for _, flag := range []string{"-config", "-format"} {
				if !strings.Contains(out, flag) {
					t.Errorf("%v does not document %s: %q", args, flag, out)
				}
			}
		}
	}
	if _, out, _ := runCommand(t, nil, "pool", "ls", "--help"); !strings.Contains(out, "-db") || !strings.Contains(out, "-check") {
		t.Errorf("pool ls --help lacks --db or --check: %q", out)
	}
}

func TestPoolUsageErrors(t *testing.T) {
	cfg, root := tempConfig(t, "")
	cases := []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"pool"}, 2, ""},
		{[]string{"pool", "resize"}, 2, `unknown pool subcommand "resize"`},
		{[]string{"pool", "status", "--config", cfg, "--format", "yaml"}, 2, `must be table or json, got "yaml"`},
		{[]string{"pool", "status", "--config", cfg, "extra"}, 2, `unexpected argument "extra"`},
		// No such pool in the kernel: reported, and nothing is created.
		{[]string{"pool", "status", "--config", cfg}, 1, `pool "` + testPoolName + `" is not active`},
	}
	for _, tc := range cases {
		code, _, errOut := runCommand(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.inStderr) {
			t.Errorf("%v = %d, %q; want %d and %q", tc.args, code, errOut, tc.code, tc.inStderr)
		}
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("pool status created %s: %v", root, err)
	}
}

// TestPoolStatusShowsReserveAndQueuedWrites: `pool status` shows the
// reserve in bytes and whether new devices are refused for it, and what
// writes do on a full pool and now, from the pool's status line.
func TestPoolStatusShowsReserveAndQueuedWrites(t *testing.T) {
	st := thinpool.PoolStatus{UsedMetadataBlocks: 10, TotalMetadataBlocks: 1024, UsedDataBlocks: 4096, TotalDataBlocks: 4096,
		BlockSizeSectors: 128, Mode: thinpool.ModeOutOfDataSpace, QueueIfNoSpace: true}
	v := newPoolStatusView("p1", st, 10)
	secs := int64(5)
	v.NoSpaceTimeoutSeconds = &secs
	if !v.UnderReserve || !v.WritesQueued || v.WritesFailing || v.ReserveDataBytes != 410*64<<10 || v.ReserveMetadataBytes != 103*4096 {
		t.Fatalf("view of a full queueing pool: %+v", v)
	}
	var out strings.Builder
	if err := writePoolStatusTable(&out, v, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"reserve                10%: 25.6 MiB of data, 412.0 KiB of metadata; under it: yes, new devices are refused",
		"writes on a full pool  wait up to 5s (the kernel's no_space_timeout) for space, then fail (queue_if_no_space)",
		"writes now             QUEUED",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("pool status lacks %q:\n%s", want, out.String())
		}
	}
	// Once the timeout expired the kernel fails the writes.
	st.QueueIfNoSpace, st.ErrorIfNoSpace = false, true
	if v := newPoolStatusView("p1", st, 10); v.WritesQueued || !v.WritesFailing || !strings.HasPrefix(writesNow(v), "FAILING") {
		t.Errorf("view after the timeout: %+v, %q", v, writesNow(v))
	}
	// Room again, above the reserve: nothing refused, writes served.
	st.UsedDataBlocks, st.Mode, st.QueueIfNoSpace, st.ErrorIfNoSpace = 100, thinpool.ModeReadWrite, true, false
	if v := newPoolStatusView("p1", st, 10); v.UnderReserve || v.WritesQueued || writesNow(v) != "served" {
		t.Errorf("view of a pool with room: %+v", v)
	}
}
