package plugin

import (
	"errors"
	"regexp"
	"strconv"
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
// found in the message as those errors write it, among every rule the
// tarball package lists (tarball.Rules, tarball.LayoutRules).
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
	msg := err.Error()
	if r := recordedRule(msg); r != nil {
		return ruleLabel(r)
	}
	for _, r := range tarball.LayoutRules() {
		if strings.Contains(msg, "layout: ") && strings.Contains(msg, ": "+r.Error()) {
			return layoutLabel(r)
		}
	}
	return ""
}

// recordedRule finds the rule in a *tarball.PolicyError's message inside a
// longer one: `entry "NAME": RULE`, where NAME is Go-quoted (so a quote in
// it is escaped and cannot end it early) and RULE is the longest of
// tarball.Rules that follows. nil when there is none.
func recordedRule(msg string) error {
	const marker = "entry "
	for i := strings.Index(msg, marker); i >= 0; {
		rest := msg[i+len(marker):]
		if q, err := strconv.QuotedPrefix(rest); err == nil {
			after := rest[len(q):]
			var found error
			for _, r := range tarball.Rules() {
				if strings.HasPrefix(after, ": "+r.Error()) && (found == nil || len(r.Error()) > len(found.Error())) {
					found = r
				}
			}
			if found != nil {
				return found
			}
		}
		j := strings.Index(rest, marker)
		if j < 0 {
			break
		}
		i += len(marker) + j
	}
	return nil
}
