package main

// `ls`: read-only listings of the metadata database (one writer, the daemon;
// any number of readers); `ls runs` is in ls_runs.go.

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/inventory"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

const lsDescription = `
List what the metadata database records. The database is opened read-only:
listing never writes and works while the daemon writes. Derived fields are
computed at read time: an image's overall state (unpacked, active,
failed; a pull under way is listed by ls runs until it records its
image), a device's reference count, a lock's age.

The words: an image is what pull made from an S3 key or prefix (listed by
its source); its layers are unpacked as chains (one thin device each, a
layer on top of its parent chain, shared by every image with the same
layers below it); its activation is its active snapshot; a lock is what a
running state-machine run holds.

Kinds, their --filter keys, and the id -q prints:
  images     image_id, s3_key, name, state, download_status,
             activation_status, device_name, locked (true|false);
             -q: the source (s3://...), a REF for rm and activate
  unpacked   image_id, device_id, device_name, verified (true|false),
             referenced (true|false); -q: the device name
  chains     chain_id, parent_chain_id, diff_id, device_id, used (true|false);
             -q: the full chain id
  snapshots  image_id, snapshot_id, snapshot_name, origin_device_id,
             active (true|false); -q: the snapshot name
  locks      image_id, locked_by; -q: the image id
  ` + lsRunsUsage + `

--filter KEY=VALUE may be repeated; a row is listed when it matches all of
them (exact match). For runs, filters may also be given as words after the
kind. -q prints each row's id, one a line with no header, for scripts
(ls images -q | xargs containerd-flyio-snapshotter rm).`

func init() {
	cli.Register(&cli.Command{Name: "ls", Summary: "list images, unpacked devices, chains, snapshots, locks or runs (read-only)", Run: runLs})
}

// filterFlag collects repeated --filter KEY=VALUE.
type filterFlag []string

func (f *filterFlag) String() string { return strings.Join(*f, ",") }

func (f *filterFlag) Set(v string) error {
	if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*f = append(*f, v)
	return nil
}

// lsColumn is one column of a listing: its header, its cell, and, when
// filterable, its filter key and the values that key accepts (nil: any).
type lsColumn[T any] struct {
	header string
	cell   func(T, time.Time) string
	key    string
	values []string
	value  func(T) string // filter value; cell is used when nil
	// match decides a filter on a column of several values (names); value
	// and cell are not used for filtering when it is set.
	match func(T, string) bool
}

// lsKind is one listable kind. id is what -q prints of a row: what names
// it to the other commands.
type lsKind[T any] struct {
	name    string
	list    func(context.Context, *metadata.DB, time.Time) ([]T, error)
	id      func(T) string
	columns []lsColumn[T]
}

// formatIDs is the output of ls -q: each row's id, one a line. -q sets it;
// --format does not accept it.
const formatIDs = "ids"

var boolValues = []string{"true", "false"}

func yesNo(b bool) string { return strconv.FormatBool(b) }

var lsImages = lsKind[inventory.Image]{
	name: "images",
	list: func(ctx context.Context, d *metadata.DB, _ time.Time) ([]inventory.Image, error) {
		return inventory.Images(ctx, d)
	},
	// The source, not the image id: it is a REF that rm and activate
	// take, and every image has exactly one (names may be none or many).
	id: func(v inventory.Image) string { return v.S3Key },
	columns: []lsColumn[inventory.Image]{
		{header: "IMAGE ID", key: "image_id", cell: func(v inventory.Image, _ time.Time) string { return v.ImageID }},
		{header: "S3 KEY", key: "s3_key", cell: func(v inventory.Image, _ time.Time) string { return v.S3Key }},
		{header: "NAMES", key: "name", cell: func(v inventory.Image, _ time.Time) string { return dash(strings.Join(v.Names, ",")) },
			match: func(v inventory.Image, want string) bool { return slices.Contains(v.Names, want) }},
		{header: "STATE", key: "state", values: []string{inventory.ImageStateUnpacked, inventory.ImageStateActive, inventory.ImageStateFailed},
			cell: func(v inventory.Image, _ time.Time) string { return v.State }},
		{header: "LAYERS", cell: func(v inventory.Image, _ time.Time) string { return strconv.Itoa(v.Layers) }},
		{header: "DOWNLOAD", key: "download_status", values: []string{inventory.DownloadCompleted, inventory.DownloadFailed},
			cell: func(v inventory.Image, _ time.Time) string { return v.DownloadStatus }},
		{header: "ACTIVATION", key: "activation_status", values: []string{inventory.ActivationInactive, inventory.ActivationActive, inventory.ActivationFailed},
			cell: func(v inventory.Image, _ time.Time) string { return dash(v.ActivationStatus) }, value: func(v inventory.Image) string { return v.ActivationStatus }},
		{header: "SIZE", cell: func(v inventory.Image, _ time.Time) string { return humanBytes(uint64(v.SizeBytes)) }},
		{header: "DEVICE", key: "device_name", cell: func(v inventory.Image, _ time.Time) string { return dash(v.DeviceName) },
			value: func(v inventory.Image) string { return v.DeviceName }},
		{header: "LOCKED BY", key: "locked", values: boolValues, cell: func(v inventory.Image, _ time.Time) string { return dash(v.LockedBy) },
			value: func(v inventory.Image) string { return yesNo(v.LockedBy != "") }},
		{header: "UPDATED", cell: func(v inventory.Image, now time.Time) string { return humanAge(now.Sub(v.UpdatedAt)) + " ago" }},
		{header: "REASON", cell: func(v inventory.Image, _ time.Time) string { return dash(shorten(oneLine(v.FailureReason), 60)) }},
		{header: "LAST USED", cell: func(v inventory.Image, now time.Time) string {
			if v.LastUsedAt.IsZero() {
				return "-"
			}
			return humanAge(now.Sub(v.LastUsedAt)) + " ago"
		}},
	},
}

var lsUnpacked = lsKind[inventory.UnpackedImage]{
	name: "unpacked",
	list: func(ctx context.Context, d *metadata.DB, _ time.Time) ([]inventory.UnpackedImage, error) {
		return inventory.UnpackedImages(ctx, d)
	},
	id: func(v inventory.UnpackedImage) string { return v.DeviceName },
	columns: []lsColumn[inventory.UnpackedImage]{
		{header: "IMAGE ID", key: "image_id", cell: func(v inventory.UnpackedImage, _ time.Time) string { return v.ImageID }},
		{header: "DEVICE ID", key: "device_id", cell: func(v inventory.UnpackedImage, _ time.Time) string { return v.DeviceID }},
		{header: "DEVICE NAME", key: "device_name", cell: func(v inventory.UnpackedImage, _ time.Time) string { return v.DeviceName }},
		{header: "SIZE", cell: func(v inventory.UnpackedImage, _ time.Time) string { return humanBytes(uint64(v.SizeBytes)) }},
		{header: "FILES", cell: func(v inventory.UnpackedImage, _ time.Time) string { return strconv.FormatInt(v.FileCount, 10) }},
		{header: "VERIFIED", key: "verified", values: boolValues, cell: func(v inventory.UnpackedImage, _ time.Time) string { return yesNo(v.LayoutVerified) }},
		{header: "REFS", key: "referenced", values: boolValues, cell: func(v inventory.UnpackedImage, _ time.Time) string {
			return fmt.Sprintf("%d (%d active)", v.RefCount, v.ActiveRefs)
		}, value: func(v inventory.UnpackedImage) string { return yesNo(v.RefCount > 0) }},
		{header: "UNPACKED", cell: func(v inventory.UnpackedImage, now time.Time) string { return humanAge(now.Sub(v.UnpackedAt)) + " ago" }},
	},
}

var lsChains = lsKind[inventory.Chain]{
	name: "chains",
	list: func(ctx context.Context, d *metadata.DB, _ time.Time) ([]inventory.Chain, error) {
		return inventory.Chains(ctx, d)
	},
	id: func(v inventory.Chain) string { return v.ChainID },
	columns: []lsColumn[inventory.Chain]{
		{header: "CHAIN ID", key: "chain_id", cell: func(v inventory.Chain, _ time.Time) string { return shortDigest(v.ChainID) },
			value: func(v inventory.Chain) string { return v.ChainID }},
		{header: "PARENT", key: "parent_chain_id", cell: func(v inventory.Chain, _ time.Time) string { return dash(shortDigest(v.Parent)) },
			value: func(v inventory.Chain) string { return v.Parent }},
		{header: "DIFF ID", key: "diff_id", cell: func(v inventory.Chain, _ time.Time) string { return shortDigest(v.DiffID) },
			value: func(v inventory.Chain) string { return v.DiffID }},
		{header: "DEVICE ID", key: "device_id", cell: func(v inventory.Chain, _ time.Time) string { return strconv.FormatUint(uint64(v.DeviceID), 10) }},
		{header: "DEVICE NAME", cell: func(v inventory.Chain, _ time.Time) string { return v.DeviceName }},
		{header: "SIZE", cell: func(v inventory.Chain, _ time.Time) string { return humanBytes(uint64(v.SizeBytes)) }},
		{header: "FILES", cell: func(v inventory.Chain, _ time.Time) string { return strconv.FormatInt(v.FileCount, 10) }},
		{header: "IMAGES", key: "used", values: boolValues, cell: func(v inventory.Chain, _ time.Time) string { return strconv.Itoa(v.Images) },
			value: func(v inventory.Chain) string { return yesNo(v.Images > 0) }},
		{header: "CHILDREN", cell: func(v inventory.Chain, _ time.Time) string { return strconv.Itoa(v.Children) }},
		{header: "UNPACKED", cell: func(v inventory.Chain, now time.Time) string { return humanAge(now.Sub(v.UnpackedAt)) + " ago" }},
	},
}

// shortDigest is "sha256:" and the first 12 hex digits of digest.
func shortDigest(digest string) string {
	if len(digest) > 19 {
		return digest[:19]
	}
	return digest
}

var lsSnapshots = lsKind[inventory.Snapshot]{
	name: "snapshots",
	list: func(ctx context.Context, d *metadata.DB, _ time.Time) ([]inventory.Snapshot, error) {
		return inventory.Snapshots(ctx, d)
	},
	id: func(v inventory.Snapshot) string { return v.SnapshotName },
	columns: []lsColumn[inventory.Snapshot]{
		{header: "SNAPSHOT ID", key: "snapshot_id", cell: func(v inventory.Snapshot, _ time.Time) string { return v.SnapshotID }},
		{header: "NAME", key: "snapshot_name", cell: func(v inventory.Snapshot, _ time.Time) string { return v.SnapshotName }},
		{header: "IMAGE ID", key: "image_id", cell: func(v inventory.Snapshot, _ time.Time) string { return v.ImageID }},
		{header: "ORIGIN DEVICE", key: "origin_device_id", cell: func(v inventory.Snapshot, _ time.Time) string {
			if v.OriginDeviceName == "" {
				return v.OriginDeviceID
			}
			return v.OriginDeviceID + " (" + v.OriginDeviceName + ")"
		}, value: func(v inventory.Snapshot) string { return v.OriginDeviceID }},
		{header: "ACTIVE", key: "active", values: boolValues, cell: func(v inventory.Snapshot, _ time.Time) string { return yesNo(v.Active) }},
		{header: "DEVICE PATH", cell: func(v inventory.Snapshot, _ time.Time) string { return v.DevicePath }},
		{header: "CREATED", cell: func(v inventory.Snapshot, now time.Time) string { return humanAge(now.Sub(v.CreatedAt)) + " ago" }},
	},
}

var lsLocks = lsKind[inventory.Lock]{
	name: "locks",
	list: func(ctx context.Context, d *metadata.DB, now time.Time) ([]inventory.Lock, error) {
		return inventory.Locks(ctx, d, now)
	},
	id: func(v inventory.Lock) string { return v.ImageID },
	columns: []lsColumn[inventory.Lock]{
		{header: "IMAGE ID", key: "image_id", cell: func(v inventory.Lock, _ time.Time) string { return v.ImageID }},
		{header: "LOCKED BY", key: "locked_by", cell: func(v inventory.Lock, _ time.Time) string { return v.LockedBy }},
		{header: "LOCKED AT", cell: func(v inventory.Lock, _ time.Time) string { return v.LockedAt.Format(time.RFC3339) }},
		{header: "AGE", cell: func(v inventory.Lock, _ time.Time) string { return humanAge(v.Age) }},
	},
}

// lsFilter is one parsed --filter.
type lsFilter struct{ key, value string }

// parseLsFilters checks every filter's key (and value, for enumerated keys)
// against the kind's columns; errors name the allowed keys or values.
func parseLsFilters[T any](k lsKind[T], filters []string) ([]lsFilter, error) {
	var allowed []string
	byKey := map[string]lsColumn[T]{}
	for _, c := range k.columns {
		if c.key != "" {
			allowed = append(allowed, c.key)
			byKey[c.key] = c
		}
	}
	sort.Strings(allowed)
	var out []lsFilter
	for _, f := range filters {
		key, val, _ := strings.Cut(f, "=")
		c, ok := byKey[key]
		if !ok {
			return nil, fmt.Errorf("ls %s: unknown filter key %q (allowed: %s)", k.name, key, strings.Join(allowed, ", "))
		}
		if c.values != nil && !contains(c.values, val) {
			return nil, fmt.Errorf("ls %s: filter %s=%q: value must be one of %s", k.name, key, val, strings.Join(c.values, ", "))
		}
		out = append(out, lsFilter{key, val})
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runLsKind lists kind k from d to w in format, keeping rows matching every
// filter.
func runLsKind[T any](ctx context.Context, w io.Writer, d *metadata.DB, k lsKind[T], format string, filters []lsFilter, now time.Time) error {
	rows, err := k.list(ctx, d, now)
	if err != nil {
		return fmt.Errorf("ls %s: %w", k.name, err)
	}
	cols := map[string]lsColumn[T]{}
	for _, c := range k.columns {
		if c.key != "" {
			cols[c.key] = c
		}
	}
	kept := make([]T, 0, len(rows))
	for _, r := range rows {
		match := true
		for _, f := range filters {
			c := cols[f.key]
			if c.match != nil {
				if !c.match(r, f.value) {
					match = false
					break
				}
				continue
			}
			v := ""
			if c.value != nil {
				v = c.value(r)
			} else {
				v = c.cell(r, now)
			}
			if v != f.value {
				match = false
				break
			}
		}
		if match {
			kept = append(kept, r)
		}
	}
	switch format {
	case cli.FormatJSON:
		return cli.WriteJSON(w, kept)
	case formatIDs:
		for _, r := range kept {
			if _, err := fmt.Fprintln(w, k.id(r)); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	hdr := make([]string, len(k.columns))
	for i, c := range k.columns {
		hdr[i] = c.header
	}
	fmt.Fprintln(tw, strings.Join(hdr, "\t"))
	for _, r := range kept {
		cells := make([]string, len(k.columns))
		for i, c := range k.columns {
			cells[i] = shown(c.cell(r, now))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// shown is a table cell as printed: the records hold text the daemon did
// not write (an S3 server's error message in a failure reason, a
// program's output in a run's last error), so control and format
// characters are escaped as validate escapes an archive's names (a tab
// too, which would shift the columns); printable text is unchanged.
func shown(s string) string { return tarball.Escape(s) }

// lsKindRunner runs one kind: filter validation first (a usage error), then
// the listing.
type lsKindRunner func(ctx context.Context, w io.Writer, d *metadata.DB, format string, filters []string) error

func kindRunner[T any](k lsKind[T]) (validate func([]string) error, run lsKindRunner) {
	validate = func(filters []string) error {
		_, err := parseLsFilters(k, filters)
		return err
	}
	run = func(ctx context.Context, w io.Writer, d *metadata.DB, format string, filters []string) error {
		fs, err := parseLsFilters(k, filters)
		if err != nil {
			return err
		}
		return runLsKind(ctx, w, d, k, format, fs, time.Now())
	}
	return validate, run
}

type lsEntry struct {
	validate func([]string) error
	run      lsKindRunner
}

func lsKinds() map[string]lsEntry {
	m := map[string]lsEntry{}
	add := func(name string, v func([]string) error, r lsKindRunner) { m[name] = lsEntry{v, r} }
	v, r := kindRunner(lsImages)
	add("images", v, r)
	v, r = kindRunner(lsUnpacked)
	add("unpacked", v, r)
	v, r = kindRunner(lsChains)
	add("chains", v, r)
	v, r = kindRunner(lsSnapshots)
	add("snapshots", v, r)
	v, r = kindRunner(lsLocks)
	add("locks", v, r)
	add("runs", lsRunsValidate, func(ctx context.Context, w io.Writer, d *metadata.DB, format string, filters []string) error {
		return lsRuns(ctx, d, w, format, filters)
	})
	return m
}

func runLs(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("ls", "ls images|unpacked|chains|snapshots|locks|runs [--filter KEY=VALUE]... [--format table|json | -q] [--config FILE] [--db PATH]", lsDescription)
	var filters filterFlag
	fs.Var(&filters, "filter", "keep rows whose `KEY=VALUE` matches (repeatable; keys per kind above)")
	format := cli.AddFormatFlag(fs, cli.DefaultFormatUsage)
	quiet := fs.Bool("q", false, "print only each row's id, one a line, without a header (ids per kind above)")
	cli.AddDBFlags(fs)
	// Flags may come before or after the kind: parse, take a positional
	// word, parse the rest again.
	var words []string
	rest := args
	for {
		if err := cli.ParseFlags(fs, rest); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		words = append(words, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	kinds := lsKinds()
	if len(words) == 0 {
		return cli.UsageError(fs, "name what to list: images, unpacked, chains, snapshots, locks or runs")
	}
	kind := words[0]
	k, ok := kinds[kind]
	if !ok {
		return cli.UsageError(fs, fmt.Sprintf("unknown kind %q (want images, unpacked, chains, snapshots, locks or runs)", kind))
	}
	all := append([]string(nil), filters...)
	if len(words) > 1 {
		if kind != "runs" {
			return cli.UsageError(fs, fmt.Sprintf("unexpected argument %q (filters go in --filter KEY=VALUE)", words[1]))
		}
		all = append(all, words[1:]...)
	}
	out := format.String()
	if *quiet {
		if format.JSON() {
			return cli.UsageError(fs, "-q and --format json contradict each other: choose one")
		}
		out = formatIDs
	}
	if k.validate != nil {
		if err := k.validate(all); err != nil {
			return cli.UsageError(fs, err.Error())
		}
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	d, err := metadata.Open(ctx, metadata.Options{Path: cfg.Metadata.Path, ReadOnly: true})
	if err != nil {
		return err
	}
	defer d.Close()
	if v, err := d.SchemaVersion(ctx); err != nil {
		return err
	} else if v < metadata.LatestVersion() {
		return fmt.Errorf("ls: database %s is at schema version %d; this binary lists version %d: run `containerd-flyio-snapshotter db migrate` (or start the daemon, which migrates)",
			cfg.Metadata.Path, v, metadata.LatestVersion())
	}
	return k.run(ctx, os.Stdout, d, out, all)
}
