package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/fsm"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/keyed"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// Names of the queues the state machines run in (their names are api.FSM*).
const (
	QueueDownloads = "downloads"
	QueueUnpacking = "unpacking"
)

// Defaults of Options.
const (
	DefaultDownloadTimeout = 5 * time.Minute
	DefaultExtractTimeout  = 30 * time.Minute
	DefaultMaxLayerSize    = 10 << 30
	DefaultDownloads       = 5
	DefaultUnpacking       = 2
	// DefaultSpoolSize is Options.SpoolSize's default: the tar streams of
	// a few large layers.
	DefaultSpoolSize = 2 << 30
	// maxResumes bounds the Range resumes of one download attempt (of
	// each connection of a ranged one), but for those after a body that
	// brought s3source.ResumeProgress bytes.
	maxResumes = 5
	// fixedDelay is the wait of the "fixed retry" transitions.
	fixedDelay = time.Second
	// progressInterval spaces the progress events of one transition.
	progressInterval = 200 * time.Millisecond
)

// Snapshots is what the Unpack and Activate machines need of the
// snapshotter (package snapshotter's *Snapshotter): containerd's snapshot
// API plus the device behind a key. Its calls ignore containerd
// namespaces.
type Snapshots interface {
	snapshots.Snapshotter
	snapshots.Cleaner
	// DeviceOf returns the dm name, path and thin id of snapshot key.
	DeviceOf(ctx context.Context, key string) (name, path string, id uint32, err error)
	// Exists reports whether snapshot key exists.
	Exists(ctx context.Context, key string) (bool, error)
	// RemoveIf is Remove with guard consulted in the transaction that
	// removes the record (a non-nil error refuses the removal).
	RemoveIf(ctx context.Context, key string, guard snapshotter.RemoveGuard) error
	// Recommit puts the device of active snapshot key in place of the lost
	// device of committed snapshot name (same parent), removing key: the
	// snapshots on name keep their own devices and are not touched.
	Recommit(ctx context.Context, name, key string) error
}

// SourceFunc returns the S3 source of bucket.
type SourceFunc func(ctx context.Context, bucket string) (*s3source.Source, error)

// Options configure New. DB, Sources and DownloadDir are required; the
// Unpack and Activate machines also need Snapshots and ThinExists.
type Options struct {
	DB          *metadata.DB
	Sources     SourceFunc
	DownloadDir string // blobs/ and tmp/ live here

	Snapshots Snapshots
	// ThinExists probes the pool for a thin id (thinpool.Pool.ThinExists):
	// how check-unpacked and check-snapshot see a device deleted behind
	// the database's back.
	ThinExists func(ctx context.Context, id uint32) (bool, error)
	// MountDir holds the temporary mounts of extraction (default
	// <DownloadDir>/mnt).
	MountDir string

	MaxLayerSize    int64         // default 10 GiB
	DownloadTimeout time.Duration // default 5 min
	ExtractTimeout  time.Duration // default 30 min
	Limits          tarball.Limits
	// GzipCommand is the program gzip layers are inflated with
	// (tarball.ExtractOptions.GzipCommand); "" is the built-in inflater.
	GzipCommand string
	Downloads   int // queue limit, default 5
	Unpacking   int // queue limit, default 2
	// MaxImageSize bounds the sum of an image's layer objects, checked
	// when the pull lists them; 0 means no bound beyond MaxLayerSize.
	MaxImageSize int64
	// RequiredDirs are the top-level directories the top of every image
	// must have; nil means tarball.RequiredDirs, an empty list none.
	RequiredDirs []string

	// Registrar, when set, registers activated images in containerd.
	Registrar Registrar
	// OnRetry, when set, is told of every transition attempt that failed
	// and will be retried (for a counter); it must not block.
	OnRetry func(fsm, transition string)
	// RetryInitial, when positive, replaces the first retry delay of every
	// transition (the cap becomes 8 times it); tests use it to stay fast.
	RetryInitial time.Duration
	// NoChown extracts files owned by the extracting user (tests).
	NoChown bool
	// PoolFree, when set, returns the pool's free data space a layer may
	// take (the daemon's leaves out the pool's reserve): a layer's
	// extraction may write at most that much (and MaxLayerSize).
	PoolFree func(ctx context.Context) (int64, error)
	// SpoolSize bounds the bytes of decompressed tar streams kept in the
	// temp directory for the layers that wait for their parent (spool.go);
	// 0 means DefaultSpoolSize, a negative value keeps none.
	SpoolSize int64
}

// Pipelines runs the three state machines of one daemon.
type Pipelines struct {
	opts Options
	db   *metadata.DB
	m    *fsm.Manager

	startDownload fsm.StartFunc[DownloadRequest]
	startUnpack   fsm.StartFunc[UnpackRequest]
	startActivate fsm.StartFunc[ActivateRequest]

	hub hub
	// building counts the chains the pulls under way build on (Guard).
	building chainHolds
	// runHolds counts the idempotency ids of the runs, other than the
	// unpack runs of the chains in building, that the pulls and activates
	// under way still read once they have ended: their layers' downloads
	// (named as the predecessors of unpack runs) and their images'
	// activate runs. Retention keeps them (Retain).
	runHolds chainHolds
	// objectHolds counts the s3:// URLs of the objects the pulls under way
	// download or find downloaded, from before their download runs start
	// or are joined until the pulls end: Prune keeps their records and
	// layer files, which the pulls' unpack runs read once the downloads
	// have ended.
	objectHolds chainHolds
	// objectGate is read-locked by a pull while it takes its objectHolds,
	// and write-locked by LayerFilesInUse until its caller is done with
	// the files: a pull that finds a file must have been seen holding it.
	objectGate sync.RWMutex
	// validated holds the blobs this process validated while downloading
	// them (local path → validatedFile).
	validated sync.Map
	// spools are the decompressed tar streams of the layers that wait for
	// their parent (spool.go).
	spools spools
	// deviceLive says whether an activation's device node is a live
	// device-mapper device, with file-system calls only (repull);
	// mappedDeviceLive unless a test replaces it.
	deviceLive func(path string) error
	// mountAt mounts what the snapshotter's Mounts returned at a directory
	// and returns the unmount function: mountAll unless a test replaces it
	// (the host tests' devices are directories, not block devices).
	mountAt func(ms []mount.Mount, dir string) (func() error, error)
	// hooks are test points (crash injection); nil in production.
	hooks map[string]func()
	// madeHere holds the extraction snapshots create-device prepared or
	// adopted in this process that extract-layers has not yet taken. Only
	// those are extracted onto (or, adopted, taken as extracted): an
	// attempt after a failure, a crash or a stop starts on a fresh device,
	// since the one it finds holds an unknown part of the layer.
	madeHere sync.Map
	// guard, when set, keeps the pool from filling up (SetPoolGuard).
	guard PoolGuard
	// files is held shared by every pull from its listing until its runs
	// end, and exclusively by Prune while it forgets object records and
	// deletes layer files: between a pull's downloads and its unpack no
	// run is live, and without it a prune would delete the files the
	// unpack is about to read.
	files sync.RWMutex
	// streamsMu guards growing, the temp files of the transfers under
	// way in this process (by download idempotency id), and streams, the
	// stream extractions not yet adopted or dropped (by snapshot key):
	// extraction while downloading (stream.go); and transferWaiters, the
	// channels closed when a download's transfer ends (by idempotency id).
	streamsMu       sync.Mutex
	growing         map[string]*growingFile
	streams         map[string]*streamExtraction
	transferWaiters map[string][]chan struct{}
	// names is held per image name while nameImage records the name and
	// registers it in containerd: without it one naming could record
	// between another's record and registration, and the records and
	// containerd would end naming different images.
	names keyed.Mutex[string]
	// stopping is canceled, with fsm.ErrClosed as its cause, when Close
	// begins: the pulls and activates under way (calls, counted while
	// callsMu says the pipelines are not closed) are cut with it, and
	// Close returns only once they have ended, so that none of them
	// removes, records or registers anything after it.
	stopping context.Context
	stop     context.CancelCauseFunc
	callsMu  sync.Mutex
	closed   bool
	calls    sync.WaitGroup
}

// New builds the manager, the queues and the three machines over opts.DB.
// Call Resume once at start-up, then Pull.
func New(ctx context.Context, opts Options) (*Pipelines, error) {
	if opts.DB == nil || opts.Sources == nil || opts.DownloadDir == "" {
		return nil, errors.New("pipeline: DB, Sources and DownloadDir are required")
	}
	if opts.MaxLayerSize <= 0 {
		opts.MaxLayerSize = DefaultMaxLayerSize
	}
	if opts.DownloadTimeout <= 0 {
		opts.DownloadTimeout = DefaultDownloadTimeout
	}
	if opts.ExtractTimeout <= 0 {
		opts.ExtractTimeout = DefaultExtractTimeout
	}
	if opts.Downloads <= 0 {
		opts.Downloads = DefaultDownloads
	}
	if opts.Unpacking <= 0 {
		opts.Unpacking = DefaultUnpacking
	}
	if opts.SpoolSize == 0 {
		opts.SpoolSize = DefaultSpoolSize
	}
	if opts.MountDir == "" {
		opts.MountDir = filepath.Join(opts.DownloadDir, "mnt")
	}
	if opts.RequiredDirs == nil {
		opts.RequiredDirs = tarball.RequiredDirs
	}
	for _, d := range []string{opts.blobDir(), opts.tmpDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("pipeline: create %s: %w", d, err)
		}
	}
	p := &Pipelines{opts: opts, db: opts.DB, deviceLive: mappedDeviceLive, mountAt: mountAll}
	p.stopping, p.stop = context.WithCancelCause(context.Background())
	p.spools.limit = opts.SpoolSize
	p.hooks = faultHooks(ctx)
	p.m = fsm.NewManager(fsm.NewSQLiteStore(opts.DB),
		fsm.WithQueueLimit(QueueDownloads, opts.Downloads), fsm.WithQueueLimit(QueueUnpacking, opts.Unpacking),
		fsm.WithRetryObserver(opts.OnRetry))
	var err error
	if p.startDownload, err = p.buildDownload(ctx); err != nil {
		return nil, err
	}
	if p.startUnpack, err = p.buildUnpack(ctx); err != nil {
		return nil, err
	}
	if p.startActivate, err = p.buildActivate(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Resume re-enters every run a previous process left unfinished (at
// start-up, after New), then removes what runs that are no longer live
// left behind: extraction snapshots, their mount points and download temp
// files. What it cannot remove is logged, naming each leftover, and left
// to the next start: nothing live uses it, and one leftover (a mount kept
// busy, a file the daemon may not remove) must not keep the daemon from
// serving. Only a failure to resume the runs is returned.
func (p *Pipelines) Resume(ctx context.Context) error {
	if err := p.m.Resume(ctx); err != nil {
		return err
	}
	if err := p.sweep(ctx); err != nil {
		log.G(ctx).WithError(err).Error("sweep: leftovers of runs no longer live were not all removed; the next start tries again")
	}
	return nil
}

// Manager is the fsm manager the machines run on (for waiting on runs).
func (p *Pipelines) Manager() *fsm.Manager { return p.m }

// Close stops the runs of this process; they stay recorded for the next
// Resume. The pulls and activates under way are cut (their errors match
// fsm.ErrClosed) and later ones refused; Close returns once they have
// ended too, or ctx is done.
func (p *Pipelines) Close(ctx context.Context) error {
	p.callsMu.Lock()
	p.closed = true
	p.callsMu.Unlock()
	p.stop(fsm.ErrClosed)
	err := p.m.Close(ctx)
	ended := make(chan struct{})
	go func() { p.calls.Wait(); close(ended) }()
	select {
	case <-ended:
		return err
	case <-ctx.Done():
		return errors.Join(err, fmt.Errorf("pipeline: closing: pulls or activates still ending: %w", ctx.Err()))
	}
}

// begin counts a pull or an activate under way until end is called, and
// returns its context, which Close cuts; once Close has begun it is
// refused (fsm.ErrClosed).
func (p *Pipelines) begin(ctx context.Context) (_ context.Context, end func(), err error) {
	p.callsMu.Lock()
	defer p.callsMu.Unlock()
	if p.closed {
		return nil, nil, fsm.ErrClosed
	}
	p.calls.Add(1)
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(p.stopping, func() { cancel(fsm.ErrClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
		p.calls.Done()
	}, nil
}

// stopped is err, the error of a call begun with begin whose context is
// ctx, said to be the daemon's stop (matching fsm.ErrClosed) when Close
// cut the call: what the caller is to be told, rather than the canceled
// context the call met.
func stopped(ctx context.Context, err error) error {
	if err != nil && !errors.Is(err, fsm.ErrClosed) && errors.Is(context.Cause(ctx), fsm.ErrClosed) {
		return fmt.Errorf("%w: %w", fsm.ErrClosed, err)
	}
	return err
}

func (o Options) blobDir() string { return filepath.Join(o.DownloadDir, "blobs", "sha256") }
func (o Options) tmpDir() string  { return filepath.Join(o.DownloadDir, "tmp") }

// retry scales policy with Options.RetryInitial.
func (p *Pipelines) retry(policy fsm.RetryPolicy) fsm.TransitionOption {
	if p.opts.RetryInitial > 0 {
		policy = policy.WithDelays(p.opts.RetryInitial, 8*p.opts.RetryInitial)
	}
	return fsm.WithRetry(policy)
}

// hook runs the test hook named name, if any.
func (p *Pipelines) hook(name string) {
	if f := p.hooks[name]; f != nil {
		f()
	}
}

// throttle limits progress events of one transition to one per interval,
// always passing the first and the last.
type throttle struct {
	last  time.Time
	every time.Duration
}

func (t *throttle) ok(final bool) bool {
	now := time.Now()
	if final || now.Sub(t.last) >= t.every {
		t.last = now
		return true
	}
	return false
}

// mountAll mounts ms at dir (containerd's mount package) and returns the
// unmount function, which is safe to call more than once.
func mountAll(ms []mount.Mount, dir string) (func() error, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create mount point %s: %w", dir, err)
	}
	// A crash may have left the mount point mounted: clear it first.
	_ = mount.UnmountAll(dir, 0)
	if err := mount.All(ms, dir); err != nil {
		return nil, fmt.Errorf("mount %v at %s: %w", ms, dir, err)
	}
	var once sync.Once
	var uerr error
	return func() error {
		once.Do(func() {
			uerr = mount.UnmountAll(dir, 0)
			if uerr == nil {
				_ = os.Remove(dir)
			}
		})
		return uerr
	}, nil
}
