package main

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

const quarantineDescription = `
Reviews the thin ids start-up quarantined: devices in the pool that no record
or intent explained (never touched, their ids never reused), and devices a
rollback could not delete.

Subcommands:
  ls                 every quarantined id: whether the pool still holds it,
                     whether it was deleted, since when, and why
  delete ID...       delete each id's device from the pool (and any
                     device-mapper device mapping it); the id stays
                     quarantined, recorded as deleted
  release ID...      forget each id's quarantine, so a new device may use
                     it; refused while the pool still holds the id

Ids a device record or an intent owns are the daemon's and are refused.
delete and release need the pool active (the daemon activates it).
`

func runPoolQuarantine(ctx context.Context, args []string) error {
	const synopsis = "pool quarantine ls|delete|release [flags] [ID...]"
	fs := cli.NewFlagSet("pool quarantine", synopsis, quarantineDescription)
	if len(args) == 0 {
		return cli.UsageError(fs, "name a subcommand: ls, delete or release")
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return nil
	case "ls":
		return runQuarantineLs(ctx, args[1:])
	case "delete":
		return runQuarantineChange(ctx, "delete", args[1:], snapshotter.DeleteQuarantined)
	case "release":
		return runQuarantineChange(ctx, "release", args[1:], snapshotter.ReleaseQuarantined)
	default:
		return cli.UsageError(fs, fmt.Sprintf("unknown pool quarantine subcommand %q (want ls, delete or release)", args[0]))
	}
}

// quarantineView is one row of `pool quarantine ls`.
type quarantineView struct {
	ThinID uint32 `json:"thin_id"`
	// InPool is "yes", "no", or "unknown" when the pool is not active.
	InPool  string    `json:"in_pool"`
	Deleted bool      `json:"deleted"`
	Since   time.Time `json:"since"`
	Reason  string    `json:"reason"`
}

func runQuarantineLs(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("pool quarantine ls", "pool quarantine ls [--config FILE] [--db PATH] [--format table|json]", `
Lists every quarantined thin id with whether the pool still holds it
("unknown" when the pool is not active), whether its device was deleted,
since when it is quarantined and why. The database is opened read-only.`)
	cli.AddDBFlags(fs)
	format := cli.AddFormatFlag(fs, cli.DefaultFormatUsage)
	if err := parsePoolFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	db, err := openDB(ctx, true)
	if err != nil {
		return err
	}
	defer db.Close()
	var pool snapshotter.DevicePool // nil: the pool is not active
	switch p, err := openActivePool(ctx, cfg); {
	case errors.Is(err, thinpool.ErrNotActive):
	case err != nil:
		return err
	default:
		defer p.Close()
		pool = p
	}
	qs, err := snapshotter.ListQuarantine(ctx, db, pool)
	if err != nil {
		return err
	}
	rows := make([]quarantineView, 0, len(qs))
	for _, q := range qs {
		in := "unknown"
		if q.PoolChecked {
			in = map[bool]string{true: "yes", false: "no"}[q.InPool]
		}
		rows = append(rows, quarantineView{ThinID: q.DeviceID, InPool: in, Deleted: q.Deleted, Since: time.Unix(0, q.QuarantinedNs).UTC(), Reason: q.Reason})
	}
	if format.JSON() {
		return cli.WriteJSON(os.Stdout, rows)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tIN POOL\tDELETED\tSINCE\tREASON")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%v\t%s\t%s\n", r.ThinID, r.InPool, r.Deleted, r.Since.Format(time.RFC3339), r.Reason)
	}
	return tw.Flush()
}

// runQuarantineChange parses the ids of `pool quarantine delete|release`
// and applies change to each, on the active pool and the database opened
// read-write; it goes on past an id it cannot change and fails at the end.
func runQuarantineChange(ctx context.Context, verb string, args []string,
	change func(context.Context, *metadata.DB, snapshotter.DevicePool, uint32) error) error {
	fs := cli.NewFlagSet("pool quarantine "+verb, "pool quarantine "+verb+" [--config FILE] [--db PATH] [--format table|json] ID...", map[string]string{
		"delete": `
Deletes the device of each quarantined thin id from the pool, after
removing any device-mapper device mapping it; the id stays quarantined,
recorded as deleted, until released.`,
		"release": `
Forgets the quarantine of each thin id, so that a new device may use it.
An id the pool still holds is refused: delete it first.`,
	}[verb]+`

Prints a line per id changed, and the reason for each id not changed on
stderr; with --format json, a JSON list with an object per id: thin_id,
ok, and the error when not ok (nothing on stderr). Exit status 1 when an
id was not changed.`)
	cli.AddDBFlags(fs)
	format := cli.AddFormatFlag(fs, cli.DefaultFormatUsage)
	pos, err := cli.ParseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return cli.UsageError(fs, "name at least one quarantined thin id (pool quarantine ls lists them)")
	}
	var ids []uint32
	for _, a := range pos {
		id, err := strconv.ParseUint(a, 10, 32)
		if err != nil || id == 0 || id > thinpool.MaxThinID {
			return cli.UsageError(fs, fmt.Sprintf("thin id %q: must be a number from 1 to %d", a, thinpool.MaxThinID))
		}
		ids = append(ids, uint32(id))
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	db, err := openRecordsToChange(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	pool, err := openActivePool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	failed := 0
	results := make([]quarantineChangeJSON, 0, len(ids))
	for _, id := range ids {
		err := change(ctx, db, pool, id)
		results = append(results, quarantineChangeJSON{ThinID: id, OK: err == nil})
		if err != nil {
			failed++
			results[len(results)-1].Error = err.Error()
			if !format.JSON() {
				fmt.Fprintf(os.Stderr, "%s: %v\n", verb, err)
			}
			continue
		}
		if !format.JSON() {
			fmt.Printf("%s %d\n", map[string]string{"delete": "deleted", "release": "released"}[verb], id)
		}
	}
	if format.JSON() {
		if err := cli.WriteJSON(os.Stdout, results); err != nil {
			return err
		}
		if failed > 0 {
			return &cli.ExitError{Code: 1}
		}
		return nil
	}
	if failed > 0 {
		return &cli.ExitError{Code: 1, Msg: fmt.Sprintf("pool quarantine %s: %d of %d ids not changed", verb, failed, len(ids))}
	}
	return nil
}

// quarantineChangeJSON is one id of `pool quarantine delete|release
// --format json`.
type quarantineChangeJSON struct {
	ThinID uint32 `json:"thin_id"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
}
