package main

// The CLI's conventions across subcommands: one --format vocabulary, JSON
// output that parses, ls -q, and the deprecated spellings still working.

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"archive/tar"
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/inventory"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// formatCommands are the words of every subcommand that prints a result:
// each takes --format table|json.
var formatCommands = [][]string{
	{"version"}, {"validate"}, {"pull"}, {"rm"}, {"activate"},
	{"ls"}, {"pool", "status"}, {"pool", "ls"},
	{"pool", "quarantine", "ls"}, {"pool", "quarantine", "delete"}, {"pool", "quarantine", "release"},
	{"db", "migrate"}, {"db", "check"}, {"db", "backup"},
}

// TestFormatFlagEverywhere: every subcommand that prints a result offers
// --format with the same two values, and refuses another value with a
// usage error naming the flag and the values allowed.
func TestFormatFlagEverywhere(t *testing.T) {
	listed := map[string]bool{"serve": true} // serve prints no result
	for _, words := range formatCommands {
		listed[words[0]] = true
		code, out, _ := runCommand(t, nil, append(words, "--help")...)
		if code != 0 || !strings.Contains(out, "\n  --format FORMAT\n") || !strings.Contains(out, "table") || !strings.Contains(out, "json") {
			t.Errorf("%v --help = %d; want --format FORMAT with table and json:\n%s", words, code, out)
		}
		code, out, errOut := runCommand(t, nil, append(words, "--format", "yaml")...)
		want := `invalid value "yaml" for flag --format: must be table or json, got "yaml"`
		if code != 2 || out != "" || !strings.Contains(errOut, want) {
			t.Errorf("%v --format yaml = %d, %q, %q; want 2 and %q", words, code, out, errOut, want)
		}
	}
	for _, name := range cli.Names() {
		if !listed[name] {
			t.Errorf("subcommand %q is not in formatCommands: does it print a result without --format?", name)
		}
	}
}

// TestDeprecatedSpellings: pull's --format text and --socket on the
// commands that talk to the daemon still work for a release, with a
// warning on stderr naming the new spelling; text is not accepted where it
// never was.
func TestDeprecatedSpellings(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "none.sock")
	for _, c := range []struct {
		args []string
		warn string
	}{
		{[]string{"pull", "--control-socket", socket, "--format", "text", "s3://bkt/a.tar"}, "--format text is deprecated"},
		{[]string{"pull", "--socket", socket, "s3://bkt/a.tar"}, "--socket is deprecated"},
		{[]string{"rm", "--socket", socket, "app"}, "--socket is deprecated"},
		{[]string{"activate", "--socket", socket, "app"}, "--socket is deprecated"},
		{[]string{"activate", "--control-socket", socket, "app"}, ""},
	} {
		// Exit 1 naming the socket: the old spelling reached the daemon's
		// (missing) socket, as the new one does.
		code, out, errOut := runCommand(t, nil, c.args...)
		if code != 1 || out != "" || !strings.Contains(errOut, socket) {
			t.Errorf("%v = %d, %q, %q; want 1 naming %s", c.args, code, out, errOut, socket)
		}
		if c.warn == "" {
			if strings.Contains(errOut, "deprecated") {
				t.Errorf("%v warns: %q", c.args, errOut)
			}
			continue
		}
		if !strings.Contains(errOut, "warning: "+c.warn+" and will be removed in the next release") {
			t.Errorf("%v: stderr %q lacks the warning %q", c.args, errOut, c.warn)
		}
	}
	if code, _, errOut := runCommand(t, nil, "ls", "images", "--format", "text"); code != 2 || !strings.Contains(errOut, "must be table or json") {
		t.Errorf("ls --format text = %d, %q; want 2: only pull ever took text", code, errOut)
	}
	// serve's --socket is daemon.socket, documented as such.
	_, out, _ := runCommand(t, nil, "serve", "--help")
	if !strings.Contains(out, "overriding daemon.socket") || !strings.Contains(out, "--control-socket PATH") {
		t.Errorf("serve --help does not tell --socket (daemon.socket) from --control-socket:\n%s", out)
	}
}

// TestLsQuiet: ls -q prints each listed row's id, one a line, no header,
// for every kind, and keeps the filters.
func TestLsQuiet(t *testing.T) {
	path := populatedDB(t)
	quiet := func(args ...string) []string {
		t.Helper()
		code, out, errOut := runCommand(t, nil, append(append([]string{"ls"}, args...), "-q", "--db", path)...)
		if code != 0 || errOut != "" {
			t.Fatalf("ls %v -q = %d, %q, %q", args, code, out, errOut)
		}
		if out == "" {
			return nil
		}
		return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	}
	ids := func(kind string, id func(map[string]any) string, filters ...string) []string {
		t.Helper()
		var out []string
		for _, row := range lsJSON[map[string]any](t, append([]string{kind, "--db", path, "--format", "json"}, filters...)...) {
			out = append(out, id(row))
		}
		return out
	}
	field := func(name string) func(map[string]any) string {
		return func(row map[string]any) string { s, _ := row[name].(string); return s }
	}
	for _, c := range []struct {
		kind    string
		id      func(map[string]any) string
		filters []string
	}{
		{"images", field("s3_key"), nil},
		{"images", field("s3_key"), []string{"--filter", "state=active"}},
		{"unpacked", field("device_name"), nil},
		{"chains", field("chain_id"), nil},
		{"snapshots", field("snapshot_name"), nil},
		{"locks", field("image_id"), nil},
		{"runs", field("run_id"), nil},
	} {
		got := quiet(append([]string{c.kind}, c.filters...)...)
		want := ids(c.kind, c.id, c.filters...)
		if len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("ls %s %v -q = %q; want the ids of the JSON listing, in order: %q", c.kind, c.filters, got, want)
		}
	}
	// The images' ids are what rm and activate take: their sources.
	for _, id := range quiet("images") {
		if !strings.HasPrefix(id, "s3://") {
			t.Errorf("ls images -q printed %q, not an s3:// source", id)
		}
	}
	if got := quiet("images", "--filter", "name=no-such-name"); got != nil {
		t.Errorf("ls images -q with no match = %q, want nothing (no header)", got)
	}
}

// decodeJSON runs the CLI with args, wants exit status code and one JSON
// document on stdout, decoded into v, and returns stderr.
func decodeJSON(t *testing.T, code int, v any, args ...string) string {
	t.Helper()
	got, out, errOut := runCommand(t, nil, args...)
	if got != code {
		t.Fatalf("%v = %d, %q, %q; want %d", args, got, out, errOut, code)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%v: stdout is not the JSON expected: %v: %q", args, err, out)
	}
	if dec.More() {
		t.Fatalf("%v: more than one JSON document: %q", args, out)
	}
	return errOut
}

func TestVersionJSON(t *testing.T) {
	var v cli.BuildInfo
	decodeJSON(t, 0, &v, "version", "--format", "json")
	want := cli.BuildInfo{Version: cli.Version, Commit: cli.Commit, GoVersion: runtime.Version(),
		SQLiteVersion: metadata.SQLiteVersion(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if v != want || v.SQLiteVersion == "" {
		t.Errorf("version --format json = %+v, want %+v", v, want)
	}
}

// TestValidateJSON: an accepted tarball's report and a rejected one's
// reason, each one JSON object on stdout with the exit status of the table
// output.
func TestValidateJSON(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tar")
	writeTar(t, good,
		&tar.Header{Typeflag: tar.TypeDir, Name: "rootfs/", Mode: 0o755},
		&tar.Header{Typeflag: tar.TypeReg, Name: "rootfs/hostname", Mode: 0o644, Size: 5},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "rootfs/vi", Linkname: "/usr/bin/vim", Mode: 0o777},
	)
	var ok validateJSON
	decodeJSON(t, 0, &ok, "validate", "--format", "json", good)
	_, table, _ := runCommand(t, nil, "validate", good)
	if !ok.Accepted || ok.File != good || ok.ValidateReport == nil || ok.Entries != 3 || ok.Files != 1 || ok.Dirs != 1 ||
		ok.Symlinks != 1 || ok.FileBytes != 5 || !ok.HasRootfs || ok.Compression != "plain" || ok.Rejection != "" ||
		!strings.HasSuffix(table, "diff ID "+ok.DiffID+"\n") {
		t.Errorf("validate --format json = %+v (report %+v); the table says %q", ok, ok.ValidateReport, table)
	}
	bad := filepath.Join(dir, "bad.tar")
	writeTar(t, bad, &tar.Header{Typeflag: tar.TypeReg, Name: "../escape", Mode: 0o644, Size: 1})
	var rej validateJSON
	if errOut := decodeJSON(t, 1, &rej, "validate", "--format", "json", bad); errOut != "" {
		t.Errorf("validate --format json of a rejected tarball: stderr %q; want the reason in the JSON only", errOut)
	}
	if rej.Accepted || rej.File != bad || !strings.Contains(rej.Rejection, `"../escape"`) || rej.ValidateReport != nil {
		t.Errorf("validate --format json of a rejected tarball = %+v", rej)
	}
}

// TestDBJSON: db migrate, check and backup each print one JSON object
// saying what they did.
func TestDBJSON(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.db")
	var m migrateJSON
	decodeJSON(t, 0, &m, "db", "migrate", "--db", path, "--format", "json", "--to", "3")
	if m.DB != path || m.From != 0 || m.To != 3 || !slices.Equal(m.Applied, []int{1, 2, 3}) || m.Backup != "" {
		t.Errorf("db migrate --to 3 (new database) = %+v", m)
	}
	decodeJSON(t, 0, &m, "db", "migrate", "--db", path, "--format", "json")
	latest := metadata.LatestVersion()
	if m.From != 3 || m.To != latest || len(m.Applied) != latest-3 || m.Backup != path+".pre-v4" {
		t.Errorf("db migrate from 3 = %+v, want 3 to %d with a .pre-v4 copy", m, latest)
	}
	decodeJSON(t, 0, &m, "db", "migrate", "--db", path, "--format", "json")
	if m.From != latest || m.To != latest || m.Applied == nil || len(m.Applied) != 0 {
		t.Errorf("db migrate (nothing to do) = %+v, want applied [] at %d", m, latest)
	}

	var c checkJSON
	decodeJSON(t, 0, &c, "db", "check", "--db", path, "--format", "json")
	if !c.OK || c.DB != path || c.SchemaVersion != latest || c.Problems == nil || len(c.Problems) != 0 {
		t.Errorf("db check (healthy) = %+v", c)
	}
	rawSQL(t, path, `INSERT INTO image_names (name, image_id, registered_ns) VALUES ('ghost:1', 'ghost', 1)`)
	if errOut := decodeJSON(t, 1, &c, "db", "check", "--db", path, "--format", "json"); errOut != "" {
		t.Errorf("db check --format json with a problem: stderr %q; want the problems in the JSON only", errOut)
	}
	if c.OK || len(c.Problems) != 1 || !strings.Contains(c.Problems[0], "foreign_key_check") {
		t.Errorf("db check (orphan row) = %+v", c)
	}
	rawSQL(t, path, `DELETE FROM image_names`, `UPDATE schema_migrations SET sql_sha256 = 'x' WHERE version = 1`)
	decodeJSON(t, 1, &c, "db", "check", "--db", path, "--format", "json")
	if c.OK || len(c.Problems) != 1 || !strings.Contains(c.Problems[0], "migration 1 (initial)") {
		t.Errorf("db check (tampered ledger) = %+v", c)
	}

	src := filepath.Join(dir, "src.db")
	populate(t, src, time.Now())
	dest := filepath.Join(dir, "copy.db")
	var b backupJSON
	decodeJSON(t, 0, &b, "db", "backup", "--db", src, "--format", "json", dest)
	if b.DB != src || b.Dest != dest || b.Bytes <= 0 {
		t.Errorf("db backup --format json = %+v", b)
	}
	if imgs := lsJSON[inventory.Image](t, "images", "--db", dest, "--format", "json"); len(imgs) == 0 {
		t.Errorf("the backup %s lists no images", dest)
	}
}

// TestActivateJSONFailureCarriesReason: with --format json, activate's
// failure is one JSON object carrying the reason on stdout (exit 1,
// nothing on stderr), as pull's and rm's are, whether the daemon is down
// or refuses.
func TestActivateJSONFailureCarriesReason(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	live := serveFake(t, refusingPuller{t})
	for _, c := range []struct{ what, socket, reason string }{
		{"daemon down", missing, "control socket " + missing},
		{"daemon refuses", live, "refusingPuller: no activations here"},
	} {
		code, out, errOut := runCommand(t, nil, "activate", "--control-socket", c.socket, "--format", "json", "app")
		var v map[string]any
		if code != 1 || errOut != "" || json.Unmarshal([]byte(out), &v) != nil || len(v) != 1 || !strings.Contains(fmt.Sprint(v["error"]), c.reason) {
			t.Errorf("%s: activate --format json = exit %d, stdout %q, stderr %q; want 1 and one JSON object whose error says %q",
				c.what, code, out, errOut, c.reason)
		}
	}
}

// TestActivateEmptyRefIsUsageError: `activate ""` (an unset shell variable
// in activate "$REF") is a usage error (exit 2, in either format), as
// `rm ""` is, refused before the daemon is asked; the socket given is a
// live daemon's that would refuse any activation.
func TestActivateEmptyRefIsUsageError(t *testing.T) {
	socket := serveFake(t, refusingPuller{t})
	for _, format := range []string{"table", "json"} {
		code, out, errOut := runCommand(t, nil, "activate", "--control-socket", socket, "--format", format, "")
		if code != 2 || out != "" || !strings.Contains(errOut, "a REF must not be empty") || !strings.Contains(errOut, "See 'containerd-flyio-snapshotter activate --help'") {
			t.Errorf("activate --format %s '' = exit %d, stdout %q, stderr %q; want 2 and the usage error", format, code, out, errOut)
		}
	}
}
