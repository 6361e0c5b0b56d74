package cli

import (
	"strings"
	"testing"
)

// TestRmHelpNamesEveryRefusal: rm's help lists what makes an image in use
// as the collector judges it (gc.Collector's in-use check, which rm
// shares), so that an operator refused for one of them finds it there.
func TestRmHelpNamesEveryRefusal(t *testing.T) {
	help := strings.Join(strings.Fields(rmDescription), " ")
	for what, words := range map[string]string{
		"a container":                     "container",
		"a pull under way":                "a pull of it under way",
		"a pin of the config's":           "[gc] pinned",
		"a pin of containerd's":           "io.cri-containerd.pinned",
		"a containerd lease":              "lease",
		"its activation's device open":    "device is open",
		"containerd that does not answer": "containerd does not answer",
	} {
		if !strings.Contains(help, words) {
			t.Errorf("rm --help does not name %s (%q) among the refusals", what, words)
		}
	}
}
