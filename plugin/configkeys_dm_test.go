//go:build dm

package plugin_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/control"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin/dmtest"
)

// tarOf is a layer tarball of the given directories and regular files
// (name → size in bytes).
func tarOf(t *testing.T, dirs []string, files map[string]int) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(1700000000, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	for name, size := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(size), ModTime: time.Unix(1700000000, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(bytes.Repeat([]byte{'x'}, size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// daemonPulls opens a service on cfg with its S3 pipelines, control
// socket and metrics endpoint (as serve does) and returns a pull through
// the control socket, the way the CLI asks.
func daemonPulls(t *testing.T, ctx context.Context, cfg *plugin.Config) func(bucket, key string) (*api.PullResult, error) {
	t.Helper()
	cfg.Daemon.ControlSocket = filepath.Join(cfg.Daemon.RootDir, "run", "control.sock")
	cfg.Daemon.MetricsAddress = loopbackAddr(t)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, err := plugin.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	stop, err := svc.StartFetcher(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	stopServe := dmtest.Serve(t, ctx, svc)
	t.Cleanup(func() { stopServe() })
	ctl := control.NewClient(cfg.Daemon.ControlSocket)
	return func(bucket, key string) (*api.PullResult, error) {
		return ctl.Pull(ctx, api.PullRequest{Bucket: bucket, Key: key}, nil)
	}
}

// TestConfigKeysChangePulls runs the same pulls against a daemon on the
// default configuration and one whose [s3] and [pipeline] keys are set,
// and checks that each key changes what a pull does: s3.bucket and
// s3.prefix resolve a bare path, s3.allowed_buckets (with s3.bucket)
// refuses other buckets, pipeline.max_image_size bounds the sum of the
// layers, pipeline.max_entries, max_file_size and max_total_size bound a
// layer, and an empty pipeline.required_dirs admits an image built FROM
// scratch.
func TestConfigKeysChangePulls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// The VM boots without a network: the fake S3 needs loopback up.
	plugin.LoopbackListener(t).Close()
	srv := s3test.NewServer(t)
	other := *srv
	other.Bucket = "other-images"
	srv.CreateBucket(t, other.Bucket)
	third := *srv
	third.Bucket = "third-images"
	srv.CreateBucket(t, third.Bucket)

	full := []string{"etc", "usr", "var"}
	// A static binary and its certificates, no etc/usr/var tree.
	scratch := tarOf(t, []string{"app"}, map[string]int{"app/server": 2048, "app/ca.pem": 512})
	srv.Put(t, "team/scratch/1.tar", scratch)
	// Two layers of 40 KiB each: each under a 64 KiB limit, not both.
	srv.Put(t, "team/big/1.tar", tarOf(t, full, map[string]int{"usr/a": 40 << 10}))
	srv.Put(t, "team/big/2.tar", tarOf(t, full, map[string]int{"usr/b": 40 << 10}))
	many := map[string]int{}
	for i := range 30 {
		many[fmt.Sprintf("usr/f%02d", i)] = 10
	}
	srv.Put(t, "team/many/1.tar", tarOf(t, full, many))
	srv.Put(t, "team/onefile/1.tar", tarOf(t, full, map[string]int{"usr/big": 20 << 10}))
	srv.Put(t, "team/total/1.tar", tarOf(t, full, map[string]int{"usr/a": 15 << 10, "usr/b": 15 << 10}))
	other.Put(t, "x/1.tar", tarOf(t, full, map[string]int{"etc/hostname": 6}))
	third.Put(t, "x/1.tar", tarOf(t, full, map[string]int{"etc/hostname": 6}))

	type pull struct {
		bucket, key string
		err         string // "" for success, else a substring of the error
	}
	s3 := func(cfg *plugin.Config) {
		cfg.S3.Region, cfg.S3.Endpoint, cfg.S3.PathStyle, cfg.S3.Anonymous = "us-east-1", srv.URL, true, true
	}
	cases := []struct {
		name  string
		cfg   func(*plugin.Config)
		pulls []pull
		// metrics are lines the metrics page must have after the pulls.
		metrics []string
	}{
		{"defaults", s3, []pull{
			{"", "scratch/", "no bucket: name one (s3://BUCKET/KEY) or set s3.bucket"},
			{srv.Bucket, "team/scratch/", "layout: etc: required directory missing"},
			{srv.Bucket, "team/big/", ""},
			{srv.Bucket, "team/many/", ""},
			{srv.Bucket, "team/onefile/", ""},
			{srv.Bucket, "team/total/", ""},
			{third.Bucket, "x/", ""},
		}, []string{
			`flyio_snapshotter_layers_rejected_total{rule="layout_required_directory_missing"} 1`,
			`flyio_snapshotter_pull_duration_seconds_count{outcome="ok"} 5`,
			`flyio_snapshotter_pull_duration_seconds_count{outcome="error"} 1`,
			`flyio_snapshotter_s3_requests_total{operation="ListObjectsV2",outcome="ok"} 6`,
			`flyio_snapshotter_s3_requests_total{operation="GetObject",outcome="ok"} 7`,
		}},
		{"keys set", func(cfg *plugin.Config) {
			s3(cfg)
			cfg.S3.Bucket, cfg.S3.Prefix, cfg.S3.AllowedBuckets = srv.Bucket, "team/", []string{other.Bucket}
			cfg.Pipeline.MaxImageSize = 64 << 10
			cfg.Pipeline.MaxEntries = 20
			cfg.Pipeline.MaxFileSize = 16 << 10
			cfg.Pipeline.MaxTotalSize = 24 << 10
			cfg.Pipeline.RequiredDirs = []string{}
		}, []pull{
			{"", "scratch/", ""},
			{"", "big/", "image too large: 2 layer objects of"},
			{"", "many/", "too many entries"},
			{"", "onefile/", "file too large"},
			{"", "total/", "too large"},
			{other.Bucket, "x/", ""},
			{third.Bucket, "x/", `bucket "third-images": bucket not allowed`},
		}, []string{
			`flyio_snapshotter_layers_rejected_total{rule="image_too_large"} 1`,
			`flyio_snapshotter_layers_rejected_total{rule="too_many_entries"} 1`,
			`flyio_snapshotter_layers_rejected_total{rule="file_too_large"} 1`,
			`flyio_snapshotter_layers_rejected_total{rule="total_size_too_large"} 1`,
			`flyio_snapshotter_pull_duration_seconds_count{outcome="ok"} 2`,
			`flyio_snapshotter_pull_duration_seconds_count{outcome="rejected"} 4`,
			`flyio_snapshotter_pull_duration_seconds_count{outcome="error"} 1`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := dmtest.Config(t)
			c.cfg(cfg)
			pullVia := daemonPulls(t, ctx, cfg)
			for _, p := range c.pulls {
				res, err := pullVia(p.bucket, p.key)
				switch {
				case p.err == "" && err != nil:
					t.Errorf("pull %q %q: %v, want success", p.bucket, p.key, err)
				case p.err != "" && (err == nil || !strings.Contains(err.Error(), p.err)):
					t.Errorf("pull %q %q: %v, want an error with %q", p.bucket, p.key, err, p.err)
				case err == nil:
					t.Logf("pull %q %q: %s, %d layer(s), snapshot %s", p.bucket, p.key, res.Source, len(res.Layers), res.Snapshot.SnapshotName)
				default:
					t.Logf("pull %q %q refused: %v", p.bucket, p.key, err)
				}
				if err == nil && p.bucket == "" && res.Source != "s3://"+srv.Bucket+"/"+cfg.S3.Prefix+p.key {
					t.Errorf("bare %q resolved to %s, want under s3://%s/%s", p.key, res.Source, srv.Bucket, cfg.S3.Prefix)
				}
			}
			page := plugin.Scrape(t, cfg.Daemon.MetricsAddress)
			for _, want := range c.metrics {
				if !strings.Contains(page, "\n"+want+"\n") {
					t.Errorf("metrics page lacks %q", want)
				}
			}
			var fetchLines []string
			for _, l := range strings.Split(page, "\n") {
				if strings.HasPrefix(l, "flyio_snapshotter_s3_") || strings.HasPrefix(l, "flyio_snapshotter_layers_rejected") ||
					strings.HasPrefix(l, "flyio_snapshotter_pull_duration_seconds_count") || strings.HasPrefix(l, "flyio_snapshotter_pull_duration_seconds_sum") {
					fetchLines = append(fetchLines, l)
				}
			}
			t.Logf("metrics page, fetch counters:\n%s", strings.Join(fetchLines, "\n"))
		})
	}
}
