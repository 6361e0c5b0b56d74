package plugin

import (
	"errors"
	"regexp"
	"strings"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// entryRules are the extraction policy's rules; a rejection's message
// names the entry, then the rule.
var entryRules = []error{
	tarball.ErrInvalidName, tarball.ErrAbsoluteName, tarball.ErrTraversal, tarball.ErrNameTooLong,
	tarball.ErrSymlinkEscape, tarball.ErrThroughSymlink, tarball.ErrParentNotDir, tarball.ErrRootNotDir,
	tarball.ErrHardlinkEscape, tarball.ErrHardlinkTarget, tarball.ErrSetID, tarball.ErrFileCapability,
	tarball.ErrDeviceNode, tarball.ErrUnsupportedType, tarball.ErrBadOwner, tarball.ErrTooManyEntries,
	tarball.ErrFileTooLarge, tarball.ErrTotalTooLarge, tarball.ErrWhiteoutEscape, tarball.ErrOutsideRootfs,
}

// layoutRules are the layout check's rules ("layout: PATH: RULE").
var layoutRules = []error{tarball.ErrLayoutMissing, tarball.ErrLayoutNotDir, tarball.ErrLayoutWorldWritable}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

// ruleLabel is a rule's message as a metric label ("setuid/setgid bit"
// becomes "setuid_setgid_bit").
func ruleLabel(rule error) string {
	return strings.Trim(nonWord.ReplaceAllString(strings.ToLower(rule.Error()), "_"), "_")
}

// rejectionRule names the policy rule that refused a pull, or "" when err
// is no rejection. A rejection inside a state-machine run reaches the pull
// as the run's recorded reason, a message without the error chain, so
// the rule is found in the message as the policy writes it.
func rejectionRule(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, pipeline.ErrImageTooLarge) {
		return ruleLabel(pipeline.ErrImageTooLarge)
	}
	msg := err.Error()
	for _, r := range entryRules {
		if errors.Is(err, r) || (strings.Contains(msg, "entry \"") && strings.Contains(msg, "\": "+r.Error())) {
			return ruleLabel(r)
		}
	}
	for _, r := range layoutRules {
		if errors.Is(err, r) || (strings.Contains(msg, "layout: ") && strings.Contains(msg, ": "+r.Error())) {
			return "layout_" + ruleLabel(r)
		}
	}
	return ""
}
