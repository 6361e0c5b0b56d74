package plugin

import "testing"

// TestAllowSetIDReachesThePipelines: pipeline.allow_setid is what the
// pulls' tarball validator applies (off unless the operator turns it on).
func TestAllowSetIDReachesThePipelines(t *testing.T) {
	cfg := DefaultConfig()
	if (&Service{Config: cfg}).PipelineOptions().Limits.AllowSetID {
		t.Fatal("setuid files admitted by default")
	}
	cfg.Pipeline.AllowSetID = true
	if !(&Service{Config: cfg}).PipelineOptions().Limits.AllowSetID {
		t.Fatal("pipeline.allow_setid = true does not reach the pipelines' tarball limits")
	}
}
