package pipeline

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3test"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
)

// tarFile is one entry of a test archive.
type tarFile struct {
	name, link string
	typ        byte
	mode       int64
	body       []byte
}

// buildTar writes an archive of files (directories and files in order).
func buildTar(t testing.TB, files []tarFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Linkname: f.link, Typeflag: f.typ, Mode: f.mode, Size: int64(len(f.body)), ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// imageTar is a small valid image (etc/, usr/, var/ and a random file of
// size bytes, so that two calls differ).
func imageTar(t testing.TB, size int, seed uint64) []byte {
	body := make([]byte, size)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	return buildTar(t, []tarFile{
		{name: "etc/", typ: tar.TypeDir}, {name: "usr/", typ: tar.TypeDir}, {name: "var/", typ: tar.TypeDir},
		{name: "etc/hostname", body: []byte("flyio\n")},
		{name: "usr/blob.bin", body: body},
	})
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

type env struct {
	t   *testing.T
	srv *s3test.Server
	db  *metadata.DB
	p   *Pipelines
	dir string
	sn  *faultSnapshots // nil for download-only environments
}

// newEnv starts a fake S3, a database and the pipelines (download only:
// no snapshotter), with short retry delays and the given download timeout.
func newEnv(t *testing.T, timeout time.Duration) *env {
	t.Helper()
	return newEnvWith(t, func(_ *env, o *Options) { o.DownloadTimeout = timeout })
}

// newEnvWith is newEnv with the options changed by configure (after the
// defaults of these tests are set, before New; the environment has its
// server, database and directory).
func newEnvWith(t *testing.T, configure func(*env, *Options)) *env {
	t.Helper()
	ctx := context.Background()
	srv := s3test.NewServer(t)
	dir := t.TempDir()
	db := metadatatest.OpenPath(t, filepath.Join(dir, "meta.db"))
	e := &env{t: t, srv: srv, db: db, dir: dir}
	opts := e.options()
	if configure != nil {
		configure(e, &opts)
	}
	p, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	e.p = p
	return e
}

// newTruncatingEnv is newEnv with a 256 KiB image tarball, generated from
// seed, stored at key; the fake S3 cuts the next n GETs of key short after
// 1000 bytes. It returns the tarball too.
func newTruncatingEnv(t *testing.T, key string, seed uint64, n int) (*env, []byte) {
	t.Helper()
	e := newEnv(t, time.Minute)
	data := imageTar(t, 256<<10, seed)
	e.srv.Put(t, key, data)
	e.srv.Faults.Truncate(n, key, 1000)
	return e, data
}

// options are the options of the environment's pipelines: its S3, its
// database and directory, short retry delays.
func (e *env) options() Options {
	return Options{
		DB: e.db, DownloadDir: filepath.Join(e.dir, "images"), DownloadTimeout: time.Minute, RetryInitial: 5 * time.Millisecond,
		Sources: func(ctx context.Context, bucket string) (*s3source.Source, error) {
			return s3source.New(ctx, s3source.Config{Bucket: bucket, Region: "us-east-1", Endpoint: e.srv.URL, PathStyle: true, Anonymous: true})
		},
	}
}

// stat lists key as Pull does before starting downloads.
func (e *env) stat(key string) s3source.Object {
	e.t.Helper()
	ctx := context.Background()
	src, err := e.p.opts.Sources(ctx, e.srv.Bucket)
	if err != nil {
		e.t.Fatal(err)
	}
	obj, err := src.Stat(ctx, key)
	if err != nil {
		e.t.Fatal(err)
	}
	return obj
}

// download runs the Download machine for key as Pull would and waits.
func (e *env) download(key string) (*DownloadResponse, fsm.RunRecord, error) {
	e.t.Helper()
	return e.downloadObj(e.stat(key))
}

func (e *env) downloadObj(obj s3source.Object) (*DownloadResponse, fsm.RunRecord, error) {
	e.t.Helper()
	ctx := context.Background()
	dr := &DownloadRequest{S3Key: obj.Key, Bucket: e.srv.Bucket, Size: obj.Size, ETag: obj.ETag}
	runID, err := e.p.startDownload(ctx, objectRunID(dr), dr, fsm.WithQueue(QueueDownloads))
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := fsm.Await[DownloadResponse](ctx, e.p.m, runID)
	rec, rerr := e.p.m.Run(ctx, runID)
	if rerr != nil {
		e.t.Fatal(rerr)
	}
	return resp, rec, err
}

// downloadNewImage stores a 64 KiB image tarball, generated from seed, at
// key and downloads it, failing the test unless the download wrote it with
// its entries counted.
func (e *env) downloadNewImage(key string, seed uint64) {
	e.t.Helper()
	e.srv.Put(e.t, key, imageTar(e.t, 64<<10, seed))
	resp, _, err := e.download(key)
	if err != nil || !resp.Downloaded || resp.Entries == 0 {
		e.t.Fatalf("download of %s: %+v, %v", key, resp, err)
	}
}

// assertNothingLeft checks no temp file, no live run, and no record of a
// download of key remain.
func (e *env) assertNothingLeft(key string) {
	e.t.Helper()
	ctx := context.Background()
	tmps, _ := os.ReadDir(filepath.Join(e.dir, "images", "tmp"))
	if len(tmps) != 0 {
		e.t.Errorf("temp files left: %v", tmps)
	}
	if o, err := RecordsOf(e.db).ObjectRecord(ctx, e.srv.Bucket, key); err != nil || o != nil {
		e.t.Errorf("object record left for %s: %+v, %v", key, o, err)
	}
	if n, err := RecordsOf(e.db).LiveRuns(ctx); err != nil || n != 0 {
		e.t.Errorf("live runs left: %d, %v", n, err)
	}
}

// assertStored checks the layer file and the records of key's download.
func (e *env) assertStored(key string, data []byte, resp *DownloadResponse) {
	e.t.Helper()
	ctx := context.Background()
	got, err := os.ReadFile(resp.LocalPath)
	if err != nil || !bytes.Equal(got, data) {
		e.t.Fatalf("stored file %s: %d bytes, err %v; want the object's %d bytes", resp.LocalPath, len(got), err, len(data))
	}
	if resp.Checksum != sha(data) || filepath.Base(resp.LocalPath) != strings.TrimPrefix(sha(data), "sha256:") {
		e.t.Errorf("checksum %s at %s, want %s (content addressed)", resp.Checksum, resp.LocalPath, sha(data))
	}
	o, err := RecordsOf(e.db).ObjectRecord(ctx, e.srv.Bucket, key)
	if err != nil || o == nil || o.Digest != sha(data) || o.SizeBytes != int64(len(data)) || o.ETag == "" {
		e.t.Errorf("object record of %s: %+v, %v", key, o, err)
	}
	f, err := RecordsOf(e.db).LayerFile(ctx, sha(data))
	if err != nil || f == nil || f.Path != resp.LocalPath || f.SizeBytes != int64(len(data)) {
		e.t.Errorf("layer record of %s: %+v, %v", key, f, err)
	}
	tmps, _ := os.ReadDir(filepath.Join(e.dir, "images", "tmp"))
	if len(tmps) != 0 {
		e.t.Errorf("temp files left: %v", tmps)
	}
}

func TestDownload503sThenSuccess(t *testing.T) {
	e := newEnv(t, time.Minute)
	data := imageTar(t, 64<<10, 1)
	e.srv.Put(t, "img/a.tar", data)
	obj := e.stat("img/a.tar")
	e.srv.Faults.Fail503(3, "img/a.tar")
	resp, rec, err := e.downloadObj(obj)
	if err != nil {
		t.Fatalf("download after 503s: %v", err)
	}
	e.assertStored("img/a.tar", data, resp)
	if n := e.srv.Requests("GET", "img/a.tar"); n != 4 {
		t.Errorf("GET requests = %d, want 4 (three 503s, then the object)", n)
	}

	if rec.State != fsm.StateComplete || !resp.Downloaded {
		t.Errorf("run %s state %s, downloaded %v", rec.ID, rec.State, resp.Downloaded)
	}
}

func TestDownloadDroppedMidBodyResumesWithRange(t *testing.T) {
	e := newEnv(t, time.Minute)
	data := imageTar(t, 1<<20, 2)
	e.srv.Put(t, "img/b.tar", data)
	e.srv.Faults.DropAfter(1, "img/b.tar", int64(len(data)/2))
	reads := 0
	e.p.hooks = map[string]func(){"validate:reading": func() { reads++ }}
	resp, _, err := e.download("img/b.tar")
	if err != nil {
		t.Fatalf("download with a dropped connection: %v", err)
	}
	// The ranged resume kept feeding the same in-stream validation: the
	// whole archive was checked without reading the file again.
	if reads != 0 || resp.Entries != 5 {
		t.Errorf("after a resumed download: validate read the file %d time(s), entries %d", reads, resp.Entries)
	}
	e.assertStored("img/b.tar", data, resp)
	if resp.Resumes != 1 {
		t.Errorf("resumes = %d, want 1 (one ranged GET after the drop)", resp.Resumes)
	}
	if n := e.srv.Requests("GET", "img/b.tar"); n != 2 {
		t.Errorf("GET requests = %d, want 2 (the cut one and the ranged resume)", n)
	}
}

func TestDownloadTruncatedObject(t *testing.T) {
	t.Run("retried to success", func(t *testing.T) {
		e, data := newTruncatingEnv(t, "img/c.tar", 3, 2)
		resp, _, err := e.download("img/c.tar")
		if err != nil {
			t.Fatalf("download of a twice-truncated object: %v", err)
		}
		e.assertStored("img/c.tar", data, resp)
	})
	t.Run("always truncated ends clean", func(t *testing.T) {
		e, _ := newTruncatingEnv(t, "img/d.tar", 4, 1000)
		_, rec, err := e.download("img/d.tar")
		if !errors.Is(err, fsm.ErrFailed) && !errors.Is(err, fsm.ErrAborted) {
			t.Fatalf("download of an always-truncated object: err %v, want the run ended", err)
		}
		if rec.Transition != "download" || rec.Attempts != 5 {
			t.Errorf("run ended at %q after %d attempts, want download after its 5 attempts", rec.Transition, rec.Attempts)
		}
		e.assertNothingLeft("img/d.tar")
		blobs, _ := os.ReadDir(filepath.Join(e.dir, "images", "blobs", "sha256"))
		if len(blobs) != 0 {
			t.Errorf("blobs left: %v", blobs)
		}
	})
}

func TestDownloadSlowerThanTimeout(t *testing.T) {
	e := newEnv(t, 150*time.Millisecond)
	data := imageTar(t, 16<<10, 5)
	e.srv.Put(t, "img/e.tar", data)
	obj := e.stat("img/e.tar")
	e.srv.Faults.Delay(100, "img/e.tar", 10*time.Second)
	dr := &DownloadRequest{S3Key: "img/e.tar", Bucket: e.srv.Bucket, Size: obj.Size, ETag: obj.ETag}
	runID, err := e.p.startDownload(context.Background(), objectRunID(dr), dr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fsm.Await[DownloadResponse](context.Background(), e.p.m, runID)
	rec, _ := e.p.m.Run(context.Background(), runID)
	if !errors.Is(err, fsm.ErrFailed) || rec.Transition != "download" || rec.Attempts != 5 {
		t.Fatalf("slow server: err %v, ended at %q after %d attempts; want failed at download after 5 timed-out attempts", err, rec.Transition, rec.Attempts)
	}
	if !strings.Contains(rec.LastError, "timed out") {
		t.Errorf("last error %q does not say the attempts timed out", rec.LastError)
	}
	e.assertNothingLeft("img/e.tar")
}

func TestDownloadHostileTarballAborted(t *testing.T) {
	cases := []struct {
		name  string
		files []tarFile
		want  []string // in the reason: the entry and the rule
	}{
		{"traversal", []tarFile{{name: "etc/", typ: tar.TypeDir}, {name: "../../evil", body: []byte("x")}}, []string{"../../evil", "climbs"}},
		{"setuid", []tarFile{{name: "bin/su", mode: 0o4755, body: []byte("x")}}, []string{"bin/su", "setuid"}},
		{"symlink escape", []tarFile{{name: "esc", typ: tar.TypeSymlink, link: "../../../etc"}}, []string{"esc"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, time.Minute)
			data := buildTar(t, c.files)
			key := "bad/" + strings.ReplaceAll(c.name, " ", "-") + ".tar"
			e.srv.Put(t, key, data)
			_, rec, err := e.download(key)
			// The policy checks the bytes as they arrive: the rejection
			// stops the download itself.
			if !errors.Is(err, fsm.ErrAborted) || rec.Transition != "download" {
				t.Fatalf("hostile tarball %d: err %v at %q, want aborted at download", i, err, rec.Transition)
			}
			for _, w := range c.want {
				if !strings.Contains(strings.ToLower(rec.LastError), strings.ToLower(w)) {
					t.Errorf("reason %q does not name %q", rec.LastError, w)
				}
			}
			if _, err := os.Stat(filepath.Join(e.dir, "images", "blobs", "sha256", strings.TrimPrefix(sha(data), "sha256:"))); !os.IsNotExist(err) {
				t.Errorf("rejected file still on disk (stat err %v)", err)
			}
			if !strings.Contains(rec.LastError, c.files[len(c.files)-1].name) {
				t.Errorf("failure reason %q does not name the entry", rec.LastError)
			}
			e.assertNothingLeft(key)
		})
	}
}

// TestDownloadReadsTheTarballOnce: on the happy path the tarball is
// validated while it downloads and the validate transition does not read
// it again; a file changed between download and validate (here cut short)
// is read again and rejected with the reason, nothing left behind.
func TestDownloadReadsTheTarballOnce(t *testing.T) {
	e := newEnv(t, time.Minute)
	reads := 0
	e.p.hooks = map[string]func(){"validate:reading": func() { reads++ }}
	e.downloadNewImage("once/1.tar", 4)
	if reads != 0 {
		t.Errorf("validate read the tarball again %d time(s) after it was validated while downloading", reads)
	}

	data := imageTar(t, 64<<10, 5)
	e.srv.Put(t, "changed/1.tar", data)
	e.p.hooks["validate:started"] = func() {
		// Someone rewrites the blob between download and validate.
		path := filepath.Join(e.dir, "images", "blobs", "sha256", strings.TrimPrefix(sha(data), "sha256:"))
		if err := os.WriteFile(path+".new", append([]byte(nil), data[:len(data)-1024]...), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Error(err)
		}
	}
	_, rec, err := e.download("changed/1.tar")
	if reads != 1 {
		t.Errorf("validate read a changed file %d times, want 1", reads)
	}
	if !errors.Is(err, fsm.ErrAborted) || rec.Transition != "validate" || !strings.Contains(rec.LastError, "changed/1.tar: malformed tar") {
		t.Fatalf("changed (cut) file: err %v at %q, want aborted at validate naming the object and the damage", err, rec.Transition)
	}
	e.assertNothingLeft("changed/1.tar")
}

// TestDownloadAllowSetID: with Limits.AllowSetID (pipeline.allow_setid)
// a layer carrying setuid and setgid files, as real distribution images
// do (su, passwd), downloads; without it, it is rejected naming the entry.
func TestDownloadAllowSetID(t *testing.T) {
	data := buildTar(t, []tarFile{
		{name: "bin/", typ: tar.TypeDir}, {name: "bin/su", mode: 0o4755, body: []byte("x")},
		{name: "usr/", typ: tar.TypeDir}, {name: "usr/bin/", typ: tar.TypeDir}, {name: "usr/bin/wall", mode: 0o2755, body: []byte("y")},
	})
	e := newEnv(t, time.Minute)
	e.srv.Put(t, "debian/1.tar", data)
	if _, rec, err := e.download("debian/1.tar"); !errors.Is(err, fsm.ErrAborted) || !strings.Contains(rec.LastError, "bin/su") {
		t.Fatalf("setuid file by default: err %v (%s), want a rejection naming bin/su", err, rec.LastError)
	}
	e = newEnv(t, time.Minute)
	e.p.opts.Limits.AllowSetID = true
	e.srv.Put(t, "debian/1.tar", data)
	if resp, _, err := e.download("debian/1.tar"); err != nil || !resp.Downloaded {
		t.Fatalf("setuid and setgid files with AllowSetID: %+v, %v", resp, err)
	}
}

// TestDownloadValidatesAgainAfterRestart: a process that did not see the
// bytes go by (a restart between download and validate)
// reads the whole file again before trusting it.
func TestDownloadValidatesAgainAfterRestart(t *testing.T) {
	e := newEnv(t, time.Minute)
	reads := 0
	e.p.hooks = map[string]func(){
		// What a restart loses: this process's record of the in-stream check.
		"validate:started": func() { e.p.validated.Clear() },
		"validate:reading": func() { reads++ },
	}
	e.downloadNewImage("restart/1.tar", 3)
	if reads != 1 {
		t.Errorf("validate read the file %d time(s) with no record of the in-stream check, want 1", reads)
	}
}

func TestDownloadIdempotentAndDeduplicated(t *testing.T) {
	e := newEnv(t, time.Minute)
	data := imageTar(t, 128<<10, 6)
	e.srv.Put(t, "x/1.tar", data)
	e.srv.Put(t, "y/1.tar", data) // same content under another key
	first, _, err := e.download("x/1.tar")
	if err != nil || !first.Downloaded {
		t.Fatalf("first download: %+v, %v", first, err)
	}
	e.srv.Faults.Reset()
	again, rec, err := e.download("x/1.tar")
	if err != nil || !again.AlreadyExist || again.Downloaded {
		t.Fatalf("re-download: %+v, %v; want handed off at check-exists", again, err)
	}
	if rec.Transition != "complete" || e.srv.Requests("GET", "x/1.tar") != 0 {
		t.Errorf("re-download made %d GETs (run at %q), want none", e.srv.Requests("GET", "x/1.tar"), rec.Transition)
	}
	// Same content under another key: the listing proves nothing of the
	// bytes, so they are downloaded, and found to be the stored layer once
	// hashed (one file).
	other, _, err := e.download("y/1.tar")
	if err != nil {
		t.Fatal(err)
	}
	if !other.Downloaded || other.LocalPath != first.LocalPath || e.srv.Requests("GET", "y/1.tar") != 1 {
		t.Errorf("same content under another key: downloaded %v, path %s vs %s, GETs %d; want one download into the same file",
			other.Downloaded, other.LocalPath, first.LocalPath, e.srv.Requests("GET", "y/1.tar"))
	}
	e.assertStored("y/1.tar", data, other)
	e.assertStored("x/1.tar", data, first)
	blobs, _ := os.ReadDir(filepath.Join(e.dir, "images", "blobs", "sha256"))
	if len(blobs) != 1 {
		t.Errorf("%d blobs stored, want 1", len(blobs))
	}
	// A file changed behind our back is detected and downloaded again.
	if err := os.WriteFile(first.LocalPath, []byte("corrupt"), 0o600); err != nil {
		t.Fatal(err)
	}
	fixed, _, err := e.download("x/1.tar")
	if err != nil || !fixed.Downloaded {
		t.Fatalf("after corruption: %+v, %v; want a fresh download", fixed, err)
	}
	e.assertStored("x/1.tar", data, fixed)
}
