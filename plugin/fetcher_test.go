package plugin

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

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

// TestTarLimitsReachThePipelines: the [pipeline] limits of a layer are the
// pulls' and validate's tarball limits, and required_dirs is the pulls'
// layout rule, an empty list kept apart from the default one.
func TestTarLimitsReachThePipelines(t *testing.T) {
	def := (&Service{Config: DefaultConfig()}).PipelineOptions()
	if def.Limits.MaxEntries != tarball.DefaultMaxEntries || def.Limits.MaxFileSize != tarball.DefaultMaxFileSize ||
		def.Limits.MaxTotalSize != tarball.DefaultMaxTotalSize || !slices.Equal(def.RequiredDirs, tarball.RequiredDirs) {
		t.Fatalf("defaults reach the pipelines as %+v, required dirs %q", def.Limits, def.RequiredDirs)
	}
	cfg, err := ParseConfig("test", []byte("[pipeline]\nmax_entries = 7\nmax_file_size = \"3KiB\"\nmax_total_size = \"5KiB\"\nrequired_dirs = []\nmax_image_size = \"1MiB\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	o := (&Service{Config: cfg}).PipelineOptions()
	if o.Limits.MaxEntries != 7 || o.Limits.MaxFileSize != 3<<10 || o.Limits.MaxTotalSize != 5<<10 {
		t.Errorf("limits %+v, want 7 entries, 3 KiB a file, 5 KiB in all", o.Limits)
	}
	if o.RequiredDirs == nil || len(o.RequiredDirs) != 0 {
		t.Errorf("required_dirs = [] reaches the pipelines as %#v, want an empty, non-nil list (no requirement)", o.RequiredDirs)
	}
	if o.MaxImageSize != 1<<20 {
		t.Errorf("max_image_size reaches the pipelines as %d", o.MaxImageSize)
	}
	cfg, err = ParseConfig("test", []byte("[pipeline]\nrequired_dirs = [\"etc\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := (&Service{Config: cfg}).PipelineOptions().RequiredDirs; !slices.Equal(got, []string{"etc"}) {
		t.Errorf("required_dirs = [\"etc\"] reaches the pipelines as %q", got)
	}
}

// TestResolvePull: what the daemon makes of a pull request under the [s3]
// section.
func TestResolvePull(t *testing.T) {
	open := DefaultConfig()
	restricted := DefaultConfig()
	restricted.S3.Bucket, restricted.S3.Prefix, restricted.S3.AllowedBuckets = "main-images", "team/", []string{"extra-images"}
	only := DefaultConfig()
	only.S3.AllowedBuckets = []string{"extra-images"}
	cases := []struct {
		name        string
		cfg         *Config
		bucket, key string
		wantBucket  string
		wantKey     string
		wantErr     string
	}{
		{"open, any bucket", open, "anything", "a/", "anything", "a/", ""},
		{"open, bare path", open, "", "a/", "", "", "no bucket: name one (s3://BUCKET/KEY) or set s3.bucket"},
		{"bare path under the prefix", restricted, "", "debian/", "main-images", "team/debian/", ""},
		{"URL names its key whole", restricted, "main-images", "debian/", "main-images", "debian/", ""},
		{"allowed bucket", restricted, "extra-images", "x.tar", "extra-images", "x.tar", ""},
		{"other bucket", restricted, "anything", "a/", "", "", `pull s3://anything/a/: bucket "anything": bucket not allowed (the daemon's s3.bucket and s3.allowed_buckets admit only main-images, extra-images)`},
		{"allowed list alone", only, "anything", "a/", "", "", "bucket not allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.cfg.ResolvePull(api.PullRequest{Bucket: c.bucket, Key: c.key})
			switch {
			case c.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got %+v, %v; want an error with %q", got, err, c.wantErr)
				}
				if strings.Contains(c.wantErr, "not allowed") && !errors.Is(err, ErrBucketNotAllowed) {
					t.Errorf("%v is not ErrBucketNotAllowed", err)
				}
			case err != nil:
				t.Fatal(err)
			case got.Bucket != c.wantBucket || got.Key != c.wantKey:
				t.Errorf("resolved to s3://%s/%s, want s3://%s/%s", got.Bucket, got.Key, c.wantBucket, c.wantKey)
			}
		})
	}
}

// TestPartSettingsReachTheSource: s3.part_size and
// s3.connections_per_object decide how the daemon's S3 source reads an
// object: as ranged GETs of part_size, or, with one connection, as one
// GET.
func TestPartSettingsReachTheSource(t *testing.T) {
	srv := s3test.NewServer(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), (5<<20+100)/16)
	srv.Put(t, "l.tar", data)
	for _, c := range []struct {
		conf   string
		ranges []string
	}{
		{"part_size = \"2MiB\"\nconnections_per_object = 2\n", []string{"bytes=0-2097151", "bytes=2097152-4194303", "bytes=4194304-5242975"}},
		{"part_size = \"2MiB\"\nconnections_per_object = 1\n", []string{""}},
	} {
		cfg, err := ParseConfig("test", []byte("[s3]\nanonymous = true\npath_style = true\nendpoint = \""+srv.URL+"\"\n"+c.conf))
		if err != nil {
			t.Fatal(err)
		}
		sc := cfg.S3SourceConfig(srv.Bucket)
		sc.Region = "us-east-1"
		src, err := s3source.New(context.Background(), sc)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := src.Stat(context.Background(), "l.tar")
		if err != nil {
			t.Fatal(err)
		}
		srv.Faults.Reset()
		r := src.NewReader(context.Background(), obj, 0)
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: read %d bytes, %v", c.conf, len(got), err)
		}
		var ranges []string
		for _, q := range srv.Faults.Recorded() {
			ranges = append(ranges, q.Range)
		}
		slices.Sort(ranges)
		if !slices.Equal(ranges, c.ranges) {
			t.Errorf("%s: GETs of ranges %q, want %q", c.conf, ranges, c.ranges)
		}
	}
}

// TestMemoryReleasedAfterPullsThatWorked: the memory goes back to the
// system once the last pull under way has ended, and only when one of the
// pulls since the last release downloaded, unpacked or failed; a re-pull
// answered from the records releases nothing, and the release never holds
// up the pull's end.
func TestMemoryReleasedAfterPullsThatWorked(t *testing.T) {
	released := make(chan struct{}, 4)
	block := make(chan struct{})
	p := &pullsUnderWay{release: func() { <-block; released <- struct{}{} }}
	wantReleases := func(what string, n int) {
		t.Helper()
		for range n {
			select {
			case <-released:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no release", what)
			}
		}
		select {
		case <-released:
			t.Fatalf("%s: a release too many", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	// A re-pull alone: nothing to release.
	p.begin()
	p.end(false)
	wantReleases("a re-pull alone", 0)

	// A pull that worked: end returns while its release is still held,
	// and the release follows.
	p.begin()
	ended := make(chan struct{})
	go func() { p.end(true); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the pull's end waited for the memory's release")
	}
	close(block)
	wantReleases("a pull that worked", 1)

	// A pull that worked ends while another is under way: the release
	// waits for the last one, whatever that one did.
	p.begin()
	p.begin()
	p.end(true)
	wantReleases("a pull that worked, another under way", 0)
	p.end(false)
	wantReleases("the last pull ended after one that worked", 1)

	// The release cleared the mark: the next re-pull releases nothing.
	p.begin()
	p.end(false)
	wantReleases("a re-pull after the release", 0)
}
