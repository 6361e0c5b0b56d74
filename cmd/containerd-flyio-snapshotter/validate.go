package main

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/tarball"
)

func init() {
	cli.Register(&cli.Command{
		Name:    "validate",
		Summary: "check a tarball offline against the extraction policy",
		Run: func(ctx context.Context, args []string) error {
			return runValidate(ctx, args, os.Stdin, os.Stdout, os.Stderr)
		},
	})
}

const validateHelp = `
Checks FILE.tar, FILE.tar.gz or FILE.tar.zst (or standard input with "-";
plain, gzip or zstd is told by the first bytes, not by the name) the way
the Download pipeline's
validate step does, without a daemon: the tar structure, and every rule of
the extraction policy (no absolute names, no ".." climbing above the root,
no relative symlink or hard link leaving the root, no setuid/setgid files
unless the config's pipeline.allow_setid or --allow-setid admits them, no
device nodes, at most 100,000 entries, 1 GiB per file, 10 GiB in total,
128 extended attributes of 64 KiB together per entry unless the config's
[pipeline] limits say otherwise, no more than 4 MiB of zeros after the
end-of-archive marker, OCI whiteouts well formed). Absolute symlinks are allowed. The policy is the one of --config
(or of the default configuration file when it exists): the daemon reading
the same file applies the same rules. Run it before uploading a tarball to
S3.

Exit status: 0 and a one-line summary on stdout if the tarball is accepted
(it ends with how the tar is stored and its diff ID: the SHA-256 of the
uncompressed tar, which names the layer whatever its storage);
1 and "FILE: entry "NAME": RULE" on stderr if it is rejected (the names,
link targets and FILE itself with control characters escaped, as in a Go
string: the archive's bytes never reach the terminal); 2 if it could not
be read or the arguments are wrong.

With --format json, stdout carries one JSON object whether the tarball is
accepted or rejected: "accepted" (true or false), the counts, the
compression and the diff ID of an accepted one, the "rejection" of a
rejected one (nothing on stderr then); the exit status is the same.
`

// runValidate is the validate subcommand with its streams as parameters.
func runValidate(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("validate", "validate [--config FILE] [--allow-setid] [--format table|json] FILE.tar[.gz|.zst]|-", validateHelp)
	cli.AddConfigFlags(fs)
	format := cli.AddFormatFlag(fs, cli.DefaultFormatUsage)
	allowSetID := fs.Bool("allow-setid", false, "accept setuid/setgid files and file capabilities even when the config's pipeline.allow_setid does not")
	pos, err := cli.ParseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return cli.UsageError(fs, "expected exactly one FILE.tar (or - for standard input)")
	}
	cfg, err := loadConfig()
	if err != nil {
		return &cli.ExitError{Code: 2, Msg: err.Error()}
	}
	limits := cfg.TarLimits()
	limits.AllowSetID = limits.AllowSetID || *allowSetID
	name := pos[0]
	shown := tarball.Escape(name) // a file's name may come from a bucket too
	in := stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return &cli.ExitError{Code: 2, Msg: tarball.Escape(err.Error())}
		}
		defer f.Close()
		in = f
	}
	// Large reads from the interruptible reader, so that its goroutine per
	// read costs nothing against the validation's own work.
	rep, err := tarball.Validate(ctx, bufio.NewReaderSize(&interruptibleReader{ctx: ctx, r: in}, 1<<20), limits)
	if err != nil {
		if tarball.IsRejection(err) {
			if format.JSON() {
				if werr := cli.WriteJSON(stdout, validateJSON{File: name, Rejection: err.Error()}); werr != nil {
					return werr
				}
			} else {
				fmt.Fprintf(stderr, "%s: %v\n", shown, err)
			}
			return &cli.ExitError{Code: 1}
		}
		if errors.Is(err, context.Canceled) {
			return &cli.ExitError{Code: 2, Msg: "interrupted"}
		}
		return &cli.ExitError{Code: 2, Msg: fmt.Sprintf("%s: %v", shown, err)}
	}
	if format.JSON() {
		return cli.WriteJSON(stdout, validateJSON{File: name, Accepted: true, ValidateReport: &ValidateReport{
			Entries: rep.Entries, Files: rep.Files, Dirs: rep.Dirs,
			Symlinks: rep.Symlinks, Hardlinks: rep.Hardlinks, Whiteouts: rep.Whiteouts, FileBytes: rep.TotalBytes,
			HasRootfs: rep.HasRootfs, Compression: rep.Compression.String(), DiffID: rep.DiffID,
		}})
	}
	rootfs := "no rootfs/ folder"
	if rep.HasRootfs {
		rootfs = "rootfs/ folder (stripped at extraction)"
	}
	_, err = fmt.Fprintf(stdout, "%s: ok: %d entries (%d files, %d dirs, %d symlinks, %d hard links, %d whiteouts), %d bytes of files, %s; %s, diff ID %s\n",
		shown, rep.Entries, rep.Files, rep.Dirs, rep.Symlinks, rep.Hardlinks, rep.Whiteouts, rep.TotalBytes, rootfs, rep.Compression, rep.DiffID)
	return err
}

// validateJSON is what `validate --format json` prints. The file's name is
// as given: JSON escapes its control characters.
type validateJSON struct {
	File      string `json:"file"`
	Accepted  bool   `json:"accepted"`
	Rejection string `json:"rejection,omitempty"`
	// The report of an accepted tarball; none for a rejected one, whose
	// reading stopped at the rejection.
	*ValidateReport
}

// ValidateReport is what validate found in an accepted tarball (exported
// only so that encoding/json can fill it in validateJSON).
type ValidateReport struct {
	Entries   int   `json:"entries"`
	Files     int   `json:"files"`
	Dirs      int   `json:"dirs"`
	Symlinks  int   `json:"symlinks"`
	Hardlinks int   `json:"hardlinks"`
	Whiteouts int   `json:"whiteouts"`
	FileBytes int64 `json:"file_bytes"`
	// HasRootfs: the image is under a rootfs/ folder, stripped at
	// extraction.
	HasRootfs   bool   `json:"has_rootfs"`
	Compression string `json:"compression"`
	DiffID      string `json:"diff_id"`
}

// interruptibleReader reads r until ctx ends: a read blocked on r (standard
// input a terminal, or a pipe whose writer sends nothing) then returns
// ctx's error at once, so that Ctrl-C ends validate instead of waiting for
// bytes that may never come. The blocked read is left to its goroutine,
// which ends with the process; no read is started after ctx has ended.
type interruptibleReader struct {
	ctx context.Context
	r   io.Reader
	buf []byte // what each read goroutine fills, reused while none is left blocked
}

// Read reads from r into p, or returns ctx's error once ctx has ended.
func (ir *interruptibleReader) Read(p []byte) (int, error) {
	if err := ir.ctx.Err(); err != nil {
		return 0, err
	}
	if cap(ir.buf) < len(p) {
		ir.buf = make([]byte, len(p))
	}
	buf := ir.buf[:len(p)]
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := ir.r.Read(buf)
		done <- result{n, err}
	}()
	select {
	case res := <-done:
		return copy(p, buf[:res.n]), res.err
	case <-ir.ctx.Done():
		ir.buf = nil // the goroutine may still write into it
		return 0, ir.ctx.Err()
	}
}
