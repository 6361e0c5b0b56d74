package metadata

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/log"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// ActivationPrefix starts the key of every image's activation (its active
// snapshot): the views of migration 0008 spell it in SQL, which a migration
// cannot take from Go, so the owner of the activations builds its keys from
// this one.
const ActivationPrefix = "snap-"

// Migration is one embedded schema migration.
type Migration struct {
	Version     int
	Name        string // file name without the number and extension, e.g. "initial"
	SQL         string
	SHA256      string // hex SHA-256 of the whitespace-trimmed SQL
	Description string // the file's first comment line, or Name
}

// ErrLedgerMismatch is wrapped by Open and VerifyLedger when the migration
// ledger (schema_migrations) disagrees with the embedded migrations: a
// recorded hash differs, a recorded hash is missing, or versions have gaps.
var ErrLedgerMismatch = errors.New("metadata: migration ledger mismatch")

// ErrSchemaTooNew is wrapped by a read-write Open of a database migrated by
// a newer binary (it records versions this binary does not embed).
var ErrSchemaTooNew = errors.New("metadata: database schema newer than this binary")

// migrationHook, when set (tests only), runs inside each migration's
// transaction after the migration's SQL and before its ledger row.
var migrationHook func(version int)

// backupHook, when set (tests only), runs in each backup once the copy is
// written to its temporary file tmp, before it is synced and renamed.
var backupHook func(tmp string)

// ledgerBootstrap is the schema_migrations table of migration 1; the runner creates
// it before the first migration so migration 1 can be recorded.
const ledgerBootstrap = `CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    applied_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    description TEXT
);`

// embedded returns the embedded migrations, read and hashed on first use:
// only commands that open the database need them, and every process of the
// binary (the CLI's client subcommands too) would otherwise pay for
// reading and hashing them at start-up.
var embedded = sync.OnceValue(mustLoadMigrations)

// Migrations returns the embedded migrations in version order.
func Migrations() []Migration {
	return append([]Migration(nil), embedded()...)
}

// LatestVersion is the highest embedded migration version.
func LatestVersion() int {
	ms := embedded()
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// reworded lists, per version, the SHA-256 of earlier texts of a migration
// whose comments were reworded while its statements stayed the same: a
// ledger recording one of them is as valid as one recording the current
// text, and a read-write open records the current hash in its place.
var reworded = map[int]string{
	1: "ec5b78dca89d36101c7ac576c742121be8673f68dff052d6eade27c27b4f0072",
	2: "680b60b4c1e683201cfa06a9e50e2ac7b863bc4286752d49a8a2f585278433da",
	3: "590a5f250271e976b3261374aad13754dbde49184f606f7a572e4cb79d818f1f",
	4: "30d4ab2e6e7f638e76ed0df41b7d18d56576084c36d1fe188a79f3e13ac8c249",
	6: "df17ee784f86568c72870c3000c5ad48ba47834a318cab45d1cdc47f3168bea2",
	7: "9276705ed4613b37cbd6aa157ee02fac33ff7ad4d5ff215c9e071655a1eb107d",
}

func rewordedFrom(version int, sum string) bool { return sum != "" && reworded[version] == sum }

func hashSQL(s string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(s)))
	return hex.EncodeToString(sum[:])
}

func mustLoadMigrations() []Migration {
	ms, err := loadMigrations(migrationFS)
	if err != nil {
		panic(err)
	}
	return ms
}

// loadMigrations reads migrations/NNNN_name.sql from fsys; numbers must be
// unique and contiguous from 1.
func loadMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("metadata: listing embedded migrations: %w", err)
	}
	var ms []Migration
	for _, n := range names {
		base := path.Base(n)
		num, rest, ok := strings.Cut(strings.TrimSuffix(base, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("metadata: embedded migration %s: name must be NNNN_name.sql with NNNN >= 1", base)
		}
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, fmt.Errorf("metadata: reading embedded migration %s: %w", base, err)
		}
		m := Migration{Version: v, Name: rest, SQL: string(b), SHA256: hashSQL(string(b)), Description: rest}
		for _, line := range strings.Split(m.SQL, "\n") {
			if t, ok := strings.CutPrefix(strings.TrimSpace(line), "--"); ok && strings.TrimSpace(t) != "" {
				m.Description = strings.TrimSpace(t)
				break
			}
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("metadata: embedded migrations must be numbered 1..N without gaps or duplicates: found %04d_%s at position %d", m.Version, m.Name, i+1)
		}
	}
	return ms, nil
}

// LedgerRow is one row of schema_migrations.
type LedgerRow struct {
	Version     int
	AppliedAt   string
	Description string
	SHA256      string // "" when NULL or before migration 3 added the column
}

// MigrateResult says what a read-write Open did to the schema.
type MigrateResult struct {
	From    int    // version before (0: new database)
	To      int    // version after
	Applied []int  // versions applied by this open, in order
	Backup  string // path of the <db>.pre-v<N> copy written before migrating, if any
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readLedger returns the ledger rows in version order; no table means no
// rows. The rows are read with one statement, so they come from one
// snapshot of the database: read in two (whether migration 3's column
// exists, then the rows) they could straddle another process's commit of
// migration 3 and show its row without the hashes it back-filled.
func readLedger(ctx context.Context, q queryer) ([]LedgerRow, error) {
	var n int
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`).Scan(&n); err != nil {
		return nil, fmt.Errorf("metadata: looking for schema_migrations: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	rows, err := q.QueryContext(ctx, `SELECT *, CAST(applied_at AS TEXT) AS applied_at_text FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, fmt.Errorf("metadata: reading schema_migrations: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("metadata: reading schema_migrations: %w", err)
	}
	var out []LedgerRow
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("metadata: reading schema_migrations: %w", err)
		}
		var r LedgerRow
		for i, c := range cols {
			switch v := vals[i].String; c {
			case "version":
				if r.Version, err = strconv.Atoi(v); err != nil {
					return nil, fmt.Errorf("metadata: reading schema_migrations: version %q: %w", v, err)
				}
			case "applied_at_text":
				r.AppliedAt = v
			case "description":
				r.Description = v
			case "sql_sha256":
				r.SHA256 = v
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("metadata: reading schema_migrations: %w", err)
	}
	return out, nil
}

func hasColumn(ctx context.Context, q queryer, table, column string) (bool, error) {
	var n int
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name = ?`, table, column).Scan(&n); err != nil {
		return false, fmt.Errorf("metadata: inspecting columns of %s: %w", table, err)
	}
	return n > 0, nil
}

// checkLedger compares ledger rows with the embedded migrations. Versions the
// binary does not embed are an ErrSchemaTooNew error unless allowNewer.
func checkLedger(rows []LedgerRow, allowNewer bool) error {
	if len(rows) == 0 {
		return nil
	}
	hashed := rows[len(rows)-1].Version >= 3 // migration 3 added and back-filled sql_sha256
	for i, r := range rows {
		if r.Version != i+1 {
			return fmt.Errorf("%w: schema_migrations has version %d at position %d: versions must be 1..N without gaps", ErrLedgerMismatch, r.Version, i+1)
		}
		if r.Version > len(embedded()) {
			if allowNewer {
				continue
			}
			return fmt.Errorf("%w: database records migration %d but this binary embeds only 1..%d: run a binary that knows it", ErrSchemaTooNew, r.Version, len(embedded()))
		}
		m := embedded()[r.Version-1]
		if r.SHA256 == "" {
			if hashed {
				return fmt.Errorf("%w: migration %d (%s) has no recorded sql_sha256", ErrLedgerMismatch, r.Version, m.Name)
			}
			continue
		}
		if r.SHA256 != m.SHA256 && !rewordedFrom(m.Version, r.SHA256) {
			return fmt.Errorf("%w: migration %d (%s): recorded sql_sha256 %s differs from the embedded migration's %s (the migration was changed after it was applied, or the ledger was edited)", ErrLedgerMismatch, r.Version, m.Name, r.SHA256, m.SHA256)
		}
	}
	return nil
}

// verifyLedger reads and checks the ledger, returning the current version.
func (d *DB) verifyLedger(ctx context.Context, allowNewer bool) (int, error) {
	rows, err := readLedger(ctx, d.db)
	if err != nil {
		return 0, fmt.Errorf("metadata: %s: %w", d.path, err)
	}
	if err := checkLedger(rows, allowNewer); err != nil {
		if errors.Is(err, ErrSchemaTooNew) {
			// The way back from an upgrade is the copy the newer binary
			// took before it migrated past what this one embeds.
			return 0, fmt.Errorf("metadata: refusing database %s: %w; to go back to this binary, stop the daemon and restore %s (the copy taken before the upgrade migrated it)", d.path, err, d.wayBack())
		}
		return 0, fmt.Errorf("metadata: refusing database %s: %w", d.path, err)
	}
	if len(rows) == 0 {
		// Migration 1 creates the first tables and records itself in the
		// ledger in one transaction: tables without a ledger are another
		// program's database, which a migration would write this schema
		// into.
		has, err := d.hasUserTables(ctx)
		if err != nil {
			return 0, err
		}
		if has {
			return 0, fmt.Errorf("metadata: refusing database %s: %w: it has tables but no migration ledger (schema_migrations), so it is not a containerd-flyio-snapshotter database; check the path", d.path, ErrLedgerMismatch)
		}
		return 0, nil
	}
	return rows[len(rows)-1].Version, nil
}

// wayBack is the copy a newer binary took before it migrated the database
// past this binary's migrations: <path>.pre-v<N> of the highest N at most
// one past them that exists (a database migrated from an older version
// was copied under that version's number), or the one past them when
// none does.
func (d *DB) wayBack() string {
	for n := len(embedded()) + 1; n >= 1; n-- {
		p := fmt.Sprintf("%s.pre-v%d", d.path, n)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return fmt.Sprintf("%s.pre-v%d", d.path, len(embedded())+1)
}

// Ledger returns the rows of schema_migrations (empty for a new database).
func (d *DB) Ledger(ctx context.Context) ([]LedgerRow, error) {
	rows, err := readLedger(ctx, d.db)
	if err != nil {
		return nil, fmt.Errorf("metadata: %s: %w", d.path, err)
	}
	return rows, nil
}

// VerifyLedger checks schema_migrations against the embedded migrations
// (every recorded hash equal to the embedded migration's, versions 1..N
// without gaps); the error wraps ErrLedgerMismatch and names the version.
// Versions newer than this binary are reported too (ErrSchemaTooNew).
func (d *DB) VerifyLedger(ctx context.Context) error {
	_, err := d.verifyLedger(ctx, false)
	return err
}

// SchemaVersion is the highest migration recorded in the ledger.
func (d *DB) SchemaVersion(ctx context.Context) (int, error) {
	rows, err := d.Ledger(ctx)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	return rows[len(rows)-1].Version, nil
}

// hasUserTables reports whether the file holds any table (a database with
// data worth a copy before migrating, as opposed to a brand-new file).
func (d *DB) hasUserTables(ctx context.Context) (bool, error) {
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`).Scan(&n); err != nil {
		return false, fmt.Errorf("metadata: inspecting %s: %w", d.path, err)
	}
	return n > 0, nil
}

// migrate brings the schema to the latest embedded migration (or max when
// positive). Each migration runs with its ledger row in one BEGIN IMMEDIATE
// transaction, so two processes never migrate at once, the second sees the
// first one's work and skips it, and a process killed mid-migration leaves
// the previous version intact for the next open to finish.
func (d *DB) migrate(ctx context.Context, max int) (MigrateResult, error) {
	target := len(embedded())
	if max > 0 && max < target {
		target = max
	}
	cur, err := d.verifyLedger(ctx, false)
	if err != nil {
		return MigrateResult{}, err
	}
	if err := d.recordCurrentHashes(ctx); err != nil {
		return MigrateResult{}, err
	}
	res := MigrateResult{From: cur, To: cur}
	if cur >= target {
		return res, nil
	}
	hasData, err := d.hasUserTables(ctx)
	if err != nil {
		return res, err
	}
	if hasData {
		b, err := d.backupBeforeMigration(ctx, cur+1)
		if err != nil {
			return res, err
		}
		res.Backup = b
	}
	for _, m := range embedded()[:target] {
		applied, err := d.applyMigration(ctx, m)
		if err != nil {
			return res, err
		}
		if applied {
			res.Applied = append(res.Applied, m.Version)
		}
		res.To = m.Version
	}
	// Migration 3 back-fills the hashes of 1 and 2 as they were first
	// written.
	return res, d.recordCurrentHashes(ctx)
}

// recordCurrentHashes replaces, in the ledger, every hash of a reworded
// migration's earlier text by the current text's (see reworded).
func (d *DB) recordCurrentHashes(ctx context.Context) error {
	hasHash, err := hasColumn(ctx, d.db, "schema_migrations", "sql_sha256")
	if err != nil || !hasHash {
		return err
	}
	return d.WithTx(ctx, func(tx *sql.Tx) error {
		for v, old := range reworded {
			if v > len(embedded()) {
				continue
			}
			if _, err := tx.ExecContext(ctx, `UPDATE schema_migrations SET sql_sha256 = ? WHERE version = ? AND sql_sha256 = ?`,
				embedded()[v-1].SHA256, v, old); err != nil {
				return fmt.Errorf("metadata: recording the hash of migration %d in %s: %w", v, d.path, err)
			}
		}
		return nil
	})
}

// applyMigration applies m unless the ledger (read under the write lock)
// already has it. The previous version must be recorded.
func (d *DB) applyMigration(ctx context.Context, m Migration) (applied bool, err error) {
	err = d.WithTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, ledgerBootstrap); err != nil {
			return fmt.Errorf("metadata: creating schema_migrations in %s: %w", d.path, err)
		}
		rows, err := readLedger(ctx, tx)
		if err != nil {
			return err
		}
		if err := checkLedger(rows, false); err != nil {
			return fmt.Errorf("metadata: refusing database %s: %w", d.path, err)
		}
		if len(rows) >= m.Version {
			return nil // another process applied it while we waited
		}
		if len(rows) != m.Version-1 {
			return fmt.Errorf("metadata: migration %d (%s) on %s: database is at version %d, expected %d", m.Version, m.Name, d.path, len(rows), m.Version-1)
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("metadata: applying migration %04d_%s to %s: %w", m.Version, m.Name, d.path, err)
		}
		if migrationHook != nil {
			migrationHook(m.Version)
		}
		withHash, err := hasColumn(ctx, tx, "schema_migrations", "sql_sha256")
		if err != nil {
			return err
		}
		if withHash {
			_, err = tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, description, sql_sha256) VALUES (?, ?, ?)`, m.Version, m.Description, m.SHA256)
		} else {
			_, err = tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, description) VALUES (?, ?)`, m.Version, m.Description)
		}
		if err != nil {
			return fmt.Errorf("metadata: recording migration %d in %s: %w", m.Version, d.path, err)
		}
		applied = true
		return nil
	})
	return applied, err
}

// backupBeforeMigration writes a consistent copy of the database to
// <path>.pre-v<next> (VACUUM INTO a temporary name, fsync, rename), so the
// copy is either complete or absent.
func (d *DB) backupBeforeMigration(ctx context.Context, next int) (string, error) {
	dest := fmt.Sprintf("%s.pre-v%d", d.path, next)
	// Another process may have migrated since this one read the ledger
	// (it waited for the write lock meanwhile): its own copy, taken
	// before it migrated, is the one of version next-1, and a copy of the
	// migrated database must not take its place.
	kept, err := d.backup(ctx, dest, true, func(c *sql.Conn, tmp string) (bool, error) {
		if _, err := c.ExecContext(ctx, `ATTACH DATABASE ? AS copy`, tmp); err != nil {
			return false, err
		}
		defer c.ExecContext(context.WithoutCancel(ctx), `DETACH DATABASE copy`) //nolint:errcheck // the connection is dropped on failure
		var v int
		if err := c.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM copy.schema_migrations`).Scan(&v); err != nil {
			return false, err
		}
		return v == next-1, nil
	})
	if err != nil {
		return "", fmt.Errorf("metadata: copy before migrating to version %d: %w", next, err)
	}
	if !kept {
		log.G(ctx).WithField("db", d.path).WithField("backup", dest).Info("metadata: another process migrated the database meanwhile; its copy stays")
		return "", nil
	}
	log.G(ctx).WithField("db", d.path).WithField("backup", dest).Info("metadata: copied database before migrating")
	return dest, nil
}

// Backup writes a consistent copy of the database to dest while other
// connections (and processes) keep writing: SQLite's VACUUM INTO reads one
// read transaction's snapshot. The copy is written to a temporary file beside
// dest, synced and renamed over dest, so dest is never half written. An
// existing dest is replaced. The temporary files that backups killed
// midway left in dest's directory are removed first; those of backups
// still running are not.
func (d *DB) Backup(ctx context.Context, dest string) error {
	_, err := d.backup(ctx, dest, true, nil)
	return err
}

// BackupNew is Backup to a dest that must not exist: when a file of that
// name is there by the time the copy is finished (another backup to the
// same name, or anything else, wrote it meanwhile), it is left as it is,
// the copy is dropped and the error satisfies errors.Is(err, fs.ErrExist).
func (d *DB) BackupNew(ctx context.Context, dest string) error {
	_, err := d.backup(ctx, dest, false, nil)
	return err
}

// backup is Backup, or BackupNew unless replace; when keep is not nil, it
// is asked, on the connection that wrote it, whether the copy written to
// tmp is to replace dest, and the copy is dropped unless it says so.
func (d *DB) backup(ctx context.Context, dest string, replace bool, keep func(c *sql.Conn, tmp string) (bool, error)) (bool, error) {
	if own := d.ownFile(dest); own != "" {
		// Renamed over the live file, the copy would take the place of a
		// database its writers and its write-ahead log go on with.
		return false, fmt.Errorf("metadata: backup of %s to %s: the destination is the database's own file %s; write the copy elsewhere", d.path, dest, own)
	}
	removeStaleBackupTemps(ctx, filepath.Dir(dest))
	// VACUUM INTO accepts an existing empty file: a unique empty temporary
	// file keeps concurrent backups to the same dest apart. Its lock, held
	// until it is renamed or removed, keeps other backups' sweeps off it.
	f, err := createBackupTemp(dest)
	if err != nil {
		return false, fmt.Errorf("metadata: backup of %s to %s: %w", d.path, dest, err)
	}
	defer f.Close()
	tmp := f.Name()
	ok, err := d.vacuumInto(ctx, tmp, keep)
	if err == nil && ok && backupHook != nil {
		backupHook(tmp)
	}
	if err != nil || !ok {
		_ = os.Remove(tmp)
		if err != nil {
			return false, fmt.Errorf("metadata: backup of %s to %s: %w", d.path, dest, err)
		}
		return false, nil
	}
	if err := syncFile(tmp); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("metadata: backup of %s to %s: %w", d.path, dest, err)
	}
	if err := install(tmp, dest, replace); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("metadata: backup of %s to %s: %w", d.path, dest, err)
	}
	_ = syncFile(filepath.Dir(dest))
	return true, nil
}

// install puts the finished copy tmp in dest's place: renamed over it when
// replace; otherwise linked in, which link(2) refuses with EEXIST when dest
// exists by then, so a check that dest is absent made before the copy
// (which takes long) cannot be outdated by the time it lands. The
// temporary name is then removed; if that fails, the next backup's sweep
// removes it, dest keeping the copy.
func install(tmp, dest string, replace bool) error {
	if replace {
		return os.Rename(tmp, dest)
	}
	if err := os.Link(tmp, dest); err != nil {
		return err
	}
	_ = os.Remove(tmp)
	return nil
}

// ownFile is the file of the database (the database, its write-ahead log,
// its shared memory or its journal) that dest names, by its path or as the
// same file under another name; "" when dest is none of them.
func (d *DB) ownFile(dest string) string {
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			return filepath.Clean(p)
		}
		return a
	}
	dst, derr := os.Stat(dest)
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		own := d.path + suffix
		if abs(own) == abs(dest) {
			return own
		}
		if st, err := os.Stat(own); derr == nil && err == nil && os.SameFile(st, dst) {
			return own
		}
	}
	return ""
}

// vacuumInto runs VACUUM INTO dest on one connection, then asks keep (if
// not nil) on that connection whether the copy is to be kept. On a read-only DB the
// connection's query_only guard is lifted for that statement (mode=ro still
// forbids writing the database itself) and the connection is discarded
// afterwards, so no pooled connection is left writable.
func (d *DB) vacuumInto(ctx context.Context, dest string, keep func(c *sql.Conn, tmp string) (bool, error)) (bool, error) {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer c.Close()
	if d.readOnly {
		defer c.Raw(func(any) error { return driver.ErrBadConn })
		if _, err := c.ExecContext(ctx, `PRAGMA query_only = 0`); err != nil {
			return false, err
		}
	}
	if _, err = c.ExecContext(ctx, `VACUUM INTO ?`, dest); err != nil || keep == nil {
		return err == nil, err
	}
	ok, err := keep(c, dest)
	if err != nil {
		// Whatever the connection was left with (an attached copy), it
		// goes.
		c.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // the connection is dropped
	}
	return ok, err
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
