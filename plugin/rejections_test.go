package plugin

import (
	"errors"
	"fmt"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// TestRejectionRule classifies pull errors as the daemon reports them: a
// rejection inside a run arrives as the run's recorded reason (text only),
// the image size limit as a wrapped error; other failures are no rule.
func TestRejectionRule(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{errors.New(`pull s3://images/team/many/: layer 1 (team/many/1.tar): run 660f1d08578c28f6bee5ad901 (download-image) aborted at transition "download": transition "download": validate s3://images/team/many/1.tar: entry "usr/f21": too many entries: more than 20`), "too_many_entries"},
		{errors.New(`pull s3://b/x/: run 1 (download-image) aborted at transition "download": validate s3://b/x/1.tar: entry "usr/bin/su": setuid/setgid bit: mode 4755`), "setuid_setgid_bit"},
		{errors.New(`pull s3://images/team/scratch/: run 660f1ce69be3745a9449edc31 (unpack-image) aborted at transition "verify-layout": transition "verify-layout": unpack sha256:87ff from s3://images/team/scratch/1.tar: layout: etc: required directory missing`), "layout_required_directory_missing"},
		{errors.New(`pull s3://b/x/: unpack: layout: usr: not a directory`), "layout_not_a_directory"},
		{fmt.Errorf("pull s3://b/big/: %w: 2 layer objects of 88064 bytes together, limit 65536", pipeline.ErrImageTooLarge), "image_too_large"},
		{fmt.Errorf("validate: %w", &tarball.PolicyError{Entry: "dev/sda", Rule: tarball.ErrDeviceNode}), "device_node"},
		{errors.New(`pull s3://b/x/: list s3://b/x/: dial tcp 127.0.0.1:1: connect: connection refused`), ""},
		{errors.New(`pull s3://b/x/: open /mnt/x: not a directory`), ""},
		{nil, ""},
	}
	for _, c := range cases {
		if got := rejectionRule(c.err); got != c.want {
			t.Errorf("rejectionRule(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestEveryRuleCounted walks every rule the tarball package can raise
// (tarball.Rules, tarball.LayoutRules): each gets its own label, from the
// typed error in-process and from the reason a state-machine run records
// (the message alone), even when the entry's name is crafted to spell
// another rule.
func TestEveryRuleCounted(t *testing.T) {
	labels := map[string]error{}
	for _, r := range tarball.Rules() {
		pe := &tarball.PolicyError{Entry: `usr/x": ` + tarball.ErrSetID.Error() + "\x1b", Rule: r, Detail: "detail"}
		want := ruleLabel(r)
		if prev, ok := labels[want]; ok || want == "" {
			t.Errorf("rules %v and %v share the label %q", prev, r, want)
		}
		labels[want] = r
		typed := fmt.Errorf("pull s3://b/x/: layer 1 (x/1.tar): %w", pe)
		recorded := errors.New(`pull s3://b/x/: layer 1 (x/1.tar): run 1 (download-image) aborted at transition "download": transition "download": validate s3://b/x/1.tar: ` + pe.Error())
		for what, err := range map[string]error{"typed": typed, "recorded": recorded} {
			if got := rejectionRule(err); got != want {
				t.Errorf("%s %v: rule %q, want %q", what, err, got, want)
			}
		}
	}
	for _, r := range tarball.LayoutRules() {
		le := &tarball.LayoutError{Path: "etc", Rule: r}
		want := "layout_" + ruleLabel(r)
		if prev, ok := labels[want]; ok {
			t.Errorf("rules %v and %v share the label %q", prev, r, want)
		}
		labels[want] = r
		recorded := errors.New(`pull s3://b/x/: run 2 (unpack-image) aborted at transition "verify-layout": ` + le.Error())
		for what, err := range map[string]error{"typed": fmt.Errorf("activate: %w", le), "recorded": recorded} {
			if got := rejectionRule(err); got != want {
				t.Errorf("%s %v: rule %q, want %q", what, err, got, want)
			}
		}
	}
	if len(labels) < len(tarball.Rules())+len(tarball.LayoutRules()) || len(tarball.Rules()) == 0 {
		t.Fatalf("%d labels for %d rules", len(labels), len(tarball.Rules())+len(tarball.LayoutRules()))
	}
}
