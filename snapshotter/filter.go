package snapshotter

import (
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/filters"
)

// FilterAdaptor exposes a snapshot's fields to containerd's filter syntax:
// kind (active, view, committed), name, parent and labels.<key> (what Walk
// filters on).
func FilterAdaptor(info snapshots.Info) filters.Adaptor {
	return filters.AdapterFunc(func(fieldpath []string) (string, bool) {
		if len(fieldpath) == 0 {
			return "", false
		}
		switch fieldpath[0] {
		case "kind":
			switch info.Kind {
			case snapshots.KindActive:
				return "active", true
			case snapshots.KindView:
				return "view", true
			case snapshots.KindCommitted:
				return "committed", true
			}
			return "", false
		case "name":
			return info.Name, true
		case "parent":
			return info.Parent, true
		case "labels":
			if len(fieldpath) < 2 {
				return "", false
			}
			v, ok := info.Labels[strings.Join(fieldpath[1:], ".")]
			return v, ok
		}
		return "", false
	})
}
