package main

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

const poolDescription = `
Inspects the device-mapper thin pool named by the configuration's [pool]
section. The pool must be active (the daemon activates it); these commands
never create it.

Subcommands:
  status       data and metadata usage, block size and mode of the pool
  ls           every thin id of the pool next to the database's device records
  quarantine   review the thin ids start-up quarantined (ls, delete, release)
`

func init() {
	cli.Register(&cli.Command{Name: "pool", Summary: "inspect the thin pool (status, ls, quarantine)", Run: runPool})
}

func runPool(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("pool", "pool status|ls|quarantine [flags]", poolDescription)
	if len(args) == 0 {
		return cli.UsageError(fs, "name a subcommand: status, ls or quarantine")
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return nil
	case "status":
		return runPoolStatus(ctx, args[1:])
	case "ls":
		return runPoolLs(ctx, args[1:])
	case "quarantine":
		return runPoolQuarantine(ctx, args[1:])
	default:
		return cli.UsageError(fs, fmt.Sprintf("unknown pool subcommand %q (want status, ls or quarantine)", args[0]))
	}
}

// parsePoolFlags parses a pool subcommand's flags, which take no
// positional arguments.
func parsePoolFlags(fs *flag.FlagSet, args []string) error {
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageError(fs, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	return nil
}

// openActivePool opens the configured pool only if the kernel already has
// it active, changing nothing: thinpool.Open would create a missing pool,
// or load and resume a table into a device of that name that has none
// live. sysfs answers first, so that a host without device-mapper (or
// without the permission to use it) hears that the pool is not active.
func openActivePool(ctx context.Context, cfg *plugin.Config) (*thinpool.Pool, error) {
	notActive := func(err error) error {
		return fmt.Errorf("pool %q is not active (start the daemon to create or reattach it; pool files are kept in %s): %w", cfg.Pool.Name, cfg.Pool.RootDir, err)
	}
	active, err := dmDeviceExists(cfg.Pool.Name)
	if err != nil {
		return nil, err
	}
	if !active {
		return nil, notActive(fmt.Errorf("no device-mapper device of that name: %w", thinpool.ErrNotActive))
	}
	p, err := thinpool.OpenActive(ctx, cfg.ThinpoolConfig())
	if errors.Is(err, thinpool.ErrNotActive) {
		return nil, notActive(err)
	}
	return p, err
}

// dmDeviceExists reports whether a device-mapper device called name exists,
// from /sys/block/dm-*/dm/name.
func dmDeviceExists(name string) (bool, error) {
	paths, err := filepath.Glob("/sys/block/dm-*/dm/name")
	if err != nil {
		return false, err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed while listing
		}
		if err != nil {
			return false, fmt.Errorf("look for device-mapper device %q: %w", name, err)
		}
		if strings.TrimSpace(string(b)) == name {
			return true, nil
		}
	}
	return false, nil
}

// poolStatusView is what `pool status` prints.
type poolStatusView struct {
	Pool               string `json:"pool"`
	Mode               string `json:"mode"`
	BlockSizeBytes     uint64 `json:"block_size_bytes"`
	DataUsedBytes      uint64 `json:"data_used_bytes"`
	DataTotalBytes     uint64 `json:"data_total_bytes"`
	MetadataUsedBytes  uint64 `json:"metadata_used_bytes"`
	MetadataTotalBytes uint64 `json:"metadata_total_bytes"`
	TransactionID      uint64 `json:"transaction_id"`
	NeedsCheck         bool   `json:"needs_check"`
	LowWaterBlocks     uint64 `json:"low_water_blocks"`
	// The reserve (pool.min_free_space): new devices are refused while
	// the free data or metadata is under it (UnderReserve).
	ReservePercent       float64 `json:"reserve_percent"`
	ReserveDataBytes     uint64  `json:"reserve_data_bytes"`
	ReserveMetadataBytes uint64  `json:"reserve_metadata_bytes"`
	UnderReserve         bool    `json:"under_reserve"`
	// What a write needing a new block does when the pool is out of data
	// space: waits (QueueIfNoSpace) or fails (ErrorIfNoSpace; also once
	// the no-space timeout has expired); and what it does now.
	QueueIfNoSpace bool `json:"queue_if_no_space"`
	ErrorIfNoSpace bool `json:"error_if_no_space"`
	WritesQueued   bool `json:"writes_queued"`
	WritesFailing  bool `json:"writes_failing"`
	// NoSpaceTimeoutSeconds is the kernel's no_space_timeout, when it
	// could be read.
	NoSpaceTimeoutSeconds *int64 `json:"no_space_timeout_seconds,omitempty"`
	// The filesystem under a loop-file pool (absent for block devices).
	BackingFSFreeBytes    uint64 `json:"backing_fs_free_bytes,omitempty"`
	LoopFilesVirtualBytes uint64 `json:"loop_files_virtual_bytes,omitempty"`
}

// newPoolStatusView is the view of pool status st with a reserve of
// reserve percent.
func newPoolStatusView(name string, st thinpool.PoolStatus, reserve float64) poolStatusView {
	block := uint64(st.BlockSizeSectors) * 512
	reserveData, reserveMeta := st.ReserveBytes(reserve)
	return poolStatusView{
		Pool: name, Mode: string(st.Mode), BlockSizeBytes: block,
		DataUsedBytes: st.UsedDataBlocks * block, DataTotalBytes: st.TotalDataBlocks * block,
		MetadataUsedBytes: st.UsedMetadataBlocks * 4096, MetadataTotalBytes: st.TotalMetadataBlocks * 4096,
		TransactionID: st.TransactionID, NeedsCheck: st.NeedsCheck,
		ReservePercent:       reserve,
		ReserveDataBytes:     reserveData,
		ReserveMetadataBytes: reserveMeta,
		UnderReserve:         st.ReserveError(reserve, "") != nil,
		QueueIfNoSpace:       st.QueueIfNoSpace, ErrorIfNoSpace: st.ErrorIfNoSpace,
		WritesQueued: st.WritesQueued(), WritesFailing: st.WritesFailing(),
	}
}

func runPoolStatus(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("pool status", "pool status [--config FILE] [--format table|json]",
		"Prints the thin pool's mode (ro when the metadata is full or needs_check is set), block size, data and metadata space used and total, as the kernel reports them, its low-water mark, its reserve (pool.min_free_space) and whether new devices are refused for it, what writes do on a full pool (wait for the no-space timeout, or fail) and what they do now, and for loop files the free space of their filesystem.")
	cli.AddConfigFlags(fs)
	format := cli.AddFormatFlag(fs, cli.DefaultFormatUsage)
	if err := parsePoolFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	pool, err := openActivePool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := pool.Status(ctx)
	if err != nil {
		return err
	}
	v := newPoolStatusView(pool.Name(), st, pool.MinFreePercent())
	if v.LowWaterBlocks, err = pool.LowWaterBlocks(ctx); err != nil {
		return err
	}
	if t, err := thinpool.NoSpaceTimeout(); err == nil {
		secs := int64(t / time.Second)
		v.NoSpaceTimeoutSeconds = &secs
	}
	b, err := pool.Backing(ctx)
	if err != nil {
		return err
	}
	v.BackingFSFreeBytes, v.LoopFilesVirtualBytes = b.FSFree, b.Virtual
	if format.JSON() {
		return cli.WriteJSON(os.Stdout, v)
	}
	return writePoolStatusTable(os.Stdout, v, b.Loop)
}

// writePoolStatusTable writes v as `pool status` does without --format
// json; loop says whether the pool is on loop files.
func writePoolStatusTable(w io.Writer, v poolStatusView, loop bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pool\t%s\n", v.Pool)
	fmt.Fprintf(tw, "mode\t%s\n", v.Mode)
	fmt.Fprintf(tw, "block size\t%s\n", plugin.Size(v.BlockSizeBytes))
	fmt.Fprintf(tw, "data\t%s\n", spaceUsage(v.DataUsedBytes, v.DataTotalBytes))
	fmt.Fprintf(tw, "metadata\t%s\n", spaceUsage(v.MetadataUsedBytes, v.MetadataTotalBytes))
	fmt.Fprintf(tw, "transaction id\t%d\n", v.TransactionID)
	fmt.Fprintf(tw, "needs check\t%v\n", v.NeedsCheck)
	fmt.Fprintf(tw, "low-water mark\t%d blocks\n", v.LowWaterBlocks)
	refused := "no"
	if v.UnderReserve {
		refused = "yes, new devices are refused"
	}
	fmt.Fprintf(tw, "reserve\t%v%%: %s of data, %s of metadata; under it: %s\n",
		v.ReservePercent, humanBytes(v.ReserveDataBytes), humanBytes(v.ReserveMetadataBytes), refused)
	fmt.Fprintf(tw, "writes on a full pool\t%s\n", noSpacePolicy(v))
	fmt.Fprintf(tw, "writes now\t%s\n", writesNow(v))
	if loop {
		fmt.Fprintf(tw, "loop files\t%s virtual, %s free on their filesystem\n", humanBytes(v.LoopFilesVirtualBytes), humanBytes(v.BackingFSFreeBytes))
	}
	return tw.Flush()
}

// noSpacePolicy says what a write needing a new block does on a pool out
// of data space.
func noSpacePolicy(v poolStatusView) string {
	timeout := "the kernel's no-space timeout"
	if v.NoSpaceTimeoutSeconds != nil {
		timeout = fmt.Sprintf("%ds (the kernel's no_space_timeout)", *v.NoSpaceTimeoutSeconds)
	}
	switch {
	case v.QueueIfNoSpace:
		return "wait up to " + timeout + " for space, then fail (queue_if_no_space)"
	case v.ErrorIfNoSpace && !v.WritesFailing:
		return "fail at once (error_if_no_space)"
	case v.ErrorIfNoSpace:
		return "fail (error_if_no_space, or the no-space timeout expired)"
	}
	return "unknown (the kernel does not say)"
}

// writesNow says what a write needing a new block meets now.
func writesNow(v poolStatusView) string {
	switch {
	case v.WritesQueued:
		return "QUEUED: the pool is out of data space; writes needing a new block wait for space"
	case v.WritesFailing:
		return "FAILING: the pool is out of data space; writes needing a new block fail"
	}
	return "served"
}

// spaceUsage formats used/total with a percentage.
func spaceUsage(used, total uint64) string {
	pct := 0.0
	if total > 0 {
		pct = 100 * float64(used) / float64(total)
	}
	return fmt.Sprintf("%s / %s (%.1f%%)", humanBytes(used), humanBytes(total), pct)
}

// humanBytes writes n with a binary unit and one decimal.
func humanBytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// thinRow is one thin id of `pool ls`: what the pool and the database each
// say about it.
type thinRow struct {
	ID     uint32 `json:"id"`
	InPool bool   `json:"in_pool"`
	// Active is the dm name of the active device mapping it, if any.
	Active string `json:"active,omitempty"`
	// Name, Role and State come from the database's device record.
	Name  string `json:"name,omitempty"`
	Role  string `json:"role,omitempty"`
	State string `json:"state,omitempty"`
	// Intent is the pending device intent for this id, if any.
	Intent string `json:"intent,omitempty"`
	// Quarantined is the reason the id is quarantined, if it is.
	Quarantined string `json:"quarantined,omitempty"`
	// Problem says why pool and database disagree; empty when they agree.
	Problem string `json:"problem,omitempty"`
}

func runPoolLs(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("pool ls", "pool ls [--config FILE] [--db PATH] [--format table|json] [--check]", `
Lists every thin id in the pool's metadata next to the database's record of
it (device name, role, state, pending intent, quarantine) and the active
device-mapper device mapping it, and flags each disagreement: an id in the
pool that the database does not explain, or a device record whose id is not
in the pool. The database is read before and after the pool, and what
only the daemon's work in progress between the reads makes differ (a device
being created or deleted) is not flagged. The database is opened read-only.`)
	cli.AddDBFlags(fs)
	format := cli.AddFormatFlag(fs, cli.DefaultFormatUsage)
	check := fs.Bool("check", false, "exit with status 1 when pool and database disagree")
	if err := parsePoolFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	db, err := metadata.Open(ctx, cfg.MetadataOptions(true))
	if err != nil {
		return err
	}
	defer db.Close()
	pool, err := openActivePool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := poolRows(ctx, pool, db)
	if err != nil {
		return err
	}
	if format.JSON() {
		if err := cli.WriteJSON(os.Stdout, rows); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tIN POOL\tACTIVE\tNAME\tROLE\tSTATE\tNOTE")
		for _, r := range rows {
			var notes []string
			for _, n := range []string{r.Problem, prefixed("intent ", r.Intent), prefixed("quarantined: ", r.Quarantined)} {
				if n != "" {
					notes = append(notes, n)
				}
			}
			fmt.Fprintf(tw, "%d\t%v\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.InPool, dash(r.Active), dash(r.Name), dash(r.Role), dash(r.State), strings.Join(notes, "; "))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if *check {
		for _, r := range rows {
			if r.Problem != "" {
				return &cli.ExitError{Code: 1, Msg: fmt.Sprintf("pool %s and database %s disagree (first: thin id %d: %s)", pool.Name(), cfg.Metadata.Path, r.ID, r.Problem)}
			}
		}
	}
	return nil
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// poolLister is what poolRows reads of the pool (*thinpool.Pool).
type poolLister interface {
	ThinIDs(ctx context.Context) ([]uint32, error)
	ActiveDevices(ctx context.Context) ([]thinpool.ActiveDevice, error)
}

// poolRecords is what the database says of the pool's thin ids, as one
// read transaction saw it.
type poolRecords struct {
	devs        []snapshotter.ThinDevice
	intents     []snapshotter.DeviceIntent
	quarantined []snapshotter.QuarantinedID
}

// readPoolRecords reads the device records, intents and quarantined ids in
// one read transaction: read one after the other, they could straddle a
// commit of the daemon that moves an id from an intent to a record.
func readPoolRecords(ctx context.Context, db *metadata.DB) (poolRecords, error) {
	var r poolRecords
	err := db.ReadSnapshot(ctx, func(q metadata.Querier) error {
		recs := snapshotter.ReadRecordsIn(q)
		var err error
		if r.devs, err = recs.ThinDevices(ctx, ""); err != nil {
			return err
		}
		if r.intents, err = recs.Intents(ctx); err != nil {
			return err
		}
		r.quarantined, err = recs.QuarantinedIDs(ctx)
		return err
	})
	if err != nil {
		return poolRecords{}, fmt.Errorf("read the device records of %s: %w", db.Path(), err)
	}
	return r, nil
}

// poolRows merges the pool's thin ids, its active devices and the
// database's device records, intents and quarantined ids into one row per
// id, in id order.
//
// The daemon may be working meanwhile: it records an intent before it
// creates a device and the device's record after, and it deletes a device
// from the pool before it drops the device's record. So the database is
// read before and after the pool, and a disagreement is reported only when
// the pool disagrees with both reads alike: what the daemon committed
// between them explains the pool in one of them. The rows show the second
// read.
func poolRows(ctx context.Context, pool poolLister, db *metadata.DB) ([]thinRow, error) {
	before, err := readPoolRecords(ctx, db)
	if err != nil {
		return nil, err
	}
	ids, err := pool.ThinIDs(ctx)
	if err != nil {
		return nil, err
	}
	active, err := pool.ActiveDevices(ctx)
	if err != nil {
		return nil, err
	}
	after, err := readPoolRecords(ctx, db)
	if err != nil {
		return nil, err
	}
	rows := mergePoolRows(ids, active, after)
	earlier := map[uint32]string{}
	for _, r := range mergePoolRows(ids, active, before) {
		earlier[r.ID] = r.Problem
	}
	for i := range rows {
		if rows[i].Problem != earlier[rows[i].ID] {
			rows[i].Problem = ""
		}
	}
	return rows, nil
}

// mergePoolRows is poolRows for one read of the database.
func mergePoolRows(ids []uint32, active []thinpool.ActiveDevice, recs poolRecords) []thinRow {
	byID := map[uint32]*thinRow{}
	row := func(id uint32) *thinRow {
		if r, ok := byID[id]; ok {
			return r
		}
		r := &thinRow{ID: id}
		byID[id] = r
		return r
	}
	for _, id := range ids {
		row(id).InPool = true
	}
	for _, a := range active {
		r := row(a.ThinID)
		r.Active = strings.TrimPrefix(strings.Join([]string{r.Active, a.Name}, ","), ",")
	}
	for _, d := range recs.devs {
		r := row(d.ID)
		r.Name, r.Role, r.State = d.Name, d.Role, d.State
	}
	for _, in := range recs.intents {
		row(in.DeviceID).Intent = in.Op
	}
	deletedQuarantine := map[uint32]bool{}
	for _, qi := range recs.quarantined {
		row(qi.DeviceID).Quarantined = qi.Reason
		deletedQuarantine[qi.DeviceID] = qi.Deleted
	}
	out := make([]thinRow, 0, len(byID))
	for _, r := range byID {
		switch {
		case r.InPool && r.State == "" && r.Intent == "" && r.Quarantined == "":
			r.Problem = "in the pool but not in the database"
		case !r.InPool && r.State != "":
			r.Problem = "recorded in the database but missing from the pool"
		case !r.InPool && r.Quarantined != "" && !deletedQuarantine[r.ID]:
			r.Problem = "quarantined as kept but missing from the pool"
		case r.InPool && r.State == "" && r.Quarantined != "" && deletedQuarantine[r.ID]:
			r.Problem = "quarantined as deleted but still in the pool"
		}
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
