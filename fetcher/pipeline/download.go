package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/durable"
)

// DownloadRequest is the request of one "download-image" run: one S3 object
// as it was listed.
type DownloadRequest struct {
	Bucket string
	S3Key  string // the object key
	Size   int64  // as listed; the download must match it
	ETag   string // as listed; resumed reads must match it
}

// DownloadResponse is what the run produced: the layer the object's bytes
// are, and what Unpack needs of its file.
type DownloadResponse struct {
	S3URL     string `json:"s3_url"`
	LocalPath string `json:"local_path"`
	Checksum  string `json:"checksum"` // "sha256:<hex>" of the object's bytes: the layer file's digest
	// DiffID is "sha256:<hex>" of the layer's uncompressed tar, set by
	// validate for a compressed layer: what names its chains. A plain
	// layer's is its digest, Checksum (hashed once, see diffID).
	DiffID       string `json:"diff_id,omitempty"`
	SizeBytes    int64  `json:"size_bytes"`
	HasRootfs    bool   `json:"has_rootfs"`
	Entries      int    `json:"entries"`
	Downloaded   bool   `json:"downloaded"`    // bytes came from S3 in this run
	AlreadyExist bool   `json:"already_exist"` // skipped by check-exists
	Resumes      int    `json:"resumes"`       // Range resumes of the successful attempt
}

// diffID is the layer's diff ID: DiffID, or, for a plain layer, the
// file's digest.
func (r *DownloadResponse) diffID() string {
	if r.DiffID != "" {
		return r.DiffID
	}
	return r.Checksum
}

// S3URL is the canonical name of an object: s3://bucket/key.
func S3URL(bucket, key string) string { return "s3://" + bucket + "/" + key }

// objectRunID is the idempotency id of the download of an object as
// listed: concurrent pulls of the same object share one run, and a
// different listing (the object was overwritten) gets its own.
func objectRunID(r *DownloadRequest) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00%s\x00%d", r.Bucket, r.S3Key, r.ETag, r.Size)))
	return "obj-" + hex.EncodeToString(sum[:12])
}

func (p *Pipelines) buildDownload(ctx context.Context) (fsm.StartFunc[DownloadRequest], error) {
	start, _, err := fsm.Register[DownloadRequest, DownloadResponse](p.m, api.FSMDownload).
		Start("check-exists", p.checkExists, p.retry(fsm.ExponentialBackoff(3))).
		To("download", p.download, fsm.WithTimeout(p.opts.DownloadTimeout), p.retry(fsm.ExponentialJitter(5))).
		To("validate", p.validate, p.retry(fsm.FixedRetry(2, fixedDelay))).
		To("store-metadata", p.storeMetadata, p.retry(fsm.ExponentialJitter(5))).
		End("complete").
		OnFail(p.cleanupDownload).
		Build(ctx)
	return start, err
}

type dlReq = fsm.Request[DownloadRequest, DownloadResponse]
type dlResp = fsm.Response[DownloadResponse]

// checkExists: an object recorded with the listed ETag and size, whose
// layer file still has its size and SHA-256, hands off. Nothing else is
// trusted to stand for the object's bytes: an ETag is whatever the server
// says, and proves nothing across keys or buckets; identical content under
// another key is found by its digest once downloaded.
func (p *Pipelines) checkExists(ctx context.Context, req *dlReq) (*dlResp, error) {
	p.hook("check-exists:started")
	r := req.Msg
	url := S3URL(r.Bucket, r.S3Key)
	if err := s3source.ValidateKey(r.S3Key); err != nil {
		return nil, fsm.Abort(fmt.Errorf("download %s: %w", url, err))
	}
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMDownload, State: "check-exists", Total: r.Size})
	obj, err := RecordsOf(p.db).ObjectRecord(ctx, r.Bucket, r.S3Key)
	if err != nil {
		return nil, err
	}
	if obj != nil && r.ETag != "" && obj.ETag == r.ETag && obj.SizeBytes == r.Size {
		f, err := RecordsOf(p.db).LayerFile(ctx, obj.Digest)
		if err != nil {
			return nil, err
		}
		if f != nil {
			ok, err := p.verifyLayerFile(ctx, f)
			if err != nil {
				return nil, err
			}
			if ok {
				resp := layerResponse(url, f)
				resp.AlreadyExist = true
				return nil, fsm.Handoff(resp)
			}
		}
		log.G(ctx).WithField("key", url).Warn("download: the recorded layer file is missing or changed; downloading again")
	}
	return fsm.NewResponse(&DownloadResponse{S3URL: url}), nil
}

func layerResponse(url string, f *LayerFile) *DownloadResponse {
	return &DownloadResponse{S3URL: url, LocalPath: f.Path, Checksum: f.Digest, DiffID: f.DiffID,
		SizeBytes: f.SizeBytes, HasRootfs: f.HasRootfs, Entries: int(f.Entries)}
}

// fileStamp is the identity of a file's content as far as stat tells.
func fileStamp(fi os.FileInfo) (size, mtimeNs int64, ino uint64) {
	size, mtimeNs = fi.Size(), fi.ModTime().UnixNano()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return
}

// verifyLayerFile reports whether b's file exists with b's size and
// SHA-256 (verifyOpenLayerFile).
func (p *Pipelines) verifyLayerFile(ctx context.Context, b *LayerFile) (bool, error) {
	f, err := os.Open(b.Path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("verify blob %s: %w", b.Path, err)
	}
	defer f.Close()
	return p.verifyOpenLayerFile(ctx, f, b)
}

// verifyOpenLayerFile reports whether the open file f has b's size and
// SHA-256. A file whose size, mtime and inode are those recorded when it was
// last hashed is trusted without reading it; otherwise it is hashed again
// (and the stamp refreshed if it matches). f's offset is left anywhere.
func (p *Pipelines) verifyOpenLayerFile(ctx context.Context, f *os.File, b *LayerFile) (bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("verify layer file %s: %w", b.Path, err)
	}
	size, mtime, ino := fileStamp(fi)
	if size != b.SizeBytes {
		return false, nil
	}
	if size == b.StatSize && mtime == b.StatMtimeNs && ino == b.StatIno {
		return true, nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, ctxReader{ctx, f}); err != nil {
		return false, fmt.Errorf("verify layer file %s: %w", b.Path, err)
	}
	if digestOf(h) != b.Digest {
		return false, nil
	}
	return true, RecordsOf(p.db).updateLayerStat(ctx, b.Digest, size, mtime, ino)
}

func digestOf(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

// tmpPath is the one temp file of download run runID: deterministic, so a
// resumed download finds and removes what a crash left, and start-up
// removes those of runs that are no longer live.
func (p *Pipelines) tmpPath(runID string) string {
	return filepath.Join(p.opts.tmpDir(), runID+".partial")
}

// blobPath is where content with digest lives.
func (p *Pipelines) blobPath(digest string) string {
	return filepath.Join(p.opts.blobDir(), strings.TrimPrefix(digest, "sha256:"))
}

// download: stream the object into a temp file with a
// single-pass SHA-256, the size cap and Range resumes, fsync it and rename
// it to its content address. The temp file never survives a failed
// attempt, and a resumed attempt removes one a crash left.
func (p *Pipelines) download(ctx context.Context, req *dlReq) (_ *dlResp, err error) {
	r := req.Msg
	url := S3URL(r.Bucket, r.S3Key)
	if r.Size > p.opts.MaxLayerSize {
		return nil, fsm.Abort(fmt.Errorf("download %s: object is %d bytes, more than the %d-byte limit", url, r.Size, p.opts.MaxLayerSize))
	}
	src, err := p.opts.Sources(ctx, r.Bucket)
	if err != nil {
		return nil, fsm.Abort(fmt.Errorf("download %s: %w", url, err))
	}
	tmp := p.tmpPath(req.Run.IdempotencyID)
	if err := os.Remove(tmp); err == nil {
		log.G(ctx).WithField("file", tmp).Info("download: removed the temp file of an interrupted attempt")
	}
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, diskErr(fmt.Errorf("download %s: create %s: %w", url, tmp, err))
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			os.Remove(tmp)
		}
	}()
	p.hook("download:started")
	// An extraction on the layer's parent chain may follow the file as it
	// is written (stream.go).
	grow := newGrowingFile(tmp, req.Run.ID)
	ended, named := p.downloading(req.Run.IdempotencyID, grow)
	defer func() {
		ended()
		grow.finish(err)
	}()
	rd := src.NewReader(ctx, s3source.Object{Key: r.S3Key, Size: r.Size, ETag: r.ETag}, maxResumes)
	defer rd.Close()
	h := sha256.New()
	pw := &progressWriter{p: p, run: req.Run.ID, fsm: api.FSMDownload, state: "download", total: r.Size, th: throttle{every: progressInterval}}
	// The tarball policy checks the bytes as they arrive (one read of the
	// object, not two); the validate transition trusts that check only for
	// the file this process wrote (see validatedFile). When an extraction
	// follows the transfer from its start, it names the layer instead
	// (streamNames): the bytes are decompressed and parsed once.
	writers := []io.Writer{h}
	vdone := make(chan streamValidation, 1)
	var vw *io.PipeWriter
	var sv streamValidation
	final := ""
	if named {
		vdone <- streamValidation{}
	} else {
		var vr *io.PipeReader
		vr, vw = io.Pipe()
		writers = append(writers, vw)
		vopts := []tarball.ValidateOption{tarball.CallerHashesPlain(), tarball.InflateWith(p.opts.GzipCommand)}
		// A layer that waits for its parent keeps its tar stream for its
		// unpack (spool.go), which then need not decompress it again.
		if sw := p.openSpool(ctx, req.Run.IdempotencyID, grow); sw != nil {
			vopts = append(vopts, tarball.TeeTar(sw))
			p.hook("download:spooling")
			// Every return below comes after the validation ended.
			defer func() { sw.finish(ctx, err == nil && sv.done && sv.err == nil, final, sv.report) }()
		}
		p.hook("download:validating")
		go func() {
			rep, verr := tarball.Validate(ctx, vr, p.opts.Limits, vopts...)
			// Validate read the stream to its end (the padding after the
			// end-of-archive marker is bounded there) or refused it:
			// nothing more is read, and a rejection stops the download.
			vr.CloseWithError(verr)
			vdone <- streamValidation{report: rep, err: verr, done: true}
		}()
	}
	n, err := copyFanOut(io.LimitReader(rd, p.opts.MaxLayerSize+1), append([]io.Writer{io.MultiWriter(f, grow, pw)}, writers...)...)
	if vw != nil {
		vw.CloseWithError(err)
	}
	sv = <-vdone
	// A rejection counts when the bytes were all there or the validator
	// itself stopped the copy; a transfer that failed on its own is retried.
	if sv.err != nil && tarball.IsRejection(sv.err) && n <= p.opts.MaxLayerSize && (err == nil || err == sv.err) {
		// Close and remove the partial file first: nothing of it stays.
		f.Close()
		f = nil
		os.Remove(tmp)
		rejected := fmt.Errorf("validate %s: %w", url, sv.err)
		log.G(ctx).WithField("key", url).WithField("reason", rejected.Error()).Warn("security: tarball rejected")
		return nil, fsm.Abort(rejected)
	}
	if err != nil {
		return nil, s3Err(fmt.Errorf("download %s: %w", url, err))
	}
	if n > p.opts.MaxLayerSize {
		return nil, fsm.Abort(fmt.Errorf("download %s: more than the %d-byte limit", url, p.opts.MaxLayerSize))
	}
	if n != r.Size {
		return nil, fmt.Errorf("download %s: got %d bytes, listed as %d", url, n, r.Size)
	}
	if err := f.Sync(); err != nil {
		return nil, diskErr(fmt.Errorf("download %s: fsync %s: %w", url, tmp, err))
	}
	if err := f.Close(); err != nil {
		return nil, diskErr(fmt.Errorf("download %s: close %s: %w", url, tmp, err))
	}
	f = nil
	digest := digestOf(h)
	final = p.blobPath(digest)
	if err := os.Rename(tmp, final); err != nil {
		return nil, diskErr(fmt.Errorf("download %s: rename to %s: %w", url, final, err))
	}
	if err := durable.SyncDir(filepath.Dir(final)); err != nil {
		return nil, err
	}
	pw.flush()
	if sv.done && sv.err == nil {
		if fi, err := os.Stat(final); err == nil {
			p.validated.Store(final, validatedFile{stamp: stampOf(fi), digest: digest, report: sv.report})
		}
	}
	log.G(ctx).WithField("key", url).WithField("bytes", n).WithField("digest", digest).WithField("resumes", rd.Resumes()).Info("downloaded")
	return fsm.NewResponse(&DownloadResponse{S3URL: url, LocalPath: final, Checksum: digest,
		SizeBytes: n, Downloaded: true, Resumes: rd.Resumes()}), nil
}

// streamValidation is what the tarball policy said of a download's bytes
// (done false: the download did not check them).
type streamValidation struct {
	report tarball.Report
	err    error
	done   bool
}

// fileID is a file's size, mtime and inode: what says it was not
// rewritten since.
type fileID struct {
	size, mtimeNs int64
	ino           uint64
}

func stampOf(fi os.FileInfo) fileID {
	size, mtime, ino := fileStamp(fi)
	return fileID{size, mtime, ino}
}

// validatedFile records, in this process only, a blob whose bytes passed
// the tarball policy while they were downloaded. After a crash nothing is
// recorded, so the validate transition reads the file again (a crash after
// download and before validate re-validates).
type validatedFile struct {
	stamp  fileID
	digest string
	report tarball.Report
}

// s3Err turns what S3 said into the machines' error kinds: access denied,
// no such key, invalid requests and an object changed since it was listed
// abort; the rest retries.
func s3Err(err error) error {
	switch s3source.Classify(err) {
	case s3source.KindAccessDenied, s3source.KindNotFound, s3source.KindInvalid,
		// The object is no longer the one listed: another attempt with the
		// same listing cannot succeed (Pull lists it again).
		s3source.KindChanged:
		return fsm.Abort(err)
	}
	return diskErr(err)
}

// diskErr aborts on a full disk (resource exhaustion) and leaves other
// errors retryable.
func diskErr(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fsm.Abort(err)
	}
	return err
}

// validate: the file exists, hashes to the recorded digest and passes the
// tarball policy; a rejection or a digest mismatch removes the file and
// aborts with the reason (the pull records it on the image).
func (p *Pipelines) validate(ctx context.Context, req *dlReq) (*dlResp, error) {
	resp := req.Resp
	p.hub.emit(api.Event{Run: req.Run.ID, FSM: api.FSMDownload, State: "validate", Bytes: resp.SizeBytes, Total: resp.SizeBytes})
	p.hook("validate:started")
	if rep, ok, err := p.streamNames(ctx, req.Run.IdempotencyID, resp.SizeBytes); err != nil {
		return nil, err
	} else if ok {
		resp.setReport(rep)
		return fsm.NewResponse(resp), nil
	}
	if v, ok := p.validated.LoadAndDelete(resp.LocalPath); ok {
		vf := v.(validatedFile)
		if fi, err := os.Stat(resp.LocalPath); err == nil && stampOf(fi) == vf.stamp && vf.digest == resp.Checksum {
			resp.setReport(vf.report)
			return fsm.NewResponse(resp), nil
		}
		log.G(ctx).WithField("file", resp.LocalPath).Warn("validate: the file changed since it was downloaded; reading it again")
	}
	p.hook("validate:reading")
	f, err := os.Open(resp.LocalPath)
	if err != nil {
		return nil, fmt.Errorf("validate %s: %w", resp.LocalPath, err)
	}
	defer f.Close()
	h := sha256.New()
	tee := io.TeeReader(f, h)
	rep, verr := tarball.Validate(ctx, tee, p.opts.Limits, tarball.CallerHashesPlain(), tarball.InflateWith(p.opts.GzipCommand))
	if verr != nil && !tarball.IsRejection(verr) {
		return nil, fmt.Errorf("validate %s: %w", resp.LocalPath, verr)
	}
	if verr == nil {
		if _, err := io.Copy(h, f); err != nil {
			return nil, fmt.Errorf("validate %s: %w", resp.LocalPath, err)
		}
		if got := digestOf(h); got != resp.Checksum {
			verr = fmt.Errorf("file %s hashes to %s, downloaded as %s", resp.LocalPath, got, resp.Checksum)
		}
	}
	if verr != nil {
		rejected := fmt.Errorf("validate %s: %w", resp.S3URL, verr)
		if err := p.rejectLayer(ctx, resp); err != nil {
			return nil, err
		}
		log.G(ctx).WithField("key", resp.S3URL).WithField("reason", rejected.Error()).Warn("security: tarball rejected")
		return nil, fsm.Abort(rejected)
	}
	resp.setReport(rep)
	return fsm.NewResponse(resp), nil
}

// setReport keeps what validation found of the layer.
func (r *DownloadResponse) setReport(rep tarball.Report) {
	r.HasRootfs, r.Entries = rep.HasRootfs, rep.Entries
	r.DiffID = rep.DiffID
}

// rejectLayer forgets a rejected layer file's content (its layer row and
// the objects recorded as it). The file itself stays for the run's
// cleanup (cleanupDownload), which runs once the rejection is recorded as
// the run's verdict: a kill before that resumes the validate step, which
// must find the file to reach the rejection, and its reason, again.
func (p *Pipelines) rejectLayer(ctx context.Context, resp *DownloadResponse) error {
	if err := RecordsOf(p.db).forgetLayer(ctx, resp.Checksum); err != nil {
		return err
	}
	p.hook("validate:rejecting")
	return nil
}

// storeMetadata: the layer file and the object it came from, one
// transaction.
func (p *Pipelines) storeMetadata(ctx context.Context, req *dlReq) (*dlResp, error) {
	p.hook("store-metadata:started")
	r, resp := req.Msg, req.Resp
	fi, err := os.Stat(resp.LocalPath)
	if err != nil {
		return nil, fmt.Errorf("store metadata of %s: %w", resp.S3URL, err)
	}
	size, mtime, ino := fileStamp(fi)
	if err := RecordsOf(p.db).StoreDownload(ctx, Object{Bucket: r.Bucket, Key: r.S3Key, ETag: r.ETag, SizeBytes: r.Size, Digest: resp.Checksum},
		LayerFile{Digest: resp.Checksum, DiffID: resp.diffID(), Path: resp.LocalPath, SizeBytes: resp.SizeBytes, HasRootfs: resp.HasRootfs,
			Entries: int64(resp.Entries), StatSize: size, StatMtimeNs: mtime, StatIno: ino}); err != nil {
		return nil, err
	}
	return fsm.NewResponse(resp), nil
}

// cleanupDownload removes what a download run that did not complete may
// have left: its temp file, and a layer file the validate step ended the
// run on (rejected, or unreadable) when no layer row names its content
// (rejectLayer forgot the rows of a rejected one). Any other layer file
// it renamed into place stays: another live download of the same content
// may have renamed onto the same path and not yet recorded it. Pruning
// (and the start-up sweep) removes it when no run is live and no layer
// row names it.
func (p *Pipelines) cleanupDownload(ctx context.Context, req *dlReq) error {
	url := S3URL(req.Msg.Bucket, req.Msg.S3Key)
	if err := os.Remove(p.tmpPath(req.Run.IdempotencyID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("download %s: remove temp file: %w", url, err)
	}
	if req.Run.Transition != "validate" || req.Resp == nil || req.Resp.LocalPath == "" || req.Resp.Checksum == "" {
		return nil
	}
	f, err := RecordsOf(p.db).LayerFile(ctx, req.Resp.Checksum)
	if err != nil {
		return fmt.Errorf("download %s: layer row of %s: %w", url, req.Resp.Checksum, err)
	}
	if f != nil {
		return nil
	}
	if err := os.Remove(req.Resp.LocalPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("download %s: remove rejected %s: %w", url, req.Resp.LocalPath, err)
	}
	return nil
}

// progressWriter turns written bytes into throttled progress events.
type progressWriter struct {
	p        *Pipelines
	run, fsm string
	state    string
	total, n int64
	th       throttle
}

func (w *progressWriter) Write(b []byte) (int, error) {
	w.n += int64(len(b))
	if w.th.ok(false) {
		w.p.hub.emit(api.Event{Run: w.run, FSM: w.fsm, State: w.state, Bytes: w.n, Total: w.total})
	}
	return len(b), nil
}

func (w *progressWriter) flush() {
	w.p.hub.emit(api.Event{Run: w.run, FSM: w.fsm, State: w.state, Bytes: w.n, Total: w.total})
}

// fanOutChunk is the size of copyFanOut's buffers.
const fanOutChunk = 1 << 20

// copyFanOut copies src to every writer as io.Copy(io.MultiWriter(...))
// would, but concurrently: each writer takes each chunk in its own
// goroutine while the next chunk is being read (two buffers in turn), so
// receiving, writing the file, hashing and validating overlap instead of
// taking turns. The writers see the same bytes in the same order. It
// returns the bytes read and the first error: src's, or else the first
// writer's in argument order (a writer's own error value, unwrapped).
func copyFanOut(src io.Reader, writers ...io.Writer) (int64, error) {
	type job struct {
		buf  []byte
		errs []error
		done chan struct{}
	}
	ins := make([]chan *job, len(writers))
	for i, w := range writers {
		ins[i] = make(chan *job)
		go func() {
			var sticky error
			for j := range ins[i] {
				if sticky == nil {
					if n, err := w.Write(j.buf); err != nil {
						sticky = err
					} else if n < len(j.buf) {
						sticky = io.ErrShortWrite
					}
				}
				j.errs[i] = sticky
				j.done <- struct{}{}
			}
		}()
	}
	defer func() {
		for _, in := range ins {
			close(in)
		}
	}()
	wait := func(j *job) error {
		for range writers {
			<-j.done
		}
		for _, err := range j.errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	jobs := [2]*job{}
	for i := range jobs {
		jobs[i] = &job{buf: make([]byte, fanOutChunk), errs: make([]error, len(writers)), done: make(chan struct{}, len(writers))}
	}
	var (
		total   int64
		pending *job
	)
	for turn := 0; ; turn++ {
		j := jobs[turn%2]
		n, rerr := fill(src, j.buf)
		if n > 0 {
			if pending != nil {
				if err := wait(pending); err != nil {
					return total, err
				}
			}
			pending = &job{buf: j.buf[:n], errs: j.errs, done: j.done}
			for _, in := range ins {
				in <- pending
			}
			total += int64(n)
		}
		if rerr != nil {
			if pending != nil {
				if err := wait(pending); err != nil {
					return total, err
				}
			}
			if rerr == io.EOF {
				return total, nil
			}
			return total, rerr
		}
	}
}

// fill reads src into buf until buf is full or src fails; io.EOF (only)
// ends the source, returned as is.
func fill(src io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := src.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
