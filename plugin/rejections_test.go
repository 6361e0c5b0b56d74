package plugin

import (
	"errors"
	"fmt"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// TestRejectionRule classifies pull errors by their typed cause: a policy
// or layout rejection wrapped anywhere in the chain (as a run's error wraps
// its transition's), the image size limit; a message that only reads like
// a rejection, and other failures, are no rule.
func TestRejectionRule(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("pull s3://b/x/: layer 1 (x/1.tar): %w", &tarball.PolicyError{Entry: "usr/f21", Rule: tarball.ErrTooManyEntries}), "too_many_entries"},
		{fmt.Errorf("pull s3://b/x/: %w", &tarball.LayoutError{Path: "etc", Rule: tarball.ErrLayoutMissing}), "layout_required_directory_missing"},
		{errors.New(`pull s3://b/x/: run 1 (download-image) aborted at transition "download": validate s3://b/x/1.tar: entry "usr/bin/su": setuid/setgid bit: mode 4755`), ""},
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
// (tarball.Rules, tarball.LayoutRules): each gets its own label from its
// typed error, even when the entry's name is crafted to spell another
// rule.
func TestEveryRuleCounted(t *testing.T) {
	labels := map[string]error{}
	for _, r := range tarball.Rules() {
		pe := &tarball.PolicyError{Entry: `usr/x": ` + tarball.ErrSetID.Error() + "\x1b", Rule: r, Detail: "detail"}
		want := ruleLabel(r)
		if prev, ok := labels[want]; ok || want == "" {
			t.Errorf("rules %v and %v share the label %q", prev, r, want)
		}
		labels[want] = r
		if err := fmt.Errorf("pull s3://b/x/: layer 1 (x/1.tar): %w", pe); rejectionRule(err) != want {
			t.Errorf("%v: rule %q, want %q", err, rejectionRule(err), want)
		}
	}
	for _, r := range tarball.LayoutRules() {
		le := &tarball.LayoutError{Path: "etc", Rule: r}
		want := "layout_" + ruleLabel(r)
		if prev, ok := labels[want]; ok {
			t.Errorf("rules %v and %v share the label %q", prev, r, want)
		}
		labels[want] = r
		if err := fmt.Errorf("activate: %w", le); rejectionRule(err) != want {
			t.Errorf("%v: rule %q, want %q", err, rejectionRule(err), want)
		}
	}
	if len(labels) < len(tarball.Rules())+len(tarball.LayoutRules()) || len(tarball.Rules()) == 0 {
		t.Fatalf("%d labels for %d rules", len(labels), len(tarball.Rules())+len(tarball.LayoutRules()))
	}
}
