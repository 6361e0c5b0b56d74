package metrics

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
)

// gauges gathers every gauge named name as "label=value,..." -> value.
func gauges(t *testing.T, m *Metrics, name string) map[string]float64 {
	t.Helper()
	return samples(t, m, name, gaugeValue)
}

// samples gathers every metric named name as "label=value,..." -> what
// value reads of it.
func samples(t *testing.T, m *Metrics, name string, value func(*dto.Metric) float64) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, mf := range gatherFamilies(t, m) {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			out[labelKey(mt)] = value(mt)
		}
	}
	return out
}

// TestPipelineMetricsFromDatabase: the pipeline gauges read what a real
// database holds at scrape time.
func TestPipelineMetricsFromDatabase(t *testing.T) {
	ctx := context.Background()
	db := metadatatest.Open(t)
	m := New()
	m.AddPipeline(pipeline.RecordsOf(db))

	if g := gauges(t, m, Namespace+"_pipeline_blob_bytes"); g[""] != 0 {
		t.Fatalf("blob bytes of an empty database = %v", g)
	}
	if err := pipeline.RecordsOf(db).StoreDownload(ctx, pipeline.Object{Bucket: "b", Key: "1.tar", ETag: `"e1"`, SizeBytes: 1000, Digest: "sha256:d1"},
		pipeline.LayerFile{Digest: "sha256:d1", Path: "/blobs/d1", SizeBytes: 1000, StatSize: 1000, StatMtimeNs: 1, StatIno: 1}); err != nil {
		t.Fatal(err)
	}
	if err := pipeline.RecordsOf(db).RecordPulledImage(ctx, "img-1", "s3://b/1.tar", []pipeline.ImageLayer{{Key: "1.tar", ETag: `"e1"`, SizeBytes: 1000, ChainID: "sha256:d1"}}, "one"); err != nil {
		t.Fatal(err)
	}
	if err := pipeline.RecordsOf(db).MarkImageFailed(ctx, "img-2", "s3://b/2.tar", "bad"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, state := range []fsm.State{fsm.StateRunning, fsm.StateComplete, fsm.StateComplete} {
		r := fsm.RunRecord{ID: "run-" + string(rune('a'+i)), FSM: "download-image", IdempotencyID: string(rune('a' + i)),
			Request: []byte("{}"), Transition: "download", State: fsm.StatePending, CreatedAt: now, UpdatedAt: now}
		if _, _, err := fsm.NewSQLiteStore(db).CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := fsm.NewSQLiteStore(db).Checkpoint(ctx, fsm.Checkpoint{RunID: r.ID, State: state, Transition: "download", At: now}); err != nil {
			t.Fatal(err)
		}
	}

	if g := gauges(t, m, Namespace+"_pipeline_blob_bytes"); g[""] != 1000 {
		t.Errorf("pipeline_blob_bytes = %v, want 1000", g)
	}
	if g := gauges(t, m, Namespace+"_pipeline_images"); g["download_status=completed"] != 1 || g["download_status=failed"] != 1 {
		t.Errorf("pipeline_images = %v, want one completed and one failed", g)
	}
	runs := gauges(t, m, Namespace+"_pipeline_runs")
	if runs["fsm=download-image,state=running"] != 1 || runs["fsm=download-image,state=complete"] != 2 {
		t.Errorf("pipeline_runs = %v, want 1 running and 2 complete download-image runs", runs)
	}
}
