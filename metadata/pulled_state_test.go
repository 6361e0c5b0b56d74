package metadata

import (
	"errors"
	"testing"
)

// TestPulledState: a pulled image whose records all agree is reported with
// its devices and blobs; any missing or disagreeing piece reports nothing
// (the pipelines then run and heal it).
func TestPulledState(t *testing.T) {
	db, ctx := openSnapStore(t)
	pipelineImage(t, ctx, db, 1, "sha256:c1", "sha256:d1")

	st, err := db.PulledState(ctx, "image-1", "snap-image-1", []string{"sha256:c1"}, []string{"sha256:d1"})
	if err != nil {
		t.Fatal(err)
	}
	if st == nil || len(st.Layers) != 1 || st.Layers[0].DeviceID != 101 || st.Layers[0].Blob == nil ||
		st.Layers[0].Blob.Path != "/blobs/sha256:d1" || st.ActivationDeviceID != 201 || st.Activation == nil || !st.Activation.Active {
		t.Fatalf("PulledState of a complete pull = %+v", st)
	}
	for name, args := range map[string][4]string{
		"other diff id":      {"image-1", "snap-image-1", "sha256:c1", "sha256:dX"},
		"unknown chain":      {"image-1", "snap-image-1", "sha256:cX", "sha256:d1"},
		"other image":        {"image-2", "snap-image-1", "sha256:c1", "sha256:d1"},
		"unknown activation": {"image-1", "snap-x", "sha256:c1", "sha256:d1"},
	} {
		st, err := db.PulledState(ctx, args[0], args[1], []string{args[2]}, []string{args[3]})
		if err != nil || st != nil {
			t.Errorf("%s: PulledState = %+v, %v; want nil, nil", name, st, err)
		}
	}
	removeSnapshot(t, ctx, db, "snap-image-1")
	if st, err := db.PulledState(ctx, "image-1", "snap-image-1", []string{"sha256:c1"}, []string{"sha256:d1"}); err != nil || st != nil {
		t.Errorf("activation snapshot gone: PulledState = %+v, %v; want nil, nil", st, err)
	}
}

// TestPulledImageState: the pulled-image record and its state come from
// one read; no record, or a record whose layers do not lead to its top
// chain, reports no state.
func TestPulledImageState(t *testing.T) {
	db, ctx := openSnapStore(t)
	pipelineImage(t, ctx, db, 1, "sha256:c1", "sha256:d1")
	layers := func(chain string) func(*PulledImage) ([]string, []string, error) {
		return func(*PulledImage) ([]string, []string, error) { return []string{chain}, []string{"sha256:d1"}, nil }
	}
	rec, st, err := db.PulledImageState(ctx, "ref-1", layers("sha256:c1"))
	if err != nil || rec == nil || rec.ImageID != "image-1" || st == nil || st.Activation == nil || st.Layers[0].DeviceID != 101 {
		t.Fatalf("PulledImageState(ref-1) = %+v, %+v, %v", rec, st, err)
	}
	if rec, st, err := db.PulledImageState(ctx, "ref-x", layers("sha256:c1")); rec != nil || st != nil || err != nil {
		t.Errorf("unknown ref: %+v, %+v, %v", rec, st, err)
	}
	if rec, st, err := db.PulledImageState(ctx, "ref-1", layers("sha256:cX")); rec == nil || st != nil || err != nil {
		t.Errorf("layers not ending at the top chain: %+v, %+v, %v", rec, st, err)
	}
	bad := errors.New("unreadable")
	if _, _, err := db.PulledImageState(ctx, "ref-1", func(*PulledImage) ([]string, []string, error) { return nil, nil, bad }); !errors.Is(err, bad) {
		t.Errorf("layers unreadable: err %v", err)
	}
}
