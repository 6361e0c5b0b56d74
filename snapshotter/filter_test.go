package snapshotter

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/filters"
)

// The snapshots and filters of containerd's conformance Walk case, matched
// without a pool.
func TestWalkFilters(t *testing.T) {
	root := map[string]string{"containerd.io/gc.root": "check-walk"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range root {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	infos := []snapshots.Info{
		{Name: "a-np", Kind: snapshots.KindActive, Labels: root},
		{Name: "p", Kind: snapshots.KindCommitted, Labels: root},
		{Name: "a", Kind: snapshots.KindActive, Parent: "p", Labels: root},
		{Name: "v", Kind: snapshots.KindView, Parent: "p", Labels: root},
		{Name: "p-wl", Kind: snapshots.KindCommitted, Labels: with(map[string]string{"l": "1"})},
		{Name: "a-wl", Kind: snapshots.KindActive, Parent: "p-wl", Labels: with(map[string]string{"l": "2"})},
		{Name: "v-wl", Kind: snapshots.KindView, Parent: "p-wl", Labels: with(map[string]string{"l": "3"})},
		{Name: "a-np-wl", Kind: snapshots.KindActive, Labels: with(map[string]string{"l": "2"})},
		{Name: "nolabels", Kind: snapshots.KindActive},
	}
	for _, tc := range []struct {
		filters []string
		want    []string
	}{
		{[]string{`labels."containerd.io/gc.root"==check-walk`}, []string{"a-np", "p", "a", "v", "p-wl", "a-wl", "v-wl", "a-np-wl"}},
		{[]string{`kind==active,labels."containerd.io/gc.root"==check-walk`}, []string{"a-np", "a", "a-wl", "a-np-wl"}},
		{[]string{`kind==view`}, []string{"v", "v-wl"}},
		{[]string{`kind==committed`}, []string{"p", "p-wl"}},
		{[]string{"name==p", "name==a-np-wl"}, []string{"p", "a-np-wl"}},
		{[]string{"name==a-wl,labels.l"}, []string{"a-wl"}},
		{[]string{"parent==p"}, []string{"a", "v"}},
		{[]string{`parent!="",labels."containerd.io/gc.root"==check-walk`}, []string{"a", "v", "a-wl", "v-wl"}},
		{[]string{"labels.l"}, []string{"p-wl", "a-wl", "v-wl", "a-np-wl"}},
		{[]string{"labels.l==2"}, []string{"a-wl", "a-np-wl"}},
		{[]string{`name~=^a-`}, []string{"a-np", "a-wl", "a-np-wl"}},
		{nil, []string{"a-np", "p", "a", "v", "p-wl", "a-wl", "v-wl", "a-np-wl", "nolabels"}},
	} {
		f, err := filters.ParseAll(tc.filters...)
		if err != nil {
			t.Fatalf("parse %q: %v", tc.filters, err)
		}
		var got []string
		for _, in := range infos {
			if f.Match(FilterAdaptor(in)) {
				got = append(got, in.Name)
			}
		}
		slices.Sort(got)
		want := slices.Clone(tc.want)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("filters %q matched %v, want %v", tc.filters, got, want)
		}
	}
}

func TestWalkFilterSyntaxErrorIsReported(t *testing.T) {
	if _, err := filters.ParseAll("kind=="); err == nil {
		t.Fatal("want a parse error for an incomplete filter")
	}
}

// Walk narrows in the database what a single filter's equality selectors
// allow; whatever the filter, it must return exactly what matching every
// record in Go returns.
func TestWalkPushdownAgreesWithFilter(t *testing.T) {
	r := newRecordsOnly(t)
	ctx := context.Background()
	const ref = snapshots.LabelSnapshotRef
	r.seed("p,1", SnapKindCommitted, "", map[string]string{ref: "sha256:a", "x.y": "1"})
	r.seed("c", SnapKindCommitted, "p,1", map[string]string{ref: "sha256:b", "x.y": "2"})
	r.seed("c2", SnapKindCommitted, "p,1", map[string]string{ref: "sha256:a"})
	r.seed("a", SnapKindActive, "c", nil)
	r.seed("v", SnapKindView, "c", map[string]string{"x.y": "2"})
	all := func(fs ...string) []string {
		f, err := filters.ParseAll(fs...)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := r.reads().Snapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, row := range rows {
			if f.Match(FilterAdaptor(InfoOf(row))) {
				out = append(out, row.Key)
			}
		}
		return out
	}
	for _, tc := range []struct {
		fs     []string
		pushed bool
	}{
		{[]string{`labels."containerd.io/snapshot.ref"==sha256:a,parent=="p,1"`}, true},
		{[]string{fmt.Sprintf(`labels.%q==sha256:a,parent==%q`, ref, "")}, true},
		{[]string{`parent=="p,1"`}, true},
		{[]string{`parent==c,kind==view`}, true},
		{[]string{`name==a`}, true},
		{[]string{`labels.x.y==2`}, true},
		{[]string{`labels."x.y"==2,kind==committed`}, true},
		{[]string{`kind==nonsense`}, false},
		{[]string{`parent!=c`}, false},
		{[]string{`name~=/x,parent==c/`}, false},
		{[]string{`name~=^c`, `parent==c`}, false},
		{[]string{`labels."x.y"`}, false},
		{nil, false},
	} {
		f, err := filters.ParseAll(tc.fs...)
		if err != nil {
			t.Fatalf("%q: %v", tc.fs, err)
		}
		if _, ok := pushdown(tc.fs, f); ok != tc.pushed {
			t.Errorf("%q: pushed down = %v, want %v", tc.fs, ok, tc.pushed)
		}
		var got []string
		if err := r.Walk(ctx, func(_ context.Context, i snapshots.Info) error { got = append(got, i.Name); return nil }, tc.fs...); err != nil {
			t.Fatalf("%q: %v", tc.fs, err)
		}
		if want := all(tc.fs...); !slices.Equal(got, want) {
			t.Errorf("Walk(%q) = %v, matching every record gives %v", tc.fs, got, want)
		}
	}
}
