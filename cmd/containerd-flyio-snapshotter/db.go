package main

// `db`: maintenance of the metadata database (migrate, check, backup).

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

const dbDescription = `
Maintain the metadata database (SQLite, WAL): check and backup while the
daemon runs or not; migrate with the daemon stopped.

Subcommands:
  migrate              apply the embedded schema migrations the database lacks
                       (a non-empty database is first copied to <db>.pre-v<N>)
  check                integrity_check, foreign_key_check and the migration
                       ledger (recorded SHA-256 of each migration); exit 1 on
                       any problem
  backup DEST          write a consistent copy of the database to DEST while
                       the daemon keeps writing

Every subcommand takes --config FILE, --db PATH and --format table|json
(json: one JSON object on stdout, for scripts); run
'containerd-flyio-snapshotter db SUBCOMMAND --help' for its flags.`

func init() {
	cli.Register(&cli.Command{Name: "db", Summary: "maintain the metadata database (migrate, check, backup)", Run: runDB})
}

func runDB(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("db", "db migrate|check|backup [flags]", dbDescription)
	if len(args) == 0 {
		return cli.UsageError(fs, "name a subcommand: migrate, check or backup")
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return nil
	case "migrate":
		return runDBMigrate(ctx, args[1:])
	case "check":
		return runDBCheck(ctx, args[1:])
	case "backup":
		return runDBBackup(ctx, args[1:])
	}
	return cli.UsageError(fs, fmt.Sprintf("unknown db subcommand %q (want migrate, check or backup)", args[0]))
}

// parseDBFlags parses a db subcommand's flags (which include --config,
// --db and --format, returned), before or after its positional arguments,
// and requires exactly nargs of those, which it returns.
func parseDBFlags(fs *flag.FlagSet, args []string, nargs int, what string) (*cli.FormatFlag, []string, error) {
	cli.AddDBFlags(fs)
	format := cli.AddFormatFlag(fs, cli.DefaultFormatUsage)
	pos, err := cli.ParseInterspersed(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if len(pos) != nargs {
		if nargs == 0 {
			return nil, nil, cli.UsageError(fs, fmt.Sprintf("unexpected argument %q", pos[0]))
		}
		return nil, nil, cli.UsageError(fs, fmt.Sprintf("want %s, got %d arguments", what, len(pos)))
	}
	return format, pos, nil
}

// dbPath is the database the flags and the config name.
func dbPath() (string, error) {
	cfg, err := loadConfig()
	if err != nil {
		return "", err
	}
	return cfg.Metadata.Path, nil
}

// openDB opens the configured database, read-only or read-write.
func openDB(ctx context.Context, readOnly bool) (*metadata.DB, error) {
	return openDBTo(ctx, readOnly, 0)
}

// openRecordsToChange opens read-write, for a command that changes a
// daemon's records, a database that exists and is at this binary's schema
// version. Such a command neither makes a new database where a mistyped
// path points nor migrates one that its daemon, of an older version, may
// still be using; either is refused with exit status 1.
func openRecordsToChange(ctx context.Context) (*metadata.DB, error) {
	path, err := dbPath()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err != nil {
		return nil, &cli.ExitError{Code: 1, Msg: fmt.Sprintf("database %s: %v (this command changes the records of an existing database: give its --db or --config)", path, err)}
	}
	ro, err := openDB(ctx, true)
	if err != nil {
		return nil, err
	}
	ledger, err := ro.Ledger(ctx)
	ro.Close()
	if err != nil {
		return nil, err
	}
	if v := len(ledger); v == 0 || ledger[v-1].Version != metadata.LatestVersion() {
		at := 0
		if v > 0 {
			at = ledger[v-1].Version
		}
		return nil, &cli.ExitError{Code: 1, Msg: fmt.Sprintf("database %s is at schema version %d, this binary's is %d: run the command with the daemon's own binary, or migrate the database first (db migrate, with the daemon stopped)", path, at, metadata.LatestVersion())}
	}
	return openDB(ctx, false)
}

// openDBTo is openDB with a migration target for a read-write open (0: the
// latest version).
func openDBTo(ctx context.Context, readOnly bool, migrateTo int) (*metadata.DB, error) {
	path, err := dbPath()
	if err != nil {
		return nil, err
	}
	return metadata.Open(ctx, metadata.Options{Path: path, ReadOnly: readOnly, MigrateTo: migrateTo})
}

func runDBMigrate(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("db migrate", "db migrate [--to N] [--create] [--format table|json] [--config FILE] [--db PATH]", `
Apply the embedded schema migrations the database lacks, each in its own
BEGIN IMMEDIATE transaction with its ledger row. Run it with the daemon
stopped: it holds the daemon's lock (daemon.lock beside the database, or
<db>.lock) while it works, so it is refused while a daemon runs on the
database, and a daemon started meanwhile exits at once (systemd starts it
again). Before migrating a
database that already has tables, a consistent copy is written beside it as
<db>.pre-v<N>, N being the first version applied. Creates the database if it
does not exist; its directory must exist unless --create is given (so a
mistyped path is an error, not a new tree). The daemon does the same at
start-up, creating the directory. --to N stops after
version N (a staged upgrade); without it the schema goes to the latest
version this binary embeds.`)
	to := fs.Int("to", 0, "stop after schema `VERSION` (0: the latest, "+strconv.Itoa(metadata.LatestVersion())+")")
	create := fs.Bool("create", false, "create the database's directory (mode 0700) when it does not exist")
	format, _, err := parseDBFlags(fs, args, 0, "")
	if err != nil {
		return err
	}
	if *to < 0 || *to > metadata.LatestVersion() {
		return cli.UsageError(fs, fmt.Sprintf("--to %d: want a schema version from 1 to %d", *to, metadata.LatestVersion()))
	}
	path, err := dbPath()
	if err != nil {
		return err
	}
	if !*create {
		dir := filepath.Dir(path)
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("database %s: directory %s does not exist (pass --create to make it)", path, dir)
		}
	}
	unlock, err := lockAgainstDaemon(path)
	if err != nil {
		return err
	}
	defer unlock()
	d, err := openDBTo(ctx, false, *to)
	if err != nil {
		return err
	}
	defer d.Close()
	res := d.Migrated()
	if format.JSON() {
		applied := res.Applied
		if applied == nil {
			applied = []int{} // a list in JSON, even when empty
		}
		return cli.WriteJSON(os.Stdout, migrateJSON{DB: d.Path(), From: res.From, To: res.To, Applied: applied, Backup: res.Backup})
	}
	if len(res.Applied) == 0 {
		_, err := fmt.Printf("%s: schema at version %d; nothing to do\n", d.Path(), res.To)
		return err
	}
	applied := make([]string, len(res.Applied))
	for i, v := range res.Applied {
		applied[i] = strconv.Itoa(v)
	}
	if _, err := fmt.Printf("%s: migrated from version %d to %d (applied %s)\n", d.Path(), res.From, res.To, strings.Join(applied, ", ")); err != nil {
		return err
	}
	if res.Backup != "" {
		if _, err := fmt.Printf("copy before migrating: %s\n", res.Backup); err != nil {
			return err
		}
	}
	return nil
}

// lockAgainstDaemon takes the locks a daemon on the database at path holds
// (plugin.LockDatabase), so that no daemon runs on it until release is
// called. A lock held by a running daemon (or another migration) is
// refused (exit status 1) naming its holder: a migration under a running
// daemon would change the schema its statements were written for.
func lockAgainstDaemon(path string) (release func(), err error) {
	release, err = plugin.LockDatabase(path)
	if errors.Is(err, plugin.ErrLocked) {
		return nil, &cli.ExitError{Code: 1, Msg: fmt.Sprintf("database %s is in use (%v; a running daemon or another db migrate): stop the daemon first (systemctl stop containerd-flyio-snapshotter), or let it migrate the database as it starts", path, err)}
	}
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	return release, nil
}

func runDBCheck(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("db check", "db check [--format table|json] [--config FILE] [--db PATH]", `
Check the database read-only (safe while the daemon runs): SQLite's
integrity_check, foreign_key_check, and the migration ledger (every applied
migration's recorded SHA-256 equal to the embedded migration's, versions
without gaps, schema at this binary's latest version). Prints each problem
and exits 1 if there is any; exits 0 and prints one "ok" line otherwise.
With --format json it prints one object instead: the database, "ok",
the schema version and the problems (a list, empty when ok); the exit
status is the same, with nothing on stderr.`)
	format, _, err := parseDBFlags(fs, args, 0, "")
	if err != nil {
		return err
	}
	d, err := openDB(ctx, true)
	if err != nil {
		ledger := errors.Is(err, metadata.ErrLedgerMismatch)
		if format.JSON() {
			// A database the open refuses (a damaged file, a ledger
			// that does not match) is a check result: in the JSON.
			path, perr := dbPath()
			if perr != nil {
				return perr // the configuration, not the database
			}
			problem := "open: " + err.Error()
			if ledger {
				problem = "ledger: " + err.Error()
			}
			return writeCheckJSON(checkJSON{DB: path, Problems: []string{problem}})
		}
		// A ledger the open refuses is a check result, not a usage error.
		if ledger {
			fmt.Printf("PROBLEM ledger: %v\n", err)
			return &cli.ExitError{Code: 1, Msg: "1 problem found"}
		}
		return err
	}
	defer d.Close()
	rep, err := d.Check(ctx)
	if err != nil {
		return err
	}
	if format.JSON() {
		problems := append([]string{}, rep.Problems...) // a list in JSON, even when empty
		return writeCheckJSON(checkJSON{DB: d.Path(), OK: rep.OK(), SchemaVersion: rep.SchemaVersion, Problems: problems})
	}
	for _, p := range rep.Problems {
		if _, err := fmt.Printf("PROBLEM %s\n", p); err != nil {
			return err
		}
	}
	if !rep.OK() {
		return &cli.ExitError{Code: 1, Msg: fmt.Sprintf("%d problem(s) found in %s", len(rep.Problems), d.Path())}
	}
	_, err = fmt.Printf("ok: %s passes integrity_check and foreign_key_check; ledger verified at version %d\n", d.Path(), rep.SchemaVersion)
	return err
}

func runDBBackup(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("db backup", "db backup [--config FILE] [--db PATH] [--force] [--format table|json] DEST", `
Write a consistent copy of the database to DEST (SQLite VACUUM INTO from one
read transaction: safe while the daemon writes). The copy is written to a
temporary file beside DEST and renamed, so DEST is never half written.
DEST must not exist unless --force is given, neither before the copy nor
when it is finished (a DEST written meanwhile is kept).`)
	force := fs.Bool("force", false, "replace DEST if it exists")
	format, pos, err := parseDBFlags(fs, args, 1, "one argument DEST")
	if err != nil {
		return err
	}
	dest := pos[0]
	if dest == "" {
		return cli.UsageError(fs, "DEST must not be empty")
	}
	// A DEST that is the database's own file is refused by the backup
	// itself (metadata.DB.Backup), --force or not.
	if fi, err := os.Stat(dest); err == nil && fi.IsDir() {
		// --force replaces a file; the rename cannot replace a directory.
		return &cli.ExitError{Code: 1, Msg: fmt.Sprintf("%s is a directory: give the path of the file to write", dest)}
	} else if err == nil && !*force {
		return &cli.ExitError{Code: 1, Msg: fmt.Sprintf("%s exists (use --force to replace it)", dest)}
	}
	d, err := openDB(ctx, true)
	if err != nil {
		return err
	}
	defer d.Close()
	// The check above fails fast; BackupNew keeps a DEST written while
	// the copy was being made.
	backup := d.BackupNew
	if *force {
		backup = d.Backup
	}
	if err := backup(ctx, dest); errors.Is(err, os.ErrExist) && !*force {
		return &cli.ExitError{Code: 1, Msg: fmt.Sprintf("%s exists (use --force to replace it)", dest)}
	} else if err != nil {
		return err
	}
	st, err := os.Stat(dest)
	if err != nil {
		return fmt.Errorf("backup written but not found: %w", err)
	}
	if format.JSON() {
		return cli.WriteJSON(os.Stdout, backupJSON{DB: d.Path(), Dest: dest, Bytes: st.Size()})
	}
	_, err = fmt.Printf("backed up %s to %s (%d bytes)\n", d.Path(), dest, st.Size())
	return err
}

// migrateJSON is what `db migrate --format json` prints.
type migrateJSON struct {
	DB   string `json:"db"`
	From int    `json:"from_version"`
	To   int    `json:"to_version"`
	// Applied lists the versions this run applied (empty: nothing to do).
	Applied []int `json:"applied"`
	// Backup is the copy written before migrating, if any.
	Backup string `json:"backup,omitempty"`
}

// checkJSON is what `db check --format json` prints.
type checkJSON struct {
	DB            string   `json:"db"`
	OK            bool     `json:"ok"`
	SchemaVersion int      `json:"schema_version,omitempty"`
	Problems      []string `json:"problems"`
}

// writeCheckJSON prints c and, when it has problems, makes the exit status
// 1 without a message: the problems are in the JSON.
func writeCheckJSON(c checkJSON) error {
	if err := cli.WriteJSON(os.Stdout, c); err != nil {
		return err
	}
	if !c.OK {
		return &cli.ExitError{Code: 1}
	}
	return nil
}

// backupJSON is what `db backup --format json` prints.
type backupJSON struct {
	DB    string `json:"db"`
	Dest  string `json:"dest"`
	Bytes int64  `json:"bytes"`
}
