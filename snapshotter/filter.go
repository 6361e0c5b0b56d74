package snapshotter

import (
	"maps"
	"strconv"
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

// pushdown turns the equality selectors of a one-string Walk filter (name,
// kind, parent, labels.<key>) into a snapshotFilter, so that the
// database returns only the rows that can match instead of every row. It
// reports false when it cannot narrow soundly; Walk applies the whole
// filter to what the query returns either way. Soundness is checked
// against filter itself rather than trusted to this parser: a snapshot
// holding exactly the narrowed values must match, and changing any one of
// them must make it fail (so filter requires each of them).
func pushdown(fs []string, filter filters.Filter) (snapshotFilter, bool) {
	var f snapshotFilter
	if len(fs) != 1 {
		return f, false
	}
	var info snapshots.Info
	pushed := 0
	for _, part := range splitTopLevel(fs[0]) {
		field, value, ok := strings.Cut(part, "==")
		if !ok {
			continue
		}
		v, ok := filterValue(strings.TrimSpace(value))
		if !ok {
			continue
		}
		switch field = strings.TrimSpace(field); {
		case field == "name" && f.Key == "":
			f.Key, info.Name = v, v
		case field == "parent" && f.Parent == nil:
			f.Parent, info.Parent = &v, v
		case field == "kind" && f.Kind == "":
			k := kindOf(v)
			if k == snapshots.KindUnknown {
				return f, false
			}
			f.Kind, info.Kind = v, k
		case strings.HasPrefix(field, "labels."):
			key, ok := filterValue(strings.TrimPrefix(field, "labels."))
			if !ok || key == "" || strings.ContainsAny(key, `\"'`) {
				continue
			}
			if _, dup := f.Labels[key]; dup {
				continue
			}
			if f.Labels == nil {
				f.Labels, info.Labels = map[string]string{}, map[string]string{}
			}
			f.Labels[key], info.Labels[key] = v, v
		default:
			continue
		}
		pushed++
	}
	if pushed == 0 || !filter.Match(FilterAdaptor(info)) {
		return snapshotFilter{}, false
	}
	// Each narrowed value must be required by filter.
	const other = "\x00"
	checks := []func(snapshots.Info) snapshots.Info{}
	if f.Key != "" {
		checks = append(checks, func(i snapshots.Info) snapshots.Info { i.Name += other; return i })
	}
	if f.Parent != nil {
		checks = append(checks, func(i snapshots.Info) snapshots.Info { i.Parent += other; return i })
	}
	if f.Kind != "" {
		checks = append(checks, func(i snapshots.Info) snapshots.Info { i.Kind = snapshots.KindUnknown; return i })
	}
	for k := range f.Labels {
		checks = append(checks, func(i snapshots.Info) snapshots.Info {
			i.Labels = maps.Clone(i.Labels)
			i.Labels[k] += other
			return i
		})
	}
	for _, change := range checks {
		if filter.Match(FilterAdaptor(change(info))) {
			return snapshotFilter{}, false
		}
	}
	return f, true
}

// splitTopLevel splits a filter at the commas outside double quotes.
func splitTopLevel(s string) []string {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// filterValue is the value of a selector: a double-quoted string, or a
// bare one without quotes, spaces or the filter syntax's operators.
func filterValue(s string) (string, bool) {
	if strings.HasPrefix(s, `"`) {
		v, err := strconv.Unquote(s)
		return v, err == nil
	}
	if s == "" || strings.ContainsAny(s, "\"'`|~=!, \t") {
		return "", false
	}
	return s, true
}
