package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// Spooling the tar stream of a layer that waits for its parent.
//
// A compressed layer whose parent chain is not committed when its transfer
// starts cannot be extracted as it arrives: its download decompresses it
// to validate it (and hash its diff ID), and its unpack, once the parent is
// committed, would decompress the file a second time. The pull asks for a
// spool for every layer above the bottom one: while the download validates
// such a layer it writes the decompressed tar stream to
// tmp/<download id>.spool, and the unpack's extraction reads that instead
// of the layer file. Decompressing costs far more than writing and reading
// the plain bytes back through the page cache.
//
// A spool is the process's own, like the in-stream validation it comes
// from (validatedFile): it is used only when this process wrote it whole
// from the layer file that is still in place, and start-up's sweep removes
// every one (only a pull asks for a spool, and Resume runs before any). It lives no longer than the pulls that asked for it: the
// extraction that reads it removes it, and so does the end of the last of
// those pulls, whatever happened. Their sum on disk is bounded
// (Options.SpoolSize): a layer that would go past it, a stream extraction
// that begins to follow the transfer (it will be the unpack's), or a
// write that fails, and the layer is not spooled; the pull goes on as it
// would without spools.

const spoolSuffix = ".spool"

// spool is the spooled tar stream of one download's layer.
type spool struct {
	id   string // the download's idempotency id; the file is tmp/<id>.spool
	refs int    // pulls holding it
	// reserved is what the file holds or may hold, counted against
	// Options.SpoolSize.
	reserved int64
	// writing: the download's validation has the file open.
	writing bool
	// ready: the download validated the layer and kept the spool: blob is
	// the layer file it was written from, both files stamped then.
	ready      bool
	blob       string
	blobStamp  fileID
	spoolStamp fileID
}

// spools are the spools of this process, by download idempotency id; the
// bytes they hold count against the limit.
type spools struct {
	mu    sync.Mutex
	limit int64
	used  int64
	byID  map[string]*spool
}

// SpoolBytes is what the spools of this process hold, or have reserved
// while they are written, in bytes: at most Options.SpoolSize.
func (p *Pipelines) SpoolBytes() int64 {
	p.spools.mu.Lock()
	defer p.spools.mu.Unlock()
	return p.spools.used
}

func (p *Pipelines) spoolPath(dlID string) string {
	return filepath.Join(p.opts.tmpDir(), dlID+spoolSuffix)
}

// wantSpool asks for the spool of download dlID for one pull, and returns
// what the pull calls when it ends: the last pull to end removes the
// spool, used or not.
func (p *Pipelines) wantSpool(ctx context.Context, dlID string) (release func()) {
	if p.spools.limit <= 0 {
		return func() {}
	}
	sp := &p.spools
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.byID == nil {
		sp.byID = map[string]*spool{}
	}
	s := sp.byID[dlID]
	if s == nil {
		s = &spool{id: dlID}
		sp.byID[dlID] = s
	}
	s.refs++
	var once sync.Once
	return func() {
		once.Do(func() {
			sp.mu.Lock()
			defer sp.mu.Unlock()
			if s.refs--; s.refs > 0 {
				return
			}
			delete(sp.byID, dlID)
			if !s.writing {
				p.dropSpoolLocked(ctx, s)
			}
		})
	}
}

// dropSpoolLocked removes s's file and frees its bytes; the caller holds
// spools.mu.
func (p *Pipelines) dropSpoolLocked(ctx context.Context, s *spool) {
	// An extraction that took the spool reads it through its open file.
	path := p.spoolPath(s.id)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithError(err).WithField("file", path).Warn("spool: could not remove the spooled tar stream")
	}
	p.spools.used -= s.reserved
	s.reserved, s.ready = 0, false
}

// spoolWriter writes one download's layer to its spool while the download
// validates it (tarball.TeeTar). It fails, and then drops everything it
// is given, once the spool would pass the limit, a stream extraction
// follows the transfer, or the disk refuses a write.
type spoolWriter struct {
	p      *Pipelines
	s      *spool
	f      *os.File
	grow   *growingFile
	failed error
}

// errSpoolFollowed stops a spool whose layer a stream extraction reads
// as it arrives: that extraction will be the unpack's.
var errSpoolFollowed = errors.New("a stream extraction follows the transfer")

// openSpool starts the spool of download dlID, when a pull asked for one:
// nil otherwise, or when the file cannot be made.
func (p *Pipelines) openSpool(ctx context.Context, dlID string, grow *growingFile) *spoolWriter {
	sp := &p.spools
	sp.mu.Lock()
	defer sp.mu.Unlock()
	s := sp.byID[dlID]
	if s == nil || s.writing {
		return nil
	}
	p.dropSpoolLocked(ctx, s) // what an earlier attempt left
	path := p.spoolPath(s.id)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		log.G(ctx).WithError(err).WithField("file", path).Warn("spool: could not create the spool; the layer will be decompressed again to extract it")
		return nil
	}
	s.writing = true
	return &spoolWriter{p: p, s: s, f: f, grow: grow}
}

// Write implements io.Writer for tarball.TeeTar.
func (w *spoolWriter) Write(b []byte) (int, error) {
	if w.failed != nil {
		return 0, w.failed
	}
	if w.grow.isFollowed() {
		w.failed = errSpoolFollowed
		return 0, w.failed
	}
	sp := &w.p.spools
	sp.mu.Lock()
	over := sp.used+int64(len(b)) > sp.limit
	if !over {
		sp.used += int64(len(b))
		w.s.reserved += int64(len(b))
	}
	sp.mu.Unlock()
	if over {
		w.failed = fmt.Errorf("the spools would hold more than pipeline.spool_size (%d bytes)", sp.limit)
		return 0, w.failed
	}
	if _, err := w.f.Write(b); err != nil {
		w.failed = err
		return 0, err
	}
	return len(b), nil
}

// finish ends the spool's writing: it is kept, for the unpack of the
// layer file blob, when the download validated a compressed layer and
// every byte of its tar stream went in; otherwise it is removed. ok false
// means the download failed or the validation was not its own.
func (w *spoolWriter) finish(ctx context.Context, ok bool, blob string, rep tarball.Report) {
	spoolFI, statErr := w.f.Stat()
	closeErr := w.f.Close()
	keep := ok && w.failed == nil && statErr == nil && closeErr == nil &&
		rep.Compression != tarball.Plain && spoolFI.Size() == rep.ArchiveBytes
	var blobFI os.FileInfo
	if keep {
		var err error
		blobFI, err = os.Stat(blob)
		keep = err == nil
	}
	sp := &w.p.spools
	sp.mu.Lock()
	defer sp.mu.Unlock()
	w.s.writing = false
	if !keep || sp.byID[w.s.id] != w.s {
		// Not spooled, or every pull that asked for it has ended.
		switch {
		case errors.Is(w.failed, errSpoolFollowed):
		case w.failed != nil:
			// The operator's business: pipeline.spool_size or the disk.
			log.G(ctx).WithField("file", w.f.Name()).WithField("reason", w.failed.Error()).Info("spool: layer not spooled; its unpack will decompress it again")
		}
		w.p.dropSpoolLocked(ctx, w.s)
		return
	}
	w.s.ready, w.s.blob = true, blob
	w.s.blobStamp, w.s.spoolStamp = stampOf(blobFI), stampOf(spoolFI)
}

// takeSpool opens the spool of layer file blob, for the extraction that
// reads it instead of the file, and takes it out: it is read once. The
// returned func closes and removes it. nil when no such spool is ready,
// or when either file changed since the download.
func (p *Pipelines) takeSpool(ctx context.Context, blob string) (*os.File, func()) {
	sp := &p.spools
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, s := range sp.byID {
		if !s.ready || s.blob != blob {
			continue
		}
		bfi, err1 := os.Stat(blob)
		path := p.spoolPath(s.id)
		f, err2 := os.Open(path)
		var sfi os.FileInfo
		var err3 error
		if err2 == nil {
			sfi, err3 = f.Stat()
		}
		if err1 != nil || err2 != nil || err3 != nil || stampOf(bfi) != s.blobStamp || stampOf(sfi) != s.spoolStamp {
			if f != nil {
				f.Close()
			}
			log.G(ctx).WithField("file", path).Warn("spool: the layer file or its spool changed since the download; extracting the layer file")
			p.dropSpoolLocked(ctx, s)
			return nil, nil
		}
		// The spool's bytes stay counted until the extraction is done
		// with them.
		s.ready = false
		reserved := s.reserved
		s.reserved = 0
		return f, func() {
			f.Close()
			if err := os.Remove(f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
				log.G(ctx).WithError(err).WithField("file", f.Name()).Warn("spool: could not remove the spooled tar stream")
			}
			sp.mu.Lock()
			sp.used -= reserved
			sp.mu.Unlock()
		}
	}
	return nil, nil
}
