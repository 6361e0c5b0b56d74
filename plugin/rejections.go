package plugin

import (
	"errors"
	"regexp"
	"slices"
	"strings"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

// ruleLabel is a rule's message as a metric label ("setuid/setgid bit"
// becomes "setuid_setgid_bit").
func ruleLabel(rule error) string {
	return strings.Trim(nonWord.ReplaceAllString(strings.ToLower(rule.Error()), "_"), "_")
}

// layoutLabel is a layout rule's label: "layout_" and the rule's.
func layoutLabel(rule error) string { return "layout_" + ruleLabel(rule) }

// rejectionRule names the policy rule that refused a pull, or "" when err
// is no rejection. The rule comes from the typed error when the error
// chain holds one (*tarball.PolicyError, *tarball.LayoutError). A
// rejection inside a state-machine run reaches the pull as the run's
// recorded reason, a message without the error chain; then the rule is
// read back from the message (tarball.RecordedRule).
func rejectionRule(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, pipeline.ErrImageTooLarge) {
		return ruleLabel(pipeline.ErrImageTooLarge)
	}
	var pe *tarball.PolicyError
	if errors.As(err, &pe) {
		return ruleLabel(pe.Rule)
	}
	var le *tarball.LayoutError
	if errors.As(err, &le) {
		return layoutLabel(le.Rule)
	}
	switch r := tarball.RecordedRule(err.Error()); {
	case r == nil:
		return ""
	case slices.Contains(tarball.LayoutRules(), r):
		return layoutLabel(r)
	default:
		return ruleLabel(r)
	}
}
