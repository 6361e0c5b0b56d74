// Package metadata is the one SQLite database of the snapshotter: opening
// it with the connection settings of the design ([metadata]), its schema
// (embedded, numbered migrations with a SHA-256 ledger), transactions,
// backups and the integrity check. It holds no table's queries: each
// table's typed queries and record types live with the package that writes
// it (snapshotter, fetcher/fsm, fetcher/pipeline), and the operator's
// listings in inventory.
package metadata

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/log"
	"github.com/mattn/go-sqlite3"
)

// DefaultPath is where the daemon keeps its database unless configured
// otherwise.
const DefaultPath = "/var/lib/containerd-flyio-snapshotter/metadata.db"

// DefaultBusyTimeout is the busy_timeout: how long a statement waits
// for another connection's lock before failing with SQLITE_BUSY.
const DefaultBusyTimeout = 5 * time.Second

// Synchronous is SQLite's synchronous setting for the database: how often
// a commit waits for the disk. Both values keep the file consistent after a
// crash of the process or the machine; they differ in what a power loss or
// kernel crash may take back.
type Synchronous string

const (
	// SynchronousFull fsyncs the write-ahead log at every commit: a commit
	// that returned survives a power loss. Each write transaction costs one
	// fsync more than SynchronousNormal.
	SynchronousFull Synchronous = "full"
	// SynchronousNormal fsyncs the write-ahead log only at checkpoints: a
	// commit that returned survives a crash of the process, but the last
	// commits before a power loss or kernel crash can be lost while the
	// device-mapper pool already holds what they recorded.
	SynchronousNormal Synchronous = "normal"
)

// DefaultSynchronous is the synchronous setting used when none is given:
// every operation acknowledged to a caller survives a power loss, because
// start-up reconciliation can only explain a pool device by a row that is
// on disk.
const DefaultSynchronous = SynchronousFull

// Validate reports whether s is a setting Open accepts; the error names the
// accepted values.
func (s Synchronous) Validate() error {
	switch s {
	case SynchronousFull, SynchronousNormal:
		return nil
	}
	return fmt.Errorf("metadata: synchronous must be %q or %q, got %q", SynchronousFull, SynchronousNormal, string(s))
}

// pragma is the value of SQLite's synchronous pragma for s.
func (s Synchronous) pragma() string {
	if s == SynchronousNormal {
		return "NORMAL"
	}
	return "FULL"
}

// Connection pool settings.
const (
	maxOpenConns    = 10
	maxIdleConns    = 5
	connMaxLifetime = time.Hour
)

// stmtCacheSize is how many prepared statements each connection keeps for
// reuse (go-sqlite3's per-connection statement cache): the pipelines' hot
// look-ups are prepared once per connection instead of once per call.
const stmtCacheSize = 64

// driverName is the database/sql driver registered by this package: the
// go-sqlite3 driver with a connect hook that applies the pragmas go-sqlite3
// has no DSN parameter for, on every connection the pool opens.
const driverName = "sqlite3_flyio_snapshotter"

// SQLiteVersion is the version of the SQLite library linked into this
// binary (go-sqlite3 compiles its own copy in), e.g. "3.50.4": what
// `version` reports, since it decides the file format features and the
// fixes a database gets.
func SQLiteVersion() string {
	v, _, _ := sqlite3.Version()
	return v
}

// connectPragmas are applied by the connect hook to every pooled connection
// (read-write and read-only); the other pragmas travel in the DSN
// (see dsn).
const connectPragmas = `PRAGMA temp_store = MEMORY; PRAGMA mmap_size = 268435456;`

func init() {
	sql.Register(driverName, &sqlite3.SQLiteDriver{
		ConnectHook: func(c *sqlite3.SQLiteConn) error {
			if _, err := c.Exec(connectPragmas, nil); err != nil {
				return fmt.Errorf("metadata: applying connection pragmas: %w", err)
			}
			return nil
		},
	})
}

// ErrReadOnly is wrapped by WithTx (and the writes built on it) on a DB
// opened with Options.ReadOnly; the other writes fail there with SQLite's
// "attempt to write a readonly database". Either way nothing is written.
var ErrReadOnly = errors.New("metadata: database opened read-only")

// ErrNoDatabase is wrapped by a read-only Open of a path where no database
// file exists (a read-only open never creates one).
var ErrNoDatabase = errors.New("metadata: no database file")

// Options say which database to open and how. Path and Synchronous are
// the daemon's [metadata] section (the toml tags are its keys).
type Options struct {
	// Path of the database file; empty means DefaultPath. The directory is
	// created (0700) by a read-write open.
	Path string `toml:"path"`
	// ReadOnly opens the file read-only (SQLite mode=ro, query_only): the
	// open never creates, migrates or writes anything, and works while the
	// daemon writes (WAL readers never block the writer). For CLI readers.
	ReadOnly bool `toml:"-"`
	// BusyTimeout overrides DefaultBusyTimeout when positive.
	BusyTimeout time.Duration `toml:"-"`
	// Synchronous is how durable each commit is; empty means
	// DefaultSynchronous. Open refuses any other value than the
	// Synchronous constants.
	Synchronous Synchronous `toml:"synchronous"`

	// MigrateTo, when positive, stops a read-write open's migration after
	// that version (staged upgrades: `db migrate --to N`). Zero migrates to
	// the latest embedded version. A database already past it is left as is.
	MigrateTo int `toml:"-"`
}

// DB is an open metadata database: a pool of SQLite connections with the
// pragmas on each. It is safe for concurrent use.
type DB struct {
	db       *sql.DB
	path     string
	readOnly bool
	migrated MigrateResult
}

// dsn builds the go-sqlite3 data source name for path: a file: URI carrying
// the pragmas go-sqlite3 applies itself on each new connection
// (busy_timeout, foreign_keys, synchronous, cache_size, and for writers
// journal_mode=WAL and BEGIN IMMEDIATE transactions; for readers mode=ro and
// query_only).
func dsn(path string, readOnly bool, busy time.Duration, sync Synchronous) string {
	q := url.Values{}
	q.Set("_busy_timeout", strconv.FormatInt(busy.Milliseconds(), 10))
	q.Set("_foreign_keys", "1")
	q.Set("_synchronous", sync.pragma())
	q.Set("_cache_size", "-10000")
	q.Set("_stmt_cache_size", strconv.Itoa(stmtCacheSize))
	if readOnly {
		q.Set("mode", "ro")
		q.Set("_query_only", "1")
	} else {
		q.Set("_journal_mode", "WAL")
		q.Set("_txlock", "immediate")
	}
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: path}).EscapedPath(), RawQuery: q.Encode()}
	return u.String()
}

// Open opens the database at opts.Path. A read-write open creates the file
// if absent, sets WAL mode and migrates to the latest embedded migration
// (refusing a database whose migration ledger does not match the embedded
// migrations, and copying a non-empty database to <path>.pre-v<N> before
// migrating it), and removes the temporary files that backups killed
// midway left in its directory. A read-only open requires the file to
// exist, verifies the ledger, and never writes.
func Open(ctx context.Context, opts Options) (*DB, error) {
	path := opts.Path
	if path == "" {
		path = DefaultPath
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = DefaultBusyTimeout
	}
	sync := opts.Synchronous
	if sync == "" {
		sync = DefaultSynchronous
	}
	if err := sync.Validate(); err != nil {
		return nil, fmt.Errorf("metadata: open %s: %w", path, err)
	}
	if opts.ReadOnly {
		if _, err := os.Stat(path); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("metadata: open %s read-only: %w (the daemon creates it on first start, or run 'db migrate')", path, ErrNoDatabase)
			}
			return nil, fmt.Errorf("metadata: open %s read-only: %w", path, err)
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("metadata: creating the directory of database %s: %w", path, err)
		}
		// What backups (the copies before migrating among them) killed
		// midway left beside the database goes at the daemon's start.
		removeStaleBackupTemps(ctx, filepath.Dir(path))
	}

	sdb, err := sql.Open(driverName, dsn(path, opts.ReadOnly, busy, sync))
	if err != nil {
		return nil, fmt.Errorf("metadata: open %s: %w", path, err)
	}
	sdb.SetMaxOpenConns(maxOpenConns)
	sdb.SetMaxIdleConns(maxIdleConns)
	sdb.SetConnMaxLifetime(connMaxLifetime)
	d := &DB{db: sdb, path: path, readOnly: opts.ReadOnly}

	if err := d.firstPing(ctx, busy); err != nil {
		sdb.Close()
		return nil, err
	}
	if opts.ReadOnly {
		if _, err := d.verifyLedger(ctx, true); err != nil {
			sdb.Close()
			return nil, err
		}
	} else {
		res, err := d.migrate(ctx, opts.MigrateTo)
		if err != nil {
			sdb.Close()
			return nil, err
		}
		d.migrated = res
		if len(res.Applied) > 0 {
			log.G(ctx).WithField("db", path).WithField("from", res.From).WithField("to", res.To).
				WithField("backup", res.Backup).Info("metadata: database migrated")
		}
	}
	return d, nil
}

// Close closes every connection of the pool.
func (d *DB) Close() error {
	if err := d.db.Close(); err != nil {
		return fmt.Errorf("metadata: close %s: %w", d.path, err)
	}
	return nil
}

// Ping checks that the database file can be opened and read.
func (d *DB) Ping(ctx context.Context) error {
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master`).Scan(&n); err != nil {
		return fmt.Errorf("metadata: ping %s: %w", d.path, err)
	}
	return nil
}

// firstPing is Ping for a connection's first use, which switches a new
// file to WAL: that switch needs the file to itself, and SQLite answers
// "database is locked" at once, without waiting busy_timeout, when another
// process is switching it at the same moment (several processes opening a
// database that does not exist yet). It tries again for up to busy.
func (d *DB) firstPing(ctx context.Context, busy time.Duration) error {
	deadline := time.Now().Add(busy)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		err := d.Ping(ctx)
		var se sqlite3.Error
		if err == nil || !errors.As(err, &se) || (se.Code != sqlite3.ErrBusy && se.Code != sqlite3.ErrLocked) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// Path is the database file this DB was opened on.
func (d *DB) Path() string { return d.path }

// ReadOnly reports whether the DB was opened with Options.ReadOnly.
func (d *DB) ReadOnly() bool { return d.readOnly }

// Migrated reports what the read-write Open that returned d migrated (zero
// for a read-only DB).
func (d *DB) Migrated() MigrateResult { return d.migrated }

// Querier runs single statements: what a subsystem's own queries on its
// own tables use outside a transaction.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Statements returns the connection pool for single statements. Each
// statement is its own transaction; on a DB opened read-only SQLite
// refuses writes.
func (d *DB) Statements() Querier { return d.db }

// WithTx runs fn in one write transaction (BEGIN IMMEDIATE: the write lock is
// taken at the start, so fn never fails half-way on a lock upgrade). The
// transaction commits if fn returns nil and rolls back otherwise (also when
// fn panics; the panic is re-raised). fn must not start other transactions.
func (d *DB) WithTx(ctx context.Context, fn func(tx *sql.Tx) error) (err error) {
	if d.readOnly {
		return fmt.Errorf("metadata: write transaction on %s: %w", d.path, ErrReadOnly)
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("metadata: begin immediate on %s: %w", d.path, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("metadata: commit on %s: %w", d.path, err)
	}
	committed = true
	return nil
}

// ReadSnapshot runs fn inside a deferred (read) transaction on one
// connection: every query of fn sees the same committed state, and no
// write lock is taken (the pool's transactions are BEGIN IMMEDIATE, which
// would queue a reader behind writers). Whatever fn writes is rolled back.
// Its own errors are the driver's, not wrapped: the caller says what the
// read was for.
func (d *DB) ReadSnapshot(ctx context.Context, fn func(q Querier) error) error {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, `BEGIN DEFERRED`); err != nil {
		return err
	}
	defer c.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`) //nolint:errcheck // read-only: nothing to keep
	return fn(c)
}
