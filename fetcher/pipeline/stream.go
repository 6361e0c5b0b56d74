package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

// Extraction while a layer downloads.
//
// A layer's chain ID names its unpack run, and it is known only once the
// whole layer is hashed (its diff ID), so an extraction that starts before
// the download ends cannot be the unpack run's own. It is the pull's: once
// a layer's parent chain is committed and its download is still under way,
// the pull extracts the bytes the download writes to its temp file, as they
// land, into a private snapshot on the parent chain (a stream extraction).
// The unpack run of the layer's chain, which starts only after the download
// has recorded the layer, adopts that snapshot in extract-layers instead of
// extracting the layer file again: when the extraction read exactly the
// recorded file and decided the rootfs/ layout the validation found. Any
// other outcome (a rejection, a failed download, a different decision) and
// the snapshot is removed and the run extracts from the file, as it always
// could. Nothing of a stream extraction is committed before the unpack
// run's update-db, so a layer refused mid-stream leaves nothing behind.
//
// Stream extractions live in this process only: after a crash none is
// adopted by a new attempt of extract-layers, and start-up's sweep removes
// those no live unpack run has adopted.

// streamPrefix starts the key of a stream extraction's snapshot: after
// extractPrefix, a letter no chain ID's hex has.
const streamPrefix = extractPrefix + "s"

// streamKey is the snapshot key of the stream extraction of download run
// dlID (its idempotency id) on parent chain parent.
func streamKey(dlID, parent string) string {
	sum := sha256.Sum256([]byte(dlID + "\x00" + parent))
	return streamPrefix + hex.EncodeToString(sum[:16])
}

// growingFile is a download's temp file as it is written: the download
// counts what it wrote (Write, called after the file's own write) and
// says when it ended; followers read up to what was written.
type growingFile struct {
	path string
	run  string // the download's fsm run, for the followers' progress events
	mu   sync.Mutex
	cond *sync.Cond
	n    int64
	done bool
	err  error
	// followed: an extraction reads the file as it grows.
	followed bool
}

func newGrowingFile(path, run string) *growingFile {
	g := &growingFile{path: path, run: run}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// Write records that len(b) more bytes are in the file.
func (g *growingFile) Write(b []byte) (int, error) {
	g.mu.Lock()
	g.n += int64(len(b))
	g.mu.Unlock()
	g.cond.Broadcast()
	return len(b), nil
}

// finish records the end of the download attempt: err nil means the file
// is whole.
func (g *growingFile) finish(err error) {
	g.mu.Lock()
	g.done, g.err = true, err
	g.mu.Unlock()
	g.cond.Broadcast()
}

// isFollowed reports whether an extraction reads the file as it grows.
func (g *growingFile) isFollowed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.followed
}

// errDownloadEnded: a follower was asked for after the download ended.
var errDownloadEnded = errors.New("the download already ended")

// follow opens the file for reading from its start while the download is
// under way; the reader blocks at what was written until more is, and
// ends with io.EOF once the download ended whole (with its error
// otherwise). Close releases the file.
func (g *growingFile) follow(ctx context.Context) (*follower, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return nil, errDownloadEnded
	}
	// The file is open for as long as the follower reads: the download's
	// rename to the layer's path keeps the same inode.
	f, err := os.Open(g.path)
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", g.path, err)
	}
	g.followed = true
	r := &follower{ctx: ctx, g: g, f: f}
	r.stop = context.AfterFunc(ctx, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.cond.Broadcast()
	})
	return r, nil
}

// follower reads a growingFile.
type follower struct {
	ctx  context.Context
	g    *growingFile
	f    *os.File
	off  int64
	stop func() bool
}

// Read implements io.Reader over the bytes the download wrote.
func (r *follower) Read(p []byte) (int, error) {
	g := r.g
	g.mu.Lock()
	for g.n == r.off && !g.done && r.ctx.Err() == nil {
		g.cond.Wait()
	}
	avail, done, derr := g.n-r.off, g.done, g.err
	g.mu.Unlock()
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	if avail == 0 {
		if done && derr != nil {
			return 0, fmt.Errorf("the download of %s failed: %w", g.path, derr)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > avail {
		p = p[:avail]
	}
	n, err := r.f.ReadAt(p, r.off)
	r.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Close releases the file.
func (r *follower) Close() error {
	r.stop()
	return r.f.Close()
}

// streamExtraction is one layer extracted while it downloads.
type streamExtraction struct {
	key    string // snapshot key (streamKey)
	dlID   string // idempotency id of the download run it follows
	dlRun  string // the id of the run whose transfer it follows, for progress events; set by follow
	parent string // the parent chain it is prepared on
	url    string // the layer's object
	ctx    context.Context
	cancel context.CancelFunc
	// started is set, under streamsMu, once a download attempt's file is
	// being followed; done is closed once the fields below are set.
	started bool
	// names says the extraction followed the transfer from its start and
	// the download left it to name the layer (diff ID, rootfs/ layout):
	// the layer's bytes are decompressed and parsed once.
	names bool
	done  chan struct{}
	stats tarball.Stats
	read  int64 // bytes of the layer file read, all of it on success
	err   error
}

// startStream asks for the stream extraction of the layer that download
// run dlID (idempotency id) fetches from url, on parent chain parent,
// which must be committed. It starts as soon as the download's transfer
// does in this process (at once if it already has); a download that ended
// first leaves it unstarted, and the unpack run extracts the file. Asked
// for before the download run starts, it is sure to follow the transfer
// from its first byte and name the layer. A stream extraction already
// asked for the same download and parent is shared.
func (p *Pipelines) startStream(ctx context.Context, dlID, parent, url string) *streamExtraction {
	key := streamKey(dlID, parent)
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	if s := p.streams[key]; s != nil {
		return s
	}
	// The extraction belongs to the daemon, not to the caller of Pull: a
	// pull whose client went away leaves its runs going, and this with
	// them until they adopt or drop it.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &streamExtraction{key: key, dlID: dlID, parent: parent, url: url, ctx: sctx, cancel: cancel, done: make(chan struct{})}
	if p.streams == nil {
		p.streams = map[string]*streamExtraction{}
	}
	p.streams[key] = s
	if g := p.growing[dlID]; g != nil {
		p.follow(s, g)
	}
	return s
}

// unpackedElsewhere reports whether layer l looks, by the ETag and size
// its object is listed with, like an object of bucket recorded before
// (under another key, or this one before it changed) whose layer is
// unpacked on chain parent with its device in the pool: an image stored
// beside another with the same base layers. Extracting such a layer while
// it downloads would most likely build a chain that is already there, and
// throw it away. The guess decides only that: the download still hashes
// every byte, and the layer's unpack run finds its chain by the digest;
// should the guess be wrong, the run extracts the layer file, as it does
// for any layer whose transfer ended before its parent chain was committed.
func (p *Pipelines) unpackedElsewhere(ctx context.Context, bucket string, l api.Layer, parent string) (bool, error) {
	if l.ETag == "" {
		return false, nil
	}
	diffIDs, err := RecordsOf(p.db).DiffIDsListedAs(ctx, bucket, l.ETag, l.Size)
	if err != nil {
		return false, err
	}
	for _, d := range diffIDs {
		key, err := p.chainKey(ctx, ChainID(parent, d))
		if err != nil {
			return false, err
		}
		if key == "" {
			continue
		}
		alive, _, err := p.deviceAlive(ctx, key)
		if err != nil || alive {
			return alive, err
		}
	}
	return false, nil
}

// startStreamUnlessUnpacked is startStream for layer l of bucket, unless
// the layer looks unpacked on parent already (unpackedElsewhere): then it
// returns nil, and the download checks the layer in-stream itself.
func (p *Pipelines) startStreamUnlessUnpacked(ctx context.Context, dlID, parent, bucket string, l api.Layer) (*streamExtraction, error) {
	url := S3URL(bucket, l.Key)
	skip, err := p.unpackedElsewhere(ctx, bucket, l, parent)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", url, err)
	}
	if skip {
		log.G(ctx).WithField("key", url).WithField("etag", l.ETag).
			Info("pull: the layer is listed with the ETag and size of one unpacked already; not extracting it while it downloads")
		return nil, nil
	}
	return p.startStream(ctx, dlID, parent, url), nil
}

// downloading registers the temp file of download run dlID's transfer,
// before its first byte, and starts the stream extractions asked for it;
// the returned function unregisters it (the transfer ended). named says
// one of them will name the layer (streamNames), so the download need not
// validate it in-stream itself.
func (p *Pipelines) downloading(dlID string, g *growingFile) (ended func(), named bool) {
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	if p.growing == nil {
		p.growing = map[string]*growingFile{}
	}
	p.growing[dlID] = g
	for _, s := range p.streams {
		if s.dlID != dlID || s.started {
			continue
		}
		// One of them names the layer; set before it starts reading.
		s.names = !named
		if p.follow(s, g) {
			named = named || s.names
		} else {
			s.names = false
		}
	}
	return func() {
		p.streamsMu.Lock()
		defer p.streamsMu.Unlock()
		if p.growing[dlID] == g {
			delete(p.growing, dlID)
		}
		for _, c := range p.transferWaiters[dlID] {
			close(c)
		}
		delete(p.transferWaiters, dlID)
	}, named
}

// transferEnded returns a channel closed when a transfer of download dlID
// (its idempotency id) ends in this process, with its bytes all written or
// failed, and a func that stops the wait. A transfer ends before its
// download run does when an extraction follows it: the run's validation
// waits for the extraction, which is slower than the link.
func (p *Pipelines) transferEnded(dlID string) (<-chan struct{}, func()) {
	c := make(chan struct{})
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	if p.transferWaiters == nil {
		p.transferWaiters = map[string][]chan struct{}{}
	}
	p.transferWaiters[dlID] = append(p.transferWaiters[dlID], c)
	return c, func() {
		p.streamsMu.Lock()
		defer p.streamsMu.Unlock()
		cs := p.transferWaiters[dlID]
		for i, w := range cs {
			if w == c {
				cs = append(cs[:i], cs[i+1:]...)
				break
			}
		}
		if len(cs) == 0 {
			delete(p.transferWaiters, dlID)
		} else {
			p.transferWaiters[dlID] = cs
		}
	}
}

// follow starts s on g's file and reports whether it did; the caller
// holds streamsMu.
func (p *Pipelines) follow(s *streamExtraction, g *growingFile) bool {
	rd, err := g.follow(s.ctx)
	if err != nil {
		return false // the transfer already ended: nothing to follow
	}
	s.started, s.dlRun = true, g.run
	go p.runStream(s.ctx, s, rd)
	return true
}

// streamNames waits for the stream extraction download run dlID left to
// name its layer, if any, and returns what it found of the file of size
// bytes when it extracted it whole; ok false means the layer file must be
// validated by reading it (no such extraction, or it stopped: a rejection,
// a failure of its own, or a rootfs/ layout it guessed wrong).
func (p *Pipelines) streamNames(ctx context.Context, dlID string, size int64) (rep tarball.Report, ok bool, err error) {
	p.streamsMu.Lock()
	var s *streamExtraction
	for _, c := range p.streams {
		if c.dlID == dlID && c.names {
			s = c
		}
	}
	p.streamsMu.Unlock()
	if s == nil {
		return rep, false, nil
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		return rep, false, ctx.Err()
	}
	if s.err != nil || s.read != size || s.stats.DiffID == "" && s.stats.Compression != tarball.Plain {
		return rep, false, nil
	}
	return tarball.Report{Entries: s.stats.Entries, DiffID: s.stats.DiffID, HasRootfs: s.stats.StrippedRootfs}, true, nil
}

// runStream extracts rd into s's snapshot on its parent chain; on failure
// the snapshot is removed.
func (p *Pipelines) runStream(ctx context.Context, s *streamExtraction, rd *follower) {
	defer close(s.done)
	defer rd.Close()
	lg := log.G(ctx).WithField("key", s.url).WithField("snapshot", s.key)
	st, err := p.extractStream(ctx, s, rd)
	s.stats, s.read = st, rd.off
	if err != nil {
		s.err = err
		lg.WithError(err).Info("unpack: extraction while downloading stopped; the unpack will extract the layer file")
		if derr := p.discardKey(ctx, s.key); derr != nil {
			lg.WithError(derr).Warn("unpack: removing the snapshot of a stopped extraction")
		}
		return
	}
	lg.WithField("bytes", st.Bytes).WithField("files", st.Files).Debug("unpack: extracted while downloading")
}

func (p *Pipelines) extractStream(ctx context.Context, s *streamExtraction, rd io.Reader) (_ tarball.Stats, err error) {
	parent, err := p.parentKey(ctx, s.parent)
	if err != nil {
		return tarball.Stats{}, err
	}
	if _, err := p.opts.Snapshots.Prepare(ctx, s.key, parent,
		snapshots.WithLabels(map[string]string{LabelPrivate: privateExtract, LabelSource: s.url})); err != nil {
		return tarball.Stats{}, fmt.Errorf("prepare %s on %q: %w", s.key, parent, err)
	}
	budget, err := p.extractBudget(ctx, 0)
	if err != nil {
		return tarball.Stats{}, err
	}
	ms, err := p.opts.Snapshots.Mounts(ctx, s.key)
	if err != nil {
		return tarball.Stats{}, fmt.Errorf("mounts of %s: %w", s.key, err)
	}
	dir := p.mountDirOf(s.key)
	umount, err := p.mountAt(ms, dir)
	if err != nil {
		return tarball.Stats{}, err
	}
	defer func() {
		if uerr := umount(); uerr != nil && err == nil {
			err = fmt.Errorf("unmount %s: %w", dir, uerr)
		}
	}()
	p.hook("stream-extract:started")
	th := throttle{every: progressInterval}
	st, err := tarball.ExtractDir(ctx, rd, dir, tarball.ExtractOptions{
		Limits: p.opts.Limits, DetectRootfs: true, HashStream: s.names, NoChown: p.opts.NoChown, MaxDataBytes: budget,
		GzipCommand: p.opts.GzipCommand,
		Progress: func(pr tarball.Progress) {
			if th.ok(false) {
				p.hub.emit(api.Event{Run: s.dlRun, FSM: api.FSMUnpack, State: "extract-layers", Bytes: pr.Bytes, Files: pr.Files})
			}
		},
	})
	if err != nil {
		return st, err
	}
	return st, tarball.SyncFS(dir)
}

// adoptStream returns the stream extraction of download run dlID on
// parent for the unpack run of the layer dl describes, once it has ended,
// if it extracted exactly dl's file with the rootfs/ layout dl's
// validation found; it is then the caller's. Otherwise it returns nil, and
// removes a stream extraction that cannot be used.
func (p *Pipelines) adoptStream(ctx context.Context, dlID, parent string, dl *DownloadResponse) (*streamExtraction, error) {
	key := streamKey(dlID, parent)
	p.streamsMu.Lock()
	s := p.streams[key]
	if s != nil && !s.started {
		// The download's transfer ended before the extraction could
		// follow it.
		delete(p.streams, key)
		s = nil
	}
	p.streamsMu.Unlock()
	if s == nil {
		return nil, nil
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.streamsMu.Lock()
	mine := p.streams[key] == s
	if mine {
		delete(p.streams, key)
	}
	p.streamsMu.Unlock()
	if !mine {
		return nil, nil // dropped by the pull that started it
	}
	if s.err == nil && s.read == dl.SizeBytes && s.stats.StrippedRootfs == dl.HasRootfs {
		return s, nil
	}
	if s.err == nil {
		log.G(ctx).WithField("snapshot", key).WithField("read", s.read).WithField("size", dl.SizeBytes).
			WithField("stripped_rootfs", s.stats.StrippedRootfs).Info("unpack: the extraction while downloading does not match the layer file; extracting the file")
		if err := p.discardKey(ctx, key); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// dropStream ends and removes s unless an unpack run adopted it: what a
// pull does with the stream extractions it started when it ends.
func (p *Pipelines) dropStream(ctx context.Context, s *streamExtraction) {
	p.streamsMu.Lock()
	mine := p.streams[s.key] == s
	if mine {
		delete(p.streams, s.key)
	}
	started := s.started
	p.streamsMu.Unlock()
	s.cancel()
	if !mine || !started {
		return
	}
	<-s.done
	if s.err == nil {
		if err := p.discardKey(ctx, s.key); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("snapshot", s.key).Warn("pull: removing an extraction no unpack adopted")
		}
	}
}
