package plugin

import (
	"errors"
	"regexp"
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
// is no rejection. The rule comes from the typed error in the error chain
// (*tarball.PolicyError, *tarball.LayoutError): a rejection inside a
// state-machine run reaches the pull wrapped in the run's error
// (fsm.RunError.Unwrap).
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
	return ""
}
